"""Linear + cross-entropy without the full logits: the vocabulary projection and the loss run
one chunk of tokens at a time, so only a [chunk, V] block of logits ever exists.

Equals (reference.py: linear_cross_entropy)::

    z = F.linear(hidden, weight, bias);  z = softcap * tanh(z / softcap) if softcap
    loss = F.cross_entropy(z.float(), target, ignore_index=..., reduction=...,
                           label_smoothing=...) + z_loss * logsumexp(z)**2 (averaged like the loss)

Traffic and FLOPs: cost.py; how the chunks run and what the gradients cost: launch.py.
One forward (launch.forward) and one backward (launch.scale_grad for "mean"/"sum", whose
gradients the forward computed; launch.backward, which recomputes, for "none"), reached two ways:
* eager: _LinearCE (torch.autograd.Function) calls them directly, without the custom-op
  wrapper's host cost per call, and scales the saved gradients in place;
* compiled: the custom ops fusewise::linear_ce_fwd / _fused / _bwd / _scale (fake + autograd
  registered) keep torch.compile(fullgraph=True) free of graph breaks.
No host sync: the count of non-ignored tokens stays on the device, so the op compiles with
fullgraph=True and captures in a CUDA graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _dispatch
from .args import check_args, check_targets
from .launch import backward, forward, scale_grad


class _LinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, bias, reduction, opts, cfg, path):
        need = (
            ctx.needs_input_grad[0],
            ctx.needs_input_grad[1],
            bias is not None and ctx.needs_input_grad[3],
        )
        ctx.path = path
        out, _, grads = forward(hidden, weight, target, bias, reduction, opts, cfg, path, need)
        ctx.fused = grads is not None
        if ctx.fused:  # the gradients exist already; backward scales them by grad_output
            ctx.save_for_backward(*grads)
            ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
            ctx.used = False
        else:
            ctx.save_for_backward(hidden, weight, target, bias)
            ctx.args = (reduction, opts, cfg, path, need)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        _dispatch.refuse_create_graph("linear_cross_entropy", "loss")
        if ctx.fused:
            if ctx.used:  # the saved gradients have been scaled in place already
                raise RuntimeError(_second_backward(ctx))
            ctx.used = True
            dh, dw, db = (
                scale_grad(x, grad_out, d, ctx.path, in_place=True)
                for x, d in zip(ctx.saved_tensors, ctx.dtypes)
            )
        else:
            dh, dw, db = backward(grad_out, *ctx.saved_tensors, *ctx.args)
        return dh, dw, None, db, None, None, None, None


def _second_backward(ctx) -> str:
    """What happened, told by whether the first backward kept the graph's saved tensors."""
    try:
        ctx.saved_tensors  # noqa: B018  (raises if the first backward freed them)
        what = (
            "whose graph was kept by the first (retain_graph=True), but its gradients were "
            "computed in the forward and the first backward used them up"
        )
    except RuntimeError:  # freed
        what = (
            "after the first one freed its graph (.backward() twice, torch.autograd.grad("
            "loss, some inputs) then .backward(), or two results built on the loss "
            "backwarded one by one); retain_graph=True would not help: its gradients are "
            "computed in the forward and the first backward uses them up"
        )
    return (
        f"fusewise.ops.linear_cross_entropy: a second backward reached this call, {what}. "
        "Backward once through everything built on the loss (add the terms first: "
        "(a + b).backward()), ask for every gradient in one torch.autograd.grad(loss, "
        "[hidden, weight, ...]) call, or call linear_cross_entropy again for each backward; "
        "reduction='none' recomputes in its backward and allows several."
    )


# --- custom ops: what torch.compile traces (eager calls take _LinearCE directly) -----------------


def _path_of(t: Tensor) -> str:
    """The path the custom ops take, chosen, warned and reported as eager calls do (never a
    silent fallback under torch.compile or the recorder either)."""
    return _dispatch.choose_path("linear_cross_entropy", t)


def _check_cpu_targets(target, ignore_index, v):
    # Under torch.compile the ops' implementations run eagerly, so on the CPU they can check the
    # targets as the eager call does (same error, no graph break); on a GPU the loss is NaN.
    if target.device.type == "cpu":
        check_targets(target, ignore_index, v)


@torch.library.custom_op("fusewise::linear_ce_fwd", mutates_args=())
def linear_ce_fwd(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    z_loss: float,
    softcap: float | None,
    fp32_accumulate: bool,
    chunk_size: int,
) -> tuple[Tensor, Tensor]:
    """The loss as `reduction` asks and lse [N], no gradients kept (reduction="none", or no
    gradient wanted); target has hidden's leading shape (N elements, for the error message)."""
    _check_cpu_targets(target, ignore_index, weight.shape[0])
    opts, cfg = (ignore_index, label_smoothing, z_loss, softcap), (fp32_accumulate, chunk_size)
    path, need = _path_of(hidden), (False,) * 3
    out, lse, _ = forward(hidden, weight, target, bias, reduction, opts, cfg, path, need)
    return out, lse


@linear_ce_fwd.register_fake
def _(hidden, weight, target, bias, ignore_index, reduction, *_):
    n = hidden.shape[0]
    out = hidden.new_empty(n if reduction == "none" else (), dtype=torch.float32)
    return out, hidden.new_empty(n, dtype=torch.float32)


@torch.library.custom_op("fusewise::linear_ce_bwd", mutates_args=())
def linear_ce_bwd(
    grad_out: Tensor,
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    z_loss: float,
    softcap: float | None,
    fp32_accumulate: bool,
    chunk_size: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """linear_ce_fwd's backward (launch.backward): recompute each chunk's logits."""
    opts, cfg = (ignore_index, label_smoothing, z_loss, softcap), (fp32_accumulate, chunk_size)
    need = (True, True, bias is not None)
    dh, dw, db = backward(
        grad_out, hidden, weight, target, bias, reduction, opts, cfg, _path_of(hidden), need
    )
    return dh, dw, db if db is not None else hidden.new_empty(0)


@linear_ce_bwd.register_fake
def _(grad_out, hidden, weight, target, bias, *_):
    # contiguous, as launch.run allocates them (empty_like would copy a .T input's strides)
    db = bias.new_empty(bias.shape) if bias is not None else hidden.new_empty(0)
    return hidden.new_empty(hidden.shape), weight.new_empty(weight.shape), db


def _setup_fwd(ctx, inputs, output):
    hidden, weight, target, bias, *args = inputs
    ctx.save_for_backward(hidden, weight, target, bias)
    ctx.args = args
    ctx.mark_non_differentiable(output[1])


def _backward_fwd(ctx, grad_out, _grad_lse):
    hidden, weight, target, bias = ctx.saved_tensors
    dh, dw, db = linear_ce_bwd(grad_out.float(), hidden, weight, target, bias, *ctx.args)
    return dh, dw, None, (db if bias is not None else None), *([None] * 7)


torch.library.register_autograd("fusewise::linear_ce_fwd", _backward_fwd, setup_context=_setup_fwd)


@torch.library.custom_op("fusewise::linear_ce_fused", mutates_args=())
def linear_ce_fused(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None,
    ignore_index: int,
    mean: bool,
    label_smoothing: float,
    z_loss: float,
    softcap: float | None,
    fp32_accumulate: bool,
    chunk_size: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Reduced loss ("mean" or "sum") and its gradients for grad_output = 1, in one pass, held
    as launch.forward leaves them (linear_ce_scale scales and rounds them)."""
    _check_cpu_targets(target, ignore_index, weight.shape[0])
    opts, cfg = (ignore_index, label_smoothing, z_loss, softcap), (fp32_accumulate, chunk_size)
    reduction, need = ("mean" if mean else "sum"), (True, True, bias is not None)
    loss, _, (dh, dw, db) = forward(
        hidden, weight, target, bias, reduction, opts, cfg, _path_of(hidden), need
    )
    return loss, dh, dw, (db if db is not None else hidden.new_empty(0))


@linear_ce_fused.register_fake
def _(hidden, weight, target, bias, ignore_index, mean, ls, z_loss, softcap, fp32_accumulate, _):
    wide = torch.promote_types(hidden.dtype, torch.float32)
    db = bias.new_empty(bias.shape, dtype=wide) if bias is not None else hidden.new_empty(0)
    dw = weight.new_empty(weight.shape, dtype=wide if fp32_accumulate else weight.dtype)
    loss = hidden.new_empty((), dtype=torch.float32)
    return loss, hidden.new_empty(hidden.shape, dtype=wide), dw, db


@torch.library.custom_op("fusewise::linear_ce_scale", mutates_args=())
def linear_ce_scale(grad: Tensor, grad_out: Tensor, dtype: torch.dtype) -> Tensor:
    """linear_ce_fused's backward for one gradient (launch.scale_grad, as eager's): grad ·
    grad_out rounded once to dtype, into a new tensor."""
    return scale_grad(grad, grad_out, dtype, _path_of(grad), in_place=False)


@linear_ce_scale.register_fake
def _(grad, grad_out, dtype):
    return grad.new_empty(grad.shape, dtype=dtype)


def _setup_fused(ctx, inputs, output):
    hidden, weight, _, bias = inputs[:4]
    ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
    ctx.save_for_backward(*output[1:])
    ctx.mark_non_differentiable(*output[1:])


def _backward_fused(ctx, grad_loss, *_):
    dh, dw, db = (
        linear_ce_scale(x, grad_loss, d) if d is not None else None
        for x, d in zip(ctx.saved_tensors, ctx.dtypes)
    )
    return dh, dw, None, db, *([None] * 7)


torch.library.register_autograd(
    "fusewise::linear_ce_fused", _backward_fused, setup_context=_setup_fused
)


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
    fp32_accumulate: bool = False,
    chunk_size: int | None = None,
) -> Tensor:
    """Cross-entropy of `hidden @ weight.T + bias` against `target` without the full logits.

    hidden [N, d] or [B, T, d] ([d] with a 0-d target: one token); weight [V, d]; target [N] or
    [B, T] (int64 or int32, in [0, V) or ignore_index); bias [V]. Returns a scalar ("mean",
    "sum") or [N] / [B, T] ("none"), fp32. Any layout: views with a unit stride on either dim
    (padded rows, h[:, ::2], a weight.T view) go to the GEMMs uncopied, others are copied once;
    target, bias and grad_output are read through their strides. With every token ignored,
    "mean" gives 0 and zero gradients (torch gives nan). On a GPU a non-ignored target outside
    [0, V) makes the loss NaN (raising would need a host sync); on the CPU it raises a
    ValueError naming it, eagerly and under torch.compile alike. For "mean"/"sum" the gradients
    are computed in the forward (when any input requires grad), so one backward per call (a
    second raises and says why); no second derivative (create_graph=True raises).

    ignore_index and chunk_size take any integer (Python, numpy, torch); label_smoothing in
    [0, 1], z_loss >= 0 and softcap > 0 must be finite. fp32_accumulate: sum the weight gradient
    over chunks in fp32 (as accurate as eager; 4 bytes per weight element more); default: in the
    weight's dtype. chunk_size: tokens per chunk (default: 512 MiB of logits, 2048 tokens at
    V=128256 in bf16); larger is faster and takes more memory.
    """
    opts, cfg = check_args(
        hidden,
        weight,
        target,
        bias,
        ignore_index,
        reduction,
        label_smoothing,
        z_loss,
        softcap,
        fp32_accumulate,
        chunk_size,
    )
    ignore_index = opts[0]
    # On a GPU an out-of-range target makes the loss NaN (checking would sync); under
    # torch.compile the custom ops check on the CPU (here it would break the graph).
    if not torch.compiler.is_compiling():
        _check_cpu_targets(target, ignore_index, weight.shape[0])
    lead = target.shape
    # target.numel() rows, not -1: a d = 0 hidden has no elements to infer them from
    h2 = _gemm_ready(hidden.reshape(target.numel(), hidden.shape[-1]))
    weight = _gemm_ready(weight)
    if _dispatch.through_custom_op():
        wants_grad = torch.is_grad_enabled() and any(
            x is not None and x.requires_grad for x in (h2, weight, bias)
        )
        if wants_grad and reduction != "none":
            mean = reduction == "mean"
            out = linear_ce_fused(h2, weight, target, bias, ignore_index, mean, *opts[1:], *cfg)[0]
        else:
            out = linear_ce_fwd(h2, weight, target, bias, ignore_index, reduction, *opts[1:], *cfg)[
                0
            ]
    else:
        path = _dispatch.choose_path("linear_cross_entropy", h2, weight)
        out = _LinearCE.apply(h2, weight, target, bias, reduction, opts, cfg, path)
    return out.view(lead) if reduction == "none" else out


def _gemm_ready(x: Tensor) -> Tensor:
    """x [rows, cols] itself when the GEMMs take it as it is (unit stride along one dim, the
    other stride covering that dim: padded rows, h[:, ::2] of a [B, T, d], a .T view), and a
    row chunk of it too; else a contiguous copy, made once rather than by every chunk's GEMM."""
    r, c = x.shape
    rows_ok = x.stride(1) == 1 and x.stride(0) >= max(1, c)
    columns_ok = x.stride(0) == 1 and x.stride(1) >= max(1, r)
    return x if rows_ok or columns_ok else x.contiguous()
