"""FLOPs and bytes of the normalisation ops, as functions of shape and dtype: the byte model of
the benchmarks (benchmarks/bench_norms.py, fusewise demo norms) and of the diagnosis (recorded,
registered with fusewise.cost for the custom ops fusewise::norm_fwd / norm_bwd).

Bytes are the *minimum* traffic of a fused kernel: every input read once, every output written
once.
"""

from __future__ import annotations

import torch

from ...cost import Cost, itemsize

KINDS = ("layer_norm", "rms_norm", "add_rms_norm")
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


def recorded(name: str, inputs: list, outputs: list) -> Cost | None:
    """The cost of a recorded fusewise::norm_fwd / norm_bwd call (fusewise.cost.register_op),
    weights and statistics included. The kind is read from the tensors (None arguments are not
    recorded): norm_fwd returns (y, h, mean, rstd) with h empty unless add_rms_norm and mean empty
    for RMS; norm_bwd takes (dy, [dh], x, [weight], [bias], mean, rstd) -> (dx, dw, db)."""
    if name.startswith("fusewise.norm_fwd."):
        y, h, mean, _ = outputs
        backward = False
        has_residual, is_rms = h.numel() > 0, mean.numel() == 0
    elif name.startswith("fusewise.norm_bwd."):
        y, dw, db = outputs
        backward = True
        params = int(dw.numel() > 0) + int(db.numel() > 0)
        has_residual, is_rms = len(inputs) - 4 - params > 0, inputs[-2].numel() == 0
    else:
        return None
    kind = "add_rms_norm" if has_residual else ("rms_norm" if is_rms else "layer_norm")
    rows, cols = y.shape
    return norm(kind, rows, cols, y.dtype, backward=backward, activations_only=False)
