"""Linear + cross-entropy without the full logits: the vocabulary projection and the loss run
one chunk of tokens at a time, so only a [chunk, V] block of logits ever exists.

Equals (ops/reference.py: linear_cross_entropy)::

    z = F.linear(hidden, weight, bias);  z = softcap * tanh(z / softcap) if softcap
    loss = F.cross_entropy(z.float(), target, ignore_index=..., reduction=...,
                           label_smoothing=...) + z_loss * logsumexp(z)**2 (averaged like the loss)

Per chunk: the logits by one cuBLAS GEMM into a reused buffer; one Triton pass
(_linear_ce_rows.py) turns them into per-token loss and log-sum-exp and, when gradients are
wanted, into the logit gradient in place; then dhidden = g @ W and dweight += g.T @ h by cuBLAS.

Three matmuls in all (6·N·d·V FLOP) for reduction "mean"/"sum": the forward already knows each
token's weight in the loss (1, or 1/n_valid on the device), so it computes the gradients
there and the backward only multiplies them by grad_output (one Triton pass, one rounding).
reduction="none" cannot know its per-token grad_output in the forward: its backward recomputes
the logits (four matmuls).

The weight gradient sums over chunks. By default it accumulates in the weight's dtype (one
rounding per chunk, as Liger does): on the H200 at N=4096, V=32768 with 16 chunks its error
against float64 was 1.14x that of the full-logits formula (and below F.cross_entropy on bf16
logits); benchmarks/results/h200_linear_ce_profile.csv. fp32_accumulate=True keeps an fp32
accumulator and rounds once (as accurate as eager) for 4 more bytes per weight element (2.1 GB
at V=128256, d=4096) and 3-6% more time. dhidden is complete per chunk and kept in fp32 until
the backward scales it, so it is rounded once either way.

No host sync: the count of non-ignored tokens stays on the device, so the op compiles with
fullgraph=True and captures in a CUDA graph.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from . import _dispatch
from ._linear_ce_args import check_args, check_targets
from ._linear_ce_rows import ce_rows_torch, ce_rows_triton, scale_into

# Tokens per chunk: as many as fit CHUNK_BYTES of logits in the input dtype (2048 at V=128256
# in bf16), in whole GEMM tiles. Each chunk re-reads and re-writes the weight-gradient
# accumulator, so larger chunks are faster and take more memory. H200, N=16384, d=4096,
# V=128256, against 77.7 ms for three bare cuBLAS matmuls in the same run: 1024 tokens 84.8 ms /
# 1.58 GB peak extra, 2048 tokens 81.8 ms / 1.84 GB, 4096 tokens 81.6 ms / 2.37 GB
# (benchmarks/results/h200_linear_ce.csv).
CHUNK_BYTES = 512 << 20
_fp32_out_gemm = True  # torch.ops.aten.{mm,addmm}.dtype_out on CUDA; cleared if it fails


def _chunks(n: int, v: int, itemsize: int, chunk_size: int = 0):
    step = chunk_size or max(1, min(n, CHUNK_BYTES // max(v * itemsize, 1)))
    if not chunk_size and step >= 256:
        step -= step % 256  # whole GEMM tiles
    return [(s, min(n, s + step)) for s in range(0, n, step)]


def _gemm(out: Tensor, a: Tensor, b: Tensor, accumulate: bool) -> None:
    """out (+)= a @ b, where out is a's dtype or fp32 (an fp32 accumulator for low-precision
    operands: one GEMM writing fp32 on a GPU; fp32 operands elsewhere)."""
    global _fp32_out_gemm
    if out.dtype == a.dtype:
        out.addmm_(a, b) if accumulate else torch.mm(a, b, out=out)
        return
    if a.is_cuda and _fp32_out_gemm:
        try:
            if accumulate:
                torch.ops.aten.addmm.dtype_out(out, a, b, torch.float32, out=out)
            else:
                torch.ops.aten.mm.dtype_out(a, b, torch.float32, out=out)
            return
        except (RuntimeError, NotImplementedError, AttributeError) as e:
            _fp32_out_gemm = False
            warnings.warn(
                f"fusewise.ops.linear_cross_entropy: the fp32-output GEMM failed "
                f"({type(e).__name__}: {str(e)[:80]}); using fp32 operands instead, "
                f"which is slower",
                stacklevel=3,
            )
    out.addmm_(a.float(), b.float()) if accumulate else torch.mm(a.float(), b.float(), out=out)


def _run(hidden, weight, target, bias, opts, scale, need, cfg, path, final):
    """One pass over token chunks. Returns per-token loss and lse [N] (fp32) and, if scale is a
    device tensor ([1] or [N], d(output)/d(token loss)), the gradients named in need =
    (dhidden, dweight, dbias), None where not needed. cfg = (fp32_accumulate, chunk_size).
    final=False leaves the gradients in fp32 where that keeps a rounding for the caller's
    scaling (dhidden, dbias, and dweight with fp32_accumulate)."""
    n, v = hidden.shape[0], weight.shape[0]
    dev, dt = hidden.device, hidden.dtype
    exact, chunk_size = cfg
    rows = ce_rows_torch if path == _dispatch.REFERENCE else ce_rows_triton
    loss = torch.empty(n, dtype=torch.float32, device=dev)
    lse = torch.empty(n, dtype=torch.float32, device=dev)
    grads = scale is not None
    wide = torch.promote_types(dt, torch.float32)
    dh = (
        torch.empty(hidden.shape, dtype=dt if final else wide, device=dev)
        if grads and need[0]
        else None
    )
    dw = (
        torch.empty(weight.shape, dtype=wide if exact else dt, device=dev)
        if grads and need[1]
        else None
    )
    db = torch.zeros(v, dtype=wide, device=dev) if grads and need[2] else None
    chunks = _chunks(n, v, hidden.element_size(), chunk_size)
    buf = torch.empty(chunks[0][1] if chunks else 0, v, dtype=dt, device=dev)
    for s, e in chunks:
        z, h = buf[: e - s], hidden[s:e]
        if bias is None:
            torch.mm(h, weight.T, out=z)
        else:
            torch.addmm(bias, h, weight.T, out=z)
        row_scale = scale[s:e] if grads and scale.numel() > 1 else scale
        rows(z, target[s:e], loss[s:e], lse[s:e], row_scale, opts)  # z is the gradient now
        if dh is not None:
            _gemm(dh[s:e], z, weight, accumulate=False)
        if dw is not None:
            _gemm(dw, z.T, h, accumulate=s > 0)
        if db is not None:
            db += z.sum(0, dtype=db.dtype)
    if dw is not None and n == 0:
        dw.zero_()
    if final:
        dw = dw.to(weight.dtype) if dw is not None else None
        db = db.to(bias.dtype) if db is not None else None
    return loss, lse, dh, dw, db


def _scaled(grad: Tensor | None, grad_out: Tensor, dtype: torch.dtype, path: str) -> Tensor | None:
    """grad · grad_out (a device scalar) rounded once to dtype; in place when grad already has
    that dtype. One Triton pass (torch's mixed-dtype multiply took 2.5 ms for a 1 GB gradient)."""
    if grad is None:
        return None
    out = grad if grad.dtype == dtype else torch.empty(grad.shape, dtype=dtype, device=grad.device)
    if path == _dispatch.REFERENCE:
        return torch.mul(grad, grad_out, out=out)
    return scale_into(grad, out, grad_out.float().reshape(1))


def _reduce(loss_tok, target, ignore_index, reduction):
    if reduction == "none":
        return loss_tok
    total = loss_tok.sum()
    if reduction == "sum":
        return total
    # all tokens ignored: 0 (torch gives nan there), so a padded batch never poisons a run
    return total / _n_valid(target, ignore_index)


def _n_valid(target, ignore_index):
    return (target != ignore_index).sum().clamp(min=1).float()


def _token_scale(target, ignore_index, reduction):
    """d(output)/d(token loss) for "mean"/"sum", as a [1] device tensor (no sync)."""
    if reduction == "mean":
        return (1.0 / _n_valid(target, ignore_index)).reshape(1)
    return torch.ones(1, dtype=torch.float32, device=target.device)


class _LinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, bias, reduction, opts, cfg, path):
        need = (
            ctx.needs_input_grad[0],
            ctx.needs_input_grad[1],
            bias is not None and ctx.needs_input_grad[3],
        )
        ctx.fused = any(need) and reduction != "none"
        ctx.path = path
        scale = _token_scale(target, opts[0], reduction) if ctx.fused else None
        loss, lse, dh, dw, db = _run(
            hidden, weight, target, bias, opts, scale, need, cfg, path, final=False
        )
        if ctx.fused:  # the gradients exist already; backward scales them by grad_output
            ctx.save_for_backward(dh, dw, db)
            ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
            ctx.used = False
        else:
            ctx.save_for_backward(hidden, weight, target, bias)
            ctx.args = (opts, need, cfg)
        return _reduce(loss, target, opts[0], reduction)

    @staticmethod
    def backward(ctx, grad_out):
        if torch.is_grad_enabled():  # create_graph=True; once_differentiable would let it pass
            raise RuntimeError(_NO_SECOND_DERIVATIVE)
        if ctx.fused:
            if ctx.used:  # the saved gradients have been scaled in place already
                raise RuntimeError(_second_backward(ctx))
            ctx.used = True
            grads = [
                _scaled(x, grad_out, d, ctx.path) for x, d in zip(ctx.saved_tensors, ctx.dtypes)
            ]
        else:
            hidden, weight, target, bias = ctx.saved_tensors
            opts, need, cfg = ctx.args
            scale = grad_out.float()  # any strides (stride 0 from .sum()): the kernel reads them
            grads = _run(
                hidden, weight, target, bias, opts, scale, need, cfg, ctx.path, final=True
            )[2:]
        return grads[0], grads[1], None, grads[2], None, None, None, None


_NO_SECOND_DERIVATIVE = (
    "fusewise.ops.linear_cross_entropy has no second derivative: its gradients carry no graph, "
    "so differentiating them (create_graph=True: a gradient penalty, a Hessian-vector product) "
    "would silently leave out its terms. Use fusewise.ops.reference.linear_cross_entropy where "
    "higher-order gradients are needed."
)


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
    return _dispatch.REFERENCE if _dispatch._why_not_triton([t]) else _dispatch.TRITON


@torch.library.custom_op("fusewise::linear_ce_fwd", mutates_args=())
def linear_ce_fwd(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    z_loss: float,
    softcap: float | None,
    fp32_accumulate: bool,
    chunk_size: int,
) -> tuple[Tensor, Tensor]:
    """Per-token loss and lse [N], no gradients (reduction="none", or no grad wanted); target has
    hidden's leading shape (N elements, for the error message); the last two arguments are for
    the backward."""
    _check_cpu_targets(target, ignore_index, weight.shape[0])
    opts = (ignore_index, label_smoothing, z_loss, softcap)
    loss, lse, *_ = _run(
        hidden,
        weight,
        target.reshape(-1),
        bias,
        opts,
        None,
        (False,) * 3,
        (fp32_accumulate, chunk_size),
        _path_of(hidden),
        final=True,
    )
    return loss, lse


@linear_ce_fwd.register_fake
def _(
    hidden,
    weight,
    target,
    bias,
    ignore_index,
    label_smoothing,
    z_loss,
    softcap,
    fp32_accumulate,
    chunk_size,
):
    n = hidden.shape[0]
    return hidden.new_empty(n, dtype=torch.float32), hidden.new_empty(n, dtype=torch.float32)


@torch.library.custom_op("fusewise::linear_ce_bwd", mutates_args=())
def linear_ce_bwd(
    grad_tok: Tensor,
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    z_loss: float,
    softcap: float | None,
    fp32_accumulate: bool,
    chunk_size: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """reduction="none"'s backward: recompute each chunk's logits, gradients scaled per token."""
    opts = (ignore_index, label_smoothing, z_loss, softcap)
    need = (True, True, bias is not None)
    _, _, dh, dw, db = _run(
        hidden,
        weight,
        target.reshape(-1),
        bias,
        opts,
        grad_tok,
        need,
        (fp32_accumulate, chunk_size),
        _path_of(hidden),
        final=True,
    )
    return dh, dw, db if db is not None else hidden.new_empty(0)


@linear_ce_bwd.register_fake
def _(
    grad_tok,
    hidden,
    weight,
    target,
    bias,
    ignore_index,
    label_smoothing,
    z_loss,
    softcap,
    fp32_accumulate,
    chunk_size,
):
    # contiguous, as _run allocates them (empty_like would copy a .T input's strides)
    db = bias.new_empty(bias.shape) if bias is not None else hidden.new_empty(0)
    return hidden.new_empty(hidden.shape), weight.new_empty(weight.shape), db


def _check_cpu_targets(target, ignore_index, v):
    # Under torch.compile the ops' implementations run eagerly, so on the CPU they can check the
    # targets as the eager call does (same error, no graph break); on a GPU the loss is NaN.
    if target.device.type == "cpu":
        check_targets(target, ignore_index, v)


def _setup_none(ctx, inputs, output):
    hidden, weight, target, bias, *opts = inputs
    ctx.save_for_backward(hidden, weight, target, bias)
    ctx.opts = opts
    ctx.mark_non_differentiable(output[1])


def _backward_none(ctx, grad_tok, _grad_lse):
    hidden, weight, target, bias = ctx.saved_tensors
    dh, dw, db = linear_ce_bwd(grad_tok.float(), hidden, weight, target, bias, *ctx.opts)
    return dh, dw, None, (db if bias is not None else None), *([None] * 6)


torch.library.register_autograd(
    "fusewise::linear_ce_fwd", _backward_none, setup_context=_setup_none
)


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
    as _run(final=False) leaves them (the backward scales and rounds them)."""
    _check_cpu_targets(target, ignore_index, weight.shape[0])
    opts = (ignore_index, label_smoothing, z_loss, softcap)
    reduction = "mean" if mean else "sum"
    need = (True, True, bias is not None)
    loss, _, dh, dw, db = _run(
        hidden,
        weight,
        target.reshape(-1),
        bias,
        opts,
        _token_scale(target, ignore_index, reduction),
        need,
        (fp32_accumulate, chunk_size),
        _path_of(hidden),
        final=False,
    )
    return (
        _reduce(loss, target, ignore_index, reduction),
        dh,
        dw,
        (db if db is not None else hidden.new_empty(0)),
    )


@linear_ce_fused.register_fake
def _(
    hidden,
    weight,
    target,
    bias,
    ignore_index,
    mean,
    label_smoothing,
    z_loss,
    softcap,
    fp32_accumulate,
    chunk_size,
):
    wide = torch.promote_types(hidden.dtype, torch.float32)
    db = bias.new_empty(bias.shape, dtype=wide) if bias is not None else hidden.new_empty(0)
    dw = weight.new_empty(weight.shape, dtype=wide if fp32_accumulate else weight.dtype)
    loss = hidden.new_empty((), dtype=torch.float32)
    return loss, hidden.new_empty(hidden.shape, dtype=wide), dw, db


def _setup_fused(ctx, inputs, output):
    hidden, weight, _, bias = inputs[:4]
    ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
    ctx.save_for_backward(*output[1:])
    ctx.mark_non_differentiable(*output[1:])


def _backward_fused(ctx, grad_loss, *_):
    dh, dw, db = (
        (x * grad_loss).to(d) if d is not None else None
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
    t1, weight = target.reshape(-1), _gemm_ready(weight)
    if torch.compiler.is_compiling():
        wants_grad = torch.is_grad_enabled() and any(
            x is not None and x.requires_grad for x in (h2, weight, bias)
        )
        if wants_grad and reduction != "none":
            return linear_ce_fused(
                h2, weight, target, bias, opts[0], reduction == "mean", *opts[1:], *cfg
            )[0]
        loss_tok, _ = linear_ce_fwd(h2, weight, target, bias, *opts, *cfg)
        out = _reduce(loss_tok, t1, ignore_index, reduction)
    else:
        path = _dispatch.choose_path("linear_cross_entropy", h2, weight)
        out = _LinearCE.apply(h2, weight, t1, bias, reduction, opts, cfg, path)
    return out.view(lead) if reduction == "none" else out


def _gemm_ready(x: Tensor) -> Tensor:
    """x [rows, cols] itself when the GEMMs take it as it is (unit stride along one dim, the
    other stride covering that dim: padded rows, h[:, ::2] of a [B, T, d], a .T view), and a
    row chunk of it too; else a contiguous copy, made once rather than by every chunk's GEMM."""
    r, c = x.shape
    rows_ok = x.stride(1) == 1 and x.stride(0) >= max(1, c)
    columns_ok = x.stride(0) == 1 and x.stride(1) >= max(1, r)
    return x if rows_ok or columns_ok else x.contiguous()
