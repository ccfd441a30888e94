"""The normalisation ops: one forward and one backward implementation, reached two ways.

* eager: ``_NormFunction`` (torch.autograd.Function) calls them directly. torch.library's
  custom-op wrapper costs ~0.3 ms of host time per call on torch 2.11 (measured on an H200:
  0.7 ms host per forward+backward against 0.11 for F.rms_norm), more than the kernels take at
  realistic sizes, so eager code does not go through it.
* compiled: the custom ops fusewise::norm_fwd / fusewise::norm_bwd (fake + autograd registered)
  keep torch.compile(fullgraph=True) free of graph breaks.
Each implementation runs the Triton kernel, or the eager reference with a warning naming the
reason (ops/_dispatch.py). No host sync anywhere, so both capture in CUDA graphs.
Inputs are 2-D [M, N]; the public functions (layer_norm, rms_norm, add_rms_norm, at the end)
validate (validate.py) and flatten.

layer_norm equals (reference.py)::

    mean = x.mean(-1, keepdim=True); var = ((x - mean) ** 2).mean(-1, keepdim=True)
    y = (x - mean) * rsqrt(var + eps) * weight + bias

rms_norm equals ``y = x * rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight``, and
add_rms_norm(x, residual, weight) equals ``h = x + residual; (rms_norm(h, weight), h)``: h is
rounded to x's dtype before it is normalised, exactly as the unfused code would store it. All
computed in fp32 whatever the activation dtype. Traffic for [M, N] in a dtype of s bytes (cost.py):
forward reads x and writes y, 2·M·N·s (add_rms_norm reads x and residual and writes y and h,
4·M·N·s; unfused: 6·M·N·s, h is written then read back), plus fp32 mean and rstd per row;
backward reads the normalised input and dy (and dh), writes dx, 3·M·N·s; dweight/dbias are
reduced in fp32 in a fixed order (deterministic).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _dispatch
from . import launch, reference
from .validate import (
    as_rows,
    check_eps,
    check_floating,
    check_input,
    check_param,
    check_same_device,
    plainly_valid,
)


def forward_impl(x, residual, weight, bias, eps: float, is_rms: bool, path: str | None = None):
    """Returns (y, h = x + residual or None, mean or None (RMS), rstd); mean/rstd fp32 per row.
    path: the caller's _dispatch.choose_path for these tensors, or None to choose here."""
    if path is None:
        name = launch.op_name(is_rms, residual is not None)
        path = _dispatch.choose_path(name, x, residual, weight, bias)
    if path == _dispatch.REFERENCE:
        return reference.norm_forward(x, residual, weight, bias, eps, is_rms)
    return launch.norm_forward(x, residual, weight, bias, eps, is_rms)


def backward_impl(dy, dh, x, weight, bias, mean, rstd, is_rms: bool):
    """Returns (dx, dweight or None, dbias or None). x is the normalised input (h for add+RMS);
    dh is the gradient reaching h directly (add_rms_norm's second output), added to dx."""
    name = launch.op_name(is_rms, dh is not None) + ".backward"
    path = _dispatch.choose_path(name, dy, dh, x, weight, bias)
    if path == _dispatch.REFERENCE:
        return reference.norm_backward(dy, dh, x, weight, bias, mean, rstd, is_rms)
    return launch.norm_backward(dy, dh, x, weight, bias, mean, rstd, is_rms)


def norm(x, residual, weight, bias, eps: float, is_rms: bool) -> tuple[Tensor, Tensor | None]:
    """(y, h; h None or empty without a residual) with autograd, through the custom op when
    compiling or recorded (_dispatch.through_custom_op), else directly: without autograd.Function
    when no gradient is wanted (inference), whose apply is host time for nothing then.
    weight, bias: [N] in any layout."""
    # The kernels read weight and bias as contiguous [N]. A view (every other element, a
    # 1-element tensor expanded to N) is copied here, before autograd, rather than giving every
    # kernel two more strides: the copy is N elements beside the M·N of the rows, contiguous
    # parameters (the usual case) pass through untouched, and autograd routes the gradient of
    # the copy back to the tensor the user holds (summed over a broadcast).
    weight = weight.contiguous() if weight is not None else None
    bias = bias.contiguous() if bias is not None else None
    if _dispatch.through_custom_op():
        y, h, _, _ = norm_fwd(x, residual, weight, bias, eps, is_rms)
        return y, h
    if not _dispatch.wants_grad(x, residual, weight, bias):
        y, h, _, _ = forward_impl(x, residual, weight, bias, eps, is_rms)
        return y, h
    if residual is None:
        return _NormFunction.apply(x, None, weight, bias, eps, is_rms), None
    return _NormFunction.apply(x, residual, weight, bias, eps, is_rms)


class _NormFunction(torch.autograd.Function):
    """The eager path: y alone, or (y, h) with a residual. Its backward runs on autograd's
    device thread, so it does as little as it can: no Python beyond the launchers."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, is_rms):
        name = launch.op_name(is_rms, residual is not None)
        ctx.path = _dispatch.choose_path(name, x, residual, weight, bias)
        ctx.backward_name = name + ".backward"
        y, h, mean, rstd = forward_impl(x, residual, weight, bias, eps, is_rms, ctx.path)
        _save(ctx, x, residual, weight, bias, is_rms, h, mean, rstd)
        if residual is None:
            return y
        ctx.set_materialize_grads(False)  # an unused output's gradient: None, not a zero tensor
        return y, h

    @staticmethod
    def backward(ctx, dy, dh=None):
        # The forward's path holds: the gradients have y's device and dtype (autograd sees to
        # it), the rest are the forward's own tensors. Choosing again would cost host time on
        # autograd's device thread for the same answer.
        _dispatch.record_path(ctx.backward_name, ctx.path)
        impl = reference.norm_backward if ctx.path == _dispatch.REFERENCE else launch.norm_backward
        return _backward(ctx, dy, dh, impl)


def _save(ctx, x, residual, weight, bias, is_rms, h, mean, rstd):
    ctx.is_rms = is_rms
    ctx.has_residual = residual is not None
    ctx.save_for_backward(h if residual is not None else x, weight, bias, mean, rstd)


def _backward(ctx, dy, dh, impl):
    _dispatch.refuse_create_graph(launch.op_name(ctx.is_rms, ctx.has_residual), "norms")
    dh = dh if ctx.has_residual else None
    if dy is None and dh is not None:
        # Only h = x + residual reached the loss: its gradient passes to x and residual as it
        # is, and y's parameters get none (None, as torch's unfused code would leave them).
        return dh, dh, None, None, None, None
    x, weight, bias, mean, rstd = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(x)
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
    """What the kernels assume (launch.py). norm() and the public ops arrange it; the custom
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
    y, h, mean, rstd = forward_impl(x, residual, weight, bias, eps, is_rms)
    # a custom op returns tensors: empty ones for what this call has not
    h = h if h is not None else x.new_empty(0)
    return y, h, (mean if mean is not None else rstd.new_empty(0)), rstd


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
    dx, dw, db = backward_impl(dy, dh, x, weight, bias, mean, rstd, is_rms)
    empty = x.new_empty(0)  # a custom op returns tensors: empty ones for what it has not
    return dx, (dw if dw is not None else empty), (db if db is not None else empty)


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


# --- the public functions ---------------------------------------------------------------------


def layer_norm(
    x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """LayerNorm over the last dim of x [..., N]; weight, bias: [N] (activation dtype or fp32).

    Returns y with x's shape and dtype. Differentiable in x, weight and bias. Any layout of any
    input (strided, transposed, a broadcast weight). eps: a number >= 0 (None is an error, as
    in F.layer_norm).
    """
    if not plainly_valid(x, weight, bias):
        check_input("x", x)
        check_param("weight", weight, x)
        check_param("bias", bias, x)
    eps = check_eps(eps)
    if x.numel() == 0:
        return _empty_like_through(x, weight, bias)
    y, _ = norm(as_rows(x), None, weight, bias, eps, False)
    return _shaped_like(y, x)


def _shaped_like(y: Tensor, x: Tensor) -> Tensor:
    """The [M, N] result in x's shape; 2-D x: y itself (a view would be one more autograd node)."""
    return y if x.dim() == 2 else y.view(x.shape)


def _empty_like_through(x: Tensor, *params: Tensor | None) -> Tensor:
    """An empty output that still carries autograd edges, so backward gives zero gradients."""
    out = x.new_empty(x.shape) if not x.requires_grad else x * 0
    for p in params:
        if p is not None and p.requires_grad:
            out = out + (p.sum() * 0).to(out.dtype)
    return out


def default_eps(dtype: torch.dtype) -> float:
    """torch's eps=None for RMSNorm (F.rms_norm, nn.RMSNorm): the machine epsilon of the op-math
    dtype, float32 for bf16/fp16/fp32 inputs and float64 for float64, not of x's dtype."""
    return torch.finfo(torch.promote_types(dtype, torch.float32)).eps


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float | None = 1e-6) -> Tensor:
    """RMSNorm over the last dim of x [..., N]; weight: [N]. Returns x's shape and dtype. Any
    layout of any input. eps: a number >= 0, or None for torch's default (default_eps), as in
    F.rms_norm."""
    if not plainly_valid(x, weight):
        check_input("x", x)
        check_param("weight", weight, x)
    eps = check_eps(default_eps(x.dtype) if eps is None else eps)
    if x.numel() == 0:
        return _empty_like_through(x, weight)
    y, _ = norm(as_rows(x), None, weight, None, eps, True)
    return _shaped_like(y, x)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor | None, eps: float | None = 1e-6):
    """(rms_norm(x + residual, weight), x + residual) in one pass. x, residual: [..., N], same
    shape and dtype; weight: [N]. Differentiable in x, residual and weight (both outputs).
    eps=None means torch's default, as in rms_norm."""
    if not (plainly_valid(x, weight) and _plain_residual(residual, x)):
        _check_add_rms_norm(x, residual, weight)
    eps = check_eps(default_eps(x.dtype) if eps is None else eps)
    if x.numel() == 0:
        h = x + residual
        return _empty_like_through(h, weight), h
    y, h = norm(as_rows(x), as_rows(residual), weight, None, eps, True)
    return _shaped_like(y, x), _shaped_like(h, x)


def _plain_residual(residual, x: Tensor) -> bool:
    """A residual the full checks below would pass, in a few attribute reads."""
    return (
        type(residual) is Tensor
        and residual.layout is torch.strided
        and residual.dtype is x.dtype
        and residual.shape == x.shape
        and residual.device == x.device
    )


def _check_add_rms_norm(x, residual, weight) -> None:
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
