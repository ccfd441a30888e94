"""Eager PyTorch oracle of the AdamW update: the CPU path of fusewise.optim.AdamW (with a
warning) when the Triton kernel cannot run, and what its tests compare the kernel with. torch
only.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


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
