"""FLOPs and bytes per op, as functions of shape and dtype.

One table for benchmarks and (later) the diagnosis. Bytes are the *minimum* traffic a fused kernel
needs: every input read once, every output written once. Dividing them by the measured copy
bandwidth gives the floor time of a memory-bound op; dividing FLOPs by bytes gives its intensity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.bytes if self.bytes else math.inf

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def matmul(
    m: int, n: int, k: int, dtype: torch.dtype, out_dtype: torch.dtype | None = None
) -> Cost:
    """[m, k] @ [k, n] -> [m, n]: reads both operands once, writes the result once."""
    out_dtype = out_dtype or dtype
    nbytes = (m * k + k * n) * itemsize(dtype) + m * n * itemsize(out_dtype)
    return Cost(2.0 * m * n * k, nbytes)


def elementwise(
    numel: int,
    dtype: torch.dtype,
    *,
    n_inputs: int = 1,
    n_outputs: int = 1,
    flops_per_element: float = 1.0,
) -> Cost:
    return Cost(flops_per_element * numel, (n_inputs + n_outputs) * numel * itemsize(dtype))


# Arithmetic per element of the normalised tensor (sum, centre, square, sum, scale, shift): small
# constants, used only for the intensity; the ops are memory-bound by orders of magnitude.
_NORM_FLOPS_FWD = {"layer_norm": 8.0, "rms_norm": 5.0, "add_rms_norm": 6.0}
_NORM_FLOPS_BWD = {"layer_norm": 12.0, "rms_norm": 9.0, "add_rms_norm": 10.0}


def norm(
    kind: str,
    rows: int,
    cols: int,
    dtype: torch.dtype,
    *,
    backward: bool = False,
    activations_only: bool = True,
) -> Cost:
    """Minimum traffic of a fused normalisation over [rows, cols].

    Byte model (activations, the term that matters when rows >> 1):
      forward              reads x, writes y                            2·rows·cols·s
      add_rms_norm forward reads x and residual, writes y and x+residual 4·rows·cols·s
      backward             reads x and dy, writes dx                    3·rows·cols·s
      add_rms_norm bwd     reads h, dy (and d(h) if used), writes dx     3·rows·cols·s
    With activations_only=False the weight/bias, their gradients and the fp32 per-row statistics
    (mean, rstd) are added too.
    """
    if kind not in _NORM_FLOPS_FWD:
        raise ValueError(f"kind must be one of {sorted(_NORM_FLOPS_FWD)}, got {kind!r}")
    s = itemsize(dtype)
    numel = rows * cols
    if backward:
        nbytes = 3 * numel * s
        flops = _NORM_FLOPS_BWD[kind] * numel
    else:
        nbytes = (4 if kind == "add_rms_norm" else 2) * numel * s
        flops = _NORM_FLOPS_FWD[kind] * numel
    if not activations_only:
        n_params = 2 if kind == "layer_norm" else 1
        n_stats = 2 if kind == "layer_norm" else 1
        nbytes += rows * n_stats * 4 * (2 if backward else 1)  # written forward, read backward
        nbytes += n_params * cols * s * (2 if backward else 1)  # read; backward also writes grads
    return Cost(flops, nbytes)


def norm_fwd_bwd(kind: str, rows: int, cols: int, dtype: torch.dtype) -> Cost:
    """Forward plus backward: 5·rows·cols·s for layer_norm/rms_norm (the PERF.md byte model)."""
    return norm(kind, rows, cols, dtype) + norm(kind, rows, cols, dtype, backward=True)


# --- aten ops, for the diagnosis -------------------------------------------------------------

_MATMULS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default"}
_ATTENTION = ("scaled_dot_product", "_flash_attention", "_efficient_attention")
_GATHERS = ("aten.embedding.", "aten.index_select.", "aten.gather.", "aten.index.Tensor")


def aten_op(
    name: str,
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    *,
    is_view: bool = False,
    written: set[int] = frozenset(),
) -> Cost:
    """FLOPs and bytes of one aten op as it ran (as written: each tensor argument read once,
    each output written once; a view moves nothing). Matmuls count 2·m·n·k; attention kernels
    4·B·H·S_q·S_k·D; everything else one FLOP per element of its largest operand."""
    if is_view:
        return Cost(0.0, 0.0)
    reads = {id(t): t for t in inputs}
    writes = {id(t): t for t in outputs}
    writes.update({id(t): t for t in inputs if id(t) in written})  # in place, foreach, out=
    nbytes = float(sum(t.numel() * t.element_size() for t in (*reads.values(), *writes.values())))
    if name.startswith(_GATHERS) and outputs:
        # reads only the rows it gathers (as many bytes as it writes) and the indices
        out_bytes = sum(t.numel() * t.element_size() for t in outputs)
        idx_bytes = sum(t.numel() * t.element_size() for t in inputs if not t.is_floating_point())
        return Cost(float(sum(t.numel() for t in outputs)), 2.0 * out_bytes + idx_bytes)
    if name in _MATMULS:
        a, b = (inputs[-2], inputs[-1])
        m, k = a.shape[-2], a.shape[-1]
        n = b.shape[-1]
        batch = a.numel() // (m * k) if a.dim() == 3 else 1
        return Cost(2.0 * batch * m * n * k, nbytes)
    if any(s in name for s in _ATTENTION) and len(inputs) >= 3 and inputs[0].dim() == 4:
        q, k = inputs[0], inputs[1]
        b, h, sq, d = q.shape
        return Cost(4.0 * b * h * sq * k.shape[-2] * d, nbytes)
    largest = max((t.numel() for t in list(inputs) + list(outputs)), default=0)
    return Cost(float(largest), float(nbytes))
