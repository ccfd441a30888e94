"""Fused RMSNorm and add + RMSNorm (the residual add of a pre-norm transformer, fused in).

rms_norm equals (ops/reference.py)::

    y = x * rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight

add_rms_norm(x, residual, weight) equals ``h = x + residual; (rms_norm(h, weight), h)``: h is
rounded to x's dtype before it is normalised, exactly as the unfused code would store it.
Traffic for [M, N] in dtype of s bytes: rms_norm forward 2·M·N·s; add_rms_norm forward reads x and
residual and writes y and h, 4·M·N·s (unfused: 6·M·N·s, h is written then read back); backward
reads the normalised input and dy (and dh), writes dx, 3·M·N·s; dweight in fp32, deterministic.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _norm_op
from ._validate import (
    as_rows,
    check_eps,
    check_floating,
    check_input,
    check_param,
    check_same_device,
)
from .layer_norm import _empty_like_through


def default_eps(dtype: torch.dtype) -> float:
    """torch's eps=None for RMSNorm (F.rms_norm, nn.RMSNorm): the machine epsilon of the op-math
    dtype, float32 for bf16/fp16/fp32 inputs and float64 for float64, not of x's dtype."""
    return torch.finfo(torch.promote_types(dtype, torch.float32)).eps


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float | None = 1e-6) -> Tensor:
    """RMSNorm over the last dim of x [..., N]; weight: [N]. Returns x's shape and dtype. Any
    layout of any input. eps: a number >= 0, or None for torch's default (default_eps), as in
    F.rms_norm."""
    check_input("x", x)
    check_param("weight", weight, x)
    eps = check_eps(default_eps(x.dtype) if eps is None else eps)
    if x.numel() == 0:
        return _empty_like_through(x, weight)
    y, _ = _norm_op.norm(as_rows(x), None, weight, None, eps, True)
    return y.view(x.shape)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor | None, eps: float | None = 1e-6):
    """(rms_norm(x + residual, weight), x + residual) in one pass. x, residual: [..., N], same
    shape and dtype; weight: [N]. Differentiable in x, residual and weight (both outputs).
    eps=None means torch's default, as in rms_norm."""
    check_input("x", x)
    check_floating("residual", residual)
    if residual.shape != x.shape:
        raise ValueError(
            f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}"
        )
    if residual.dtype != x.dtype:
        raise TypeError(
            f"residual must have x's dtype {x.dtype}, got {residual.dtype}; cast one of them first"
        )
    check_same_device(x, residual=residual)
    check_param("weight", weight, x)
    eps = check_eps(default_eps(x.dtype) if eps is None else eps)
    if x.numel() == 0:
        h = x + residual
        return _empty_like_through(h, weight), h
    y, h = _norm_op.norm(as_rows(x), as_rows(residual), weight, None, eps, True)
    return y.view(x.shape), h.view(x.shape)
