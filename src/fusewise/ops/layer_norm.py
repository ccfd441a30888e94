"""Fused LayerNorm: one read of x, one write of y, forward; one pass for dx, backward.

Equals (ops/reference.py)::

    mean = x.mean(-1, keepdim=True); var = ((x - mean) ** 2).mean(-1, keepdim=True)
    y = (x - mean) * rsqrt(var + eps) * weight + bias

computed in fp32 whatever the activation dtype. Traffic for x [M, N] in dtype of s bytes:
forward reads x and writes y (2·M·N·s, plus fp32 mean and rstd per row); backward reads x and dy
and writes dx (3·M·N·s); dweight/dbias are reduced in fp32 in a fixed order (deterministic).
"""

from __future__ import annotations

from torch import Tensor

from . import _norm_op
from ._validate import as_rows, check_eps, check_input, check_param


def layer_norm(
    x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """LayerNorm over the last dim of x [..., N]; weight, bias: [N] (activation dtype or fp32).

    Returns y with x's shape and dtype. Differentiable in x, weight and bias. Any layout of any
    input (strided, transposed, a broadcast weight). eps: a number >= 0 (None is an error, as
    in F.layer_norm).
    """
    check_input("x", x)
    check_param("weight", weight, x)
    check_param("bias", bias, x)
    eps = check_eps(eps)
    if x.numel() == 0:
        return _empty_like_through(x, weight, bias)
    y, _ = _norm_op.norm(as_rows(x), None, weight, bias, eps, False)
    return y.view(x.shape)


def _empty_like_through(x: Tensor, *params: Tensor | None) -> Tensor:
    """An empty output that still carries autograd edges, so backward gives zero gradients."""
    out = x.new_empty(x.shape) if not x.requires_grad else x * 0
    for p in params:
        if p is not None and p.requires_grad:
            out = out + (p.sum() * 0).to(out.dtype)
    return out
