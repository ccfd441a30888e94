"""Eager PyTorch oracles of linear + cross-entropy: the full-logits loss the fused op equals
(linear_cross_entropy), and ce_rows, the torch twin of the row kernel (kernels.py) with its
contract, which the op's reference path runs (CPU tensors without TRITON_INTERPRET, float64).
torch only.
"""

from __future__ import annotations

import torch
from torch import Tensor


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


def ce_rows(z, target, loss, lse, scale, opts):
    """The row pass (kernels.py) in torch ops, the same contract as launch.ce_rows_triton: per-token
    loss and lse of the logits z [rows, V] into loss, lse [rows]; with scale ([1] or [rows] fp32,
    d(output)/d(token loss)) the scaled logit gradient written over z."""
    ignore_index, smoothing, z_loss, softcap = opts
    v = z.shape[1]
    zf = z.float() if z.dtype != torch.float64 else z.clone()
    t = None
    if softcap is not None:
        t = torch.tanh(zf / softcap)
        zf = t * softcap
    valid = target != ignore_index
    in_range = (target >= 0) & (target < v)
    safe = torch.where(valid & in_range, target, 0)
    row_lse = torch.logsumexp(zf, dim=-1)
    nll = row_lse - zf.gather(1, safe[:, None]).squeeze(1)
    if smoothing:
        nll = (1 - smoothing) * nll + smoothing * (row_lse - zf.mean(-1))
    nll = nll + z_loss * row_lse * row_lse
    nll = torch.where(in_range, nll, float("nan"))
    loss.copy_(torch.where(valid, nll, 0.0))
    lse.copy_(row_lse)
    if scale is None:
        return
    p = torch.exp(zf - row_lse[:, None]) * (1 + 2 * z_loss * row_lse)[:, None] - smoothing / v
    p.scatter_add_(1, safe[:, None], torch.full_like(p[:, :1], -(1 - smoothing)))
    if t is not None:
        p *= 1 - t * t
    p *= torch.where(valid, scale.to(p.dtype).expand(valid.shape), 0.0)[:, None]
    z.copy_(p)
