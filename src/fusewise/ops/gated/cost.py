"""FLOPs and bytes of the gated activations (swiglu, geglu), as functions of size and dtype: the
byte model of the diagnosis (recorded, registered with fusewise.cost for the custom ops
fusewise::gated_fwd / gated_bwd) and of any benchmark.

Bytes are the minimum traffic of a fused kernel, every input read once and every output written
once, for n elements of s bytes:
  forward   reads gate and up, writes y                       3·n·s
  backward  reads gate, up and dy, writes dgate and dup       5·n·s
(a gradient not needed is neither written nor, for dgate, is up read).
"""

from __future__ import annotations

import torch

from ...cost import Cost, itemsize

# Arithmetic per element (activation, its derivative, the products): small constants, used only
# for the intensity; the ops are memory-bound by orders of magnitude.
_FLOPS_FWD = 6.0
_FLOPS_BWD = 12.0


def gated(
    numel: int,
    dtype: torch.dtype,
    *,
    backward: bool = False,
    need_dgate: bool = True,
    need_dup: bool = True,
) -> Cost:
    """Minimum traffic of a fused gated activation over `numel` elements (see the module)."""
    s = itemsize(dtype)
    if not backward:
        return Cost(_FLOPS_FWD * numel, 3 * numel * s)
    tensors = 2 + (2 if need_dgate else 0) + (1 if need_dup else 0)  # gate, dy; up, dgate; dup
    return Cost(_FLOPS_BWD * numel, tensors * numel * s)


def gated_fwd_bwd(numel: int, dtype: torch.dtype) -> Cost:
    """Forward plus backward: 8·n·s."""
    return gated(numel, dtype) + gated(numel, dtype, backward=True)


def recorded(name: str, inputs: list, outputs: list) -> Cost | None:
    """The cost of a recorded fusewise::gated_fwd (gate, up) -> y or fusewise::gated_bwd
    (dy, gate, up) -> (dgate, dup) call; an empty output is a gradient not computed."""
    if name.startswith("fusewise.gated_fwd."):
        gate = inputs[0]
        return gated(gate.numel(), gate.dtype)
    if name.startswith("fusewise.gated_bwd."):
        gate = inputs[1]
        dg, du = outputs
        return gated(
            gate.numel(),
            gate.dtype,
            backward=True,
            need_dgate=dg.numel() > 0,
            need_dup=du.numel() > 0,
        )
    return None
