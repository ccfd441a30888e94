"""FLOPs and bytes of the rotary position embedding, as functions of size and dtype: the byte
model of the diagnosis (recorded, registered with fusewise.cost for the custom ops
fusewise::rotary_fwd / rotary_bwd) and of benchmarks/bench_rotary.py.

Bytes are the minimum traffic of a fused kernel, every input read once and every output written
once; for n = B·(Hq + Hkv)·S·D elements of q and k (all D features, the pass-through ones too)
of s bytes, and c elements of cos and of sin ([B | 1, S, Dr]) of s_c bytes:
  forward   reads q, k, cos, sin, writes q_out, k_out         2·n·s + 2·c·s_c
  backward  reads dq_out, dk_out, cos, sin, writes dq, dk     2·n·s + 2·c·s_c
(a gradient not needed is neither read nor written). cos and sin broadcast over B count once.
"""

from __future__ import annotations

import torch

from ...cost import Cost, itemsize

# Arithmetic per element of q and k (two products and a sum per rotated feature): used only for
# the intensity; the op is memory-bound by orders of magnitude.
_FLOPS_PER_ELEMENT = 3.0


def rotary(
    qk_numel: int,
    cos_numel: int,
    dtype: torch.dtype,
    cos_dtype: torch.dtype | None = None,
) -> Cost:
    """Minimum traffic of one fused pass (forward or backward: the same) over qk_numel elements
    of q and k together (or of the gradients computed) and cos_numel elements of each of cos and
    sin (see the module)."""
    cos_bytes = 2 * cos_numel * itemsize(cos_dtype or dtype)
    return Cost(_FLOPS_PER_ELEMENT * qk_numel, 2 * qk_numel * itemsize(dtype) + cos_bytes)


def rotary_fwd_bwd(qk_numel: int, cos_numel: int, dtype: torch.dtype, cos_dtype=None) -> Cost:
    """Forward plus backward: twice one pass."""
    one = rotary(qk_numel, cos_numel, dtype, cos_dtype)
    return one + one


def recorded(name: str, inputs: list, outputs: list) -> Cost | None:
    """The cost of a recorded fusewise::rotary_fwd (q, k, cos, sin) -> (q_out, k_out) or
    fusewise::rotary_bwd (dq_out, dk_out, cos, sin) -> (dq, dk) call; an empty output is a
    gradient not computed (its input neither read)."""
    if not name.startswith(("fusewise.rotary_fwd.", "fusewise.rotary_bwd.")):
        return None
    cos = inputs[2]
    qk_numel = sum(o.numel() for o in outputs)
    return rotary(qk_numel, cos.numel(), outputs[0].dtype, cos.dtype)
