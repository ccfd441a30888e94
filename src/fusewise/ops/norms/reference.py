"""Eager PyTorch oracles of the normalisation ops: what each fused op computes, the float64
comparison of the tests, the "naive eager" rows of the benchmarks, and (norm_forward,
norm_backward) the CPU path the ops take, with a warning, when the Triton kernel cannot run.
torch only.
"""

from __future__ import annotations

import torch
from torch import Tensor


def layer_norm(
    x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """The seed's naive LayerNorm over the last dim: mean pass, variance pass, normalise pass.

    Computes in float32 (float64 stays float64) and returns x's dtype.
    """
    xf = x.float() if x.dtype != torch.float64 else x
    mean = xf.mean(-1, keepdim=True)
    var = ((xf - mean) ** 2).mean(-1, keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(x.dtype)


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """y = x / sqrt(mean(x²) + eps) * weight, over the last dim, computed in float32."""
    xf = x.float() if x.dtype != torch.float64 else x
    y = xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(y.dtype)
    return y.to(x.dtype)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor | None, eps: float = 1e-6):
    """(rms_norm(x + residual), x + residual): the sum is rounded to x's dtype, then normalised."""
    h = x + residual
    return rms_norm(h, weight, eps), h


# --- the CPU path: forward with saved statistics, and the analytic backward --------------------


def norm_forward(
    x: Tensor,
    residual: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    is_rms: bool,
):
    """x: [M, N]. Returns (y [M, N], h [M, N] or None, mean [M] fp32 or None (RMS), rstd [M]
    fp32), as the Triton launcher does."""
    h = x + residual if residual is not None else None
    acc = torch.promote_types(x.dtype, torch.float32)  # fp32 math, float64 stays float64
    src = (h if h is not None else x).to(acc)
    if is_rms:
        mean = None
        rstd = torch.rsqrt((src * src).mean(-1) + eps)
        xhat = src * rstd[:, None]
    else:
        mean = src.mean(-1)
        rstd = torch.rsqrt(((src - mean[:, None]) ** 2).mean(-1) + eps)
        xhat = (src - mean[:, None]) * rstd[:, None]
    y = xhat
    if weight is not None:
        y = y * weight.to(acc)
    if bias is not None:
        y = y + bias.to(acc)
    return y.to(x.dtype), h, (mean.float() if mean is not None else None), rstd.float()


def norm_backward(
    dy: Tensor,
    dh: Tensor | None,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor | None,
    rstd: Tensor,
    is_rms: bool,
):
    """Analytic backward in float32. x is the normalised input ([M, N]; x + residual for
    add_rms_norm); mean is not read for RMS. Returns (dx, dweight or None, dbias or None)."""
    acc = torch.promote_types(x.dtype, torch.float32)
    xf, dyf = x.to(acc), dy.to(acc)
    rstd = rstd.to(acc)
    mean = mean.to(acc) if not is_rms else None
    n = x.shape[-1]
    xhat = xf * rstd[:, None] if is_rms else (xf - mean[:, None]) * rstd[:, None]
    wdy = dyf * weight.to(acc) if weight is not None else dyf
    c1 = (xhat * wdy).sum(-1, keepdim=True) / n
    dx = wdy - xhat * c1
    if not is_rms:
        dx = dx - wdy.sum(-1, keepdim=True) / n
    dx = dx * rstd[:, None]
    if dh is not None:
        dx = dx + dh.to(acc)
    dw = (dyf * xhat).sum(0).to(weight.dtype) if weight is not None else None
    db = dyf.sum(0).to(bias.dtype) if bias is not None else None
    return dx.to(x.dtype), dw, db
