"""Eager PyTorch oracles: the single source of truth for what each fused op computes.

Tests compare kernels with these in float64, benchmarks time them as the "naive eager" provider,
and the CPU path runs them (with a warning) when the Triton kernel cannot run. torch only.
"""

from __future__ import annotations

import math

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
    """x: [M, N]. Returns (y [M, N], h [M, N] or empty, mean [M] fp32 or empty, rstd [M] fp32)."""
    h = x + residual if residual is not None else None
    acc = torch.promote_types(x.dtype, torch.float32)  # fp32 math, float64 stays float64
    src = (h if h is not None else x).to(acc)
    if is_rms:
        mean = torch.zeros(0, dtype=acc, device=x.device)
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
    empty = torch.empty(0, dtype=x.dtype, device=x.device)
    return y.to(x.dtype), (h if h is not None else empty), mean.float(), rstd.float()


def norm_backward(
    dy: Tensor,
    dh: Tensor | None,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    is_rms: bool,
):
    """Analytic backward in float32. x is the normalised input ([M, N]; x + residual for
    add_rms_norm). Returns (dx, dweight or empty, dbias or empty)."""
    acc = torch.promote_types(x.dtype, torch.float32)
    xf, dyf = x.to(acc), dy.to(acc)
    mean, rstd = mean.to(acc), rstd.to(acc)
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
    empty = torch.empty(0, dtype=x.dtype, device=x.device)
    dw = (dyf * xhat).sum(0).to(weight.dtype) if weight is not None else empty
    db = dyf.sum(0).to(bias.dtype) if bias is not None else empty
    return dx.to(x.dtype), dw, db


# --- AdamW ---------------------------------------------------------------------------------------


def adamw_update(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    max_exp_avg_sq: Tensor | None,
    master: Tensor | None,
    step: Tensor,
    *,
    lr,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    maximize: bool,
    grad_scale: Tensor | None = None,
    found_inf: Tensor | None = None,
) -> None:
    """One AdamW update of one tensor in place, torch.optim.AdamW's math in fp32; `step` is the
    already incremented step count (a tensor). The CPU path of fusewise.optim.AdamW and the oracle
    of its tests. With `master`, the fp32 master is updated and `param` receives it rounded.
    (Uses .item() on found_inf: the reference path is not meant to be captured.)"""
    if found_inf is not None and found_inf.item() != 0:
        return
    g = grad.float()
    if grad_scale is not None:
        g = g / grad_scale.float()
    if maximize:
        g = -g
    w = master if master is not None else param.float()
    lr_f = lr.float() if isinstance(lr, Tensor) else lr
    bias_correction1 = _one_minus_pow(beta1, step)
    bias_correction2_sqrt = _one_minus_pow(beta2, step).sqrt()
    w = w * (1 - lr_f * weight_decay)
    m = exp_avg.float().lerp(g, 1 - beta1)
    v = exp_avg_sq.float() * beta2 + (1 - beta2) * g * g
    if max_exp_avg_sq is not None:
        vmax = torch.maximum(max_exp_avg_sq.float(), v)
        max_exp_avg_sq.copy_(vmax)
        denom = vmax.sqrt() / bias_correction2_sqrt + eps
    else:
        denom = v.sqrt() / bias_correction2_sqrt + eps
    w = w - (lr_f / bias_correction1) * m / denom
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)
    if master is not None:
        master.copy_(w)
    param.copy_(w)


def _one_minus_pow(beta: float, step: Tensor) -> Tensor:
    """1 - beta**step on step's device, no sync: -expm1(step * log(beta)), as accurate as torch's
    double formula rounded to fp32 (beta**step in fp32 is 1e-3 off at beta = 0.999999)."""
    return -torch.expm1(step.float() * (math.log(beta) if beta > 0 else -math.inf))


# --- linear + cross-entropy ----------------------------------------------------------------------


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
) -> Tensor:
    """The full logits as nn.Linear makes them (F.linear: the bias added inside the GEMM, one
    rounding), then F.cross_entropy in fp32 (float64 stays float64), plus z_loss·lse² averaged
    like the loss; "mean" over no valid token is 0 (fusewise's choice; torch: nan)."""
    # tokens as rows: one addmm for any layout (F.linear folds only a contiguous 3-D input)
    rows = hidden.reshape(target.numel(), hidden.shape[-1])
    z2 = torch.nn.functional.linear(rows, weight, bias)
    z2 = z2.to(torch.promote_types(z2.dtype, torch.float32))
    if softcap is not None:
        z2 = softcap * torch.tanh(z2 / softcap)
    t = target.reshape(-1)
    loss = torch.nn.functional.cross_entropy(
        z2, t, ignore_index=ignore_index, reduction="none", label_smoothing=label_smoothing
    )
    valid = t != ignore_index
    if z_loss:
        loss = loss + z_loss * torch.where(valid, torch.logsumexp(z2, -1) ** 2, 0.0)
    if reduction == "none":
        return loss.view(target.shape)
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum().clamp(min=1)
