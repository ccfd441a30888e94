"""The normalisation ops: one forward and one backward implementation, reached two ways.

* eager: ``_NormFunction`` (torch.autograd.Function) calls them directly. torch.library's
  custom-op wrapper costs ~0.3 ms of host time per call on torch 2.11 (measured on an H200:
  0.7 ms host per forward+backward against 0.11 for F.rms_norm), more than the kernels take at
  realistic sizes, so eager code does not go through it.
* compiled: the custom ops fusewise::norm_fwd / fusewise::norm_bwd (fake + autograd registered)
  keep torch.compile(fullgraph=True) free of graph breaks.
Each implementation runs the Triton kernel, or the eager reference with a warning naming the
reason (ops/_dispatch.py). No host sync anywhere, so both capture in CUDA graphs.
Inputs are 2-D [M, N]; the public functions in layer_norm.py / rms_norm.py flatten and validate.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _dispatch, _norm_launch


def _op_name(is_rms: bool, has_residual: bool) -> str:
    return "add_rms_norm" if has_residual else ("rms_norm" if is_rms else "layer_norm")


def forward_impl(x, residual, weight, bias, eps: float, is_rms: bool):
    """Returns (y, h = x + residual or empty, mean or empty, rstd); mean/rstd fp32 per row."""
    path = _dispatch.choose_path(_op_name(is_rms, residual is not None), x, residual, weight, bias)
    if path == _dispatch.REFERENCE:
        from . import reference

        return reference.norm_forward(x, residual, weight, bias, eps, is_rms)
    return _norm_launch.norm_forward(x, residual, weight, bias, eps, is_rms)


def backward_impl(dy, dh, x, weight, bias, mean, rstd, is_rms: bool):
    """Returns (dx, dweight or empty, dbias or empty). x is the normalised input (h for add+RMS);
    dh is the gradient reaching h directly (add_rms_norm's second output), added to dx."""
    name = _op_name(is_rms, dh is not None) + ".backward"
    path = _dispatch.choose_path(name, dy, dh, x, weight, bias)
    if path == _dispatch.REFERENCE:
        from . import reference

        return reference.norm_backward(dy, dh, x, weight, bias, mean, rstd, is_rms)
    return _norm_launch.norm_backward(dy, dh, x, weight, bias, mean, rstd, is_rms)


def norm(x, residual, weight, bias, eps: float, is_rms: bool) -> tuple[Tensor, Tensor]:
    """(y, h or empty) with autograd, through the custom op when compiling, else directly.
    weight, bias: [N] in any layout."""
    # The kernels read weight and bias as contiguous [N]. A view (every other element, a
    # 1-element tensor expanded to N) is copied here, before autograd, rather than giving every
    # kernel two more strides: the copy is N elements beside the M·N of the rows, contiguous
    # parameters (the usual case) pass through untouched, and autograd routes the gradient of
    # the copy back to the tensor the user holds (summed over a broadcast).
    weight = weight.contiguous() if weight is not None else None
    bias = bias.contiguous() if bias is not None else None
    if torch.compiler.is_compiling():
        y, h, _, _ = norm_fwd(x, residual, weight, bias, eps, is_rms)
        return y, h
    return _NormFunction.apply(x, residual, weight, bias, eps, is_rms)


class _NormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, is_rms):
        y, h, mean, rstd = forward_impl(x, residual, weight, bias, eps, is_rms)
        _save(ctx, x, residual, weight, bias, is_rms, h, mean, rstd)
        if residual is None:
            ctx.mark_non_differentiable(h)
        return y, h

    @staticmethod
    @torch.autograd.function.once_differentiable  # double backward: a clear error, not zeros
    def backward(ctx, dy, dh):
        return _backward(ctx, dy, dh, backward_impl)


def _save(ctx, x, residual, weight, bias, is_rms, h, mean, rstd):
    ctx.is_rms = is_rms
    ctx.has_residual = residual is not None
    ctx.save_for_backward(h if residual is not None else x, weight, bias, mean, rstd)


def _backward(ctx, dy, dh, impl):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(x)
    dh = dh if ctx.has_residual else None
    dx, dw, db = impl(_rows(dy), _rows(dh), x, weight, bias, mean, rstd, ctx.is_rms)
    dres = dx if ctx.has_residual else None
    return (
        dx,
        dres,
        (dw if weight is not None else None),
        (db if bias is not None else None),
        None,
        None,
    )


def _rows(t: Tensor | None) -> Tensor | None:
    """Incoming gradients may be expanded or transposed views: the kernels need unit stride on N."""
    if t is None or t.stride(-1) == 1:
        return t
    return t.contiguous()


def _check_layout(**tensors) -> None:
    """What the kernels assume (_norm_launch). norm() and the public ops arrange it; the custom
    ops check it, as they can be called directly (the eager path skips the few microseconds)."""
    for name, t in tensors.items():
        if t is None:
            continue
        if t.dim() == 1:
            ok, need = t.is_contiguous(), "be contiguous"
        else:
            ok, need = t.stride(-1) == 1 or t.shape[-1] <= 1, "have unit stride along its last dim"
        if not ok:
            raise ValueError(
                f"{name} must {need} for the norm kernels, got strides {t.stride()}; "
                f"pass {name}.contiguous(), or call fusewise.ops, which does"
            )


@torch.library.custom_op("fusewise::norm_fwd", mutates_args=())
def norm_fwd(
    x: Tensor,
    residual: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    is_rms: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    _check_layout(x=x, residual=residual, weight=weight, bias=bias)
    return forward_impl(x, residual, weight, bias, eps, is_rms)


@norm_fwd.register_fake
def _(x, residual, weight, bias, eps, is_rms):
    m = x.shape[0]
    h = torch.empty_like(x) if residual is not None else x.new_empty(0)
    mean = x.new_empty(0 if is_rms else m, dtype=torch.float32)
    return torch.empty_like(x), h, mean, x.new_empty(m, dtype=torch.float32)


@torch.library.custom_op("fusewise::norm_bwd", mutates_args=())
def norm_bwd(
    dy: Tensor,
    dh: Tensor | None,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    is_rms: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    _check_layout(dy=dy, dh=dh, x=x, weight=weight, bias=bias, mean=mean, rstd=rstd)
    return backward_impl(dy, dh, x, weight, bias, mean, rstd, is_rms)


@norm_bwd.register_fake
def _(dy, dh, x, weight, bias, mean, rstd, is_rms):
    dw = torch.empty_like(weight) if weight is not None else x.new_empty(0)
    db = torch.empty_like(bias) if bias is not None else x.new_empty(0)
    return torch.empty_like(x), dw, db


def _setup_context(ctx, inputs, output):
    x, residual, weight, bias, eps, is_rms = inputs
    y, h, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    _save(ctx, x, residual, weight, bias, is_rms, h, mean, rstd)


def _custom_op_backward(ctx, dy, dh, _dmean, _drstd):
    return _backward(ctx, dy, dh, norm_bwd)


torch.library.register_autograd(
    "fusewise::norm_fwd", _custom_op_backward, setup_context=_setup_context
)
