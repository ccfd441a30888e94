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


def tensor_bytes(shape, dtype: torch.dtype) -> int:
    return math.prod(shape) * itemsize(dtype)


def matmul(
    m: int, n: int, k: int, dtype: torch.dtype, out_dtype: torch.dtype | None = None
) -> Cost:
    """[m, k] @ [k, n] -> [m, n]: reads both operands once, writes the result once."""
    out_dtype = out_dtype or dtype
    nbytes = (m * k + k * n) * itemsize(dtype) + m * n * itemsize(out_dtype)
    return Cost(2.0 * m * n * k, nbytes)


def elementwise(numel: int, dtype: torch.dtype, *, n_inputs: int = 1, n_outputs: int = 1,
                flops_per_element: float = 1.0) -> Cost:  # fmt: skip
    return Cost(flops_per_element * numel, (n_inputs + n_outputs) * numel * itemsize(dtype))


# Arithmetic per element of the normalised tensor (sum, centre, square, sum, scale, shift): small
# constants, used only for the intensity; the ops are memory-bound by orders of magnitude.
_NORM_FLOPS_FWD = {"layer_norm": 8.0, "rms_norm": 5.0, "add_rms_norm": 6.0}
_NORM_FLOPS_BWD = {"layer_norm": 12.0, "rms_norm": 9.0, "add_rms_norm": 10.0}


def norm(kind: str, rows: int, cols: int, dtype: torch.dtype, *, backward: bool = False,
         activations_only: bool = True) -> Cost:  # fmt: skip
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
