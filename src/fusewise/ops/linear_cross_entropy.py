"""Linear + cross-entropy without the full logits: the vocabulary projection and the loss are
computed one chunk of tokens at a time, so only [chunk, V] logits ever exist.

Equals (ops/reference.py: linear_cross_entropy)::

    z = hidden @ weight.T + bias;  z = softcap * tanh(z / softcap) if softcap
    loss = F.cross_entropy(z.float(), target, ignore_index=..., reduction=...,
                           label_smoothing=...) + z_loss * logsumexp(z)**2 (averaged like the loss)

Forward keeps one fp32 log-sum-exp per token; backward recomputes each chunk's logits and
turns them into gradients in place (softmax minus the smoothed one-hot, scaled per token), then
dhidden = g @ W and dweight += g.T @ h (fp32 accumulator), dbias += sum(g). Four matmuls in all
(6·N·d·V FLOP would need the gradients in the forward, which cannot know grad_output for
reduction="none"); extra memory is one [chunk, V] fp32 block, the fp32 weight-gradient
accumulator and the per-token statistics. The count of non-ignored tokens stays on the device:
no host sync, so the op compiles with fullgraph=True and captures in a CUDA graph.

This first version runs the chunk arithmetic as torch ops (cuBLAS matmuls); it has not yet been
measured against the PERF.md target on a GPU, and a fused Triton epilogue is the next step.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from . import _dispatch

_mm_out_dtype_works = hasattr(torch.ops.aten.mm, "dtype")  # torch.mm(..., out_dtype=) on CUDA


def _mm_fp32_out(acc: Tensor, a: Tensor, b: Tensor) -> bool:
    """acc += a @ b as a low-precision GEMM writing fp32; False (caller falls back to fp32
    operands) where this torch has no such GEMM. Not yet run on a GPU, hence the guard."""
    global _mm_out_dtype_works
    if not _mm_out_dtype_works:
        return False
    try:
        acc.add_(torch.mm(a, b, out_dtype=torch.float32))
        return True
    except (RuntimeError, TypeError, NotImplementedError) as e:
        _mm_out_dtype_works = False
        warnings.warn(f"fusewise.ops.linear_cross_entropy: torch.mm(out_dtype=float32) failed "
                      f"({type(e).__name__}: {str(e)[:80]}); the weight gradient now uses fp32 "
                      f"operands, which is slower", stacklevel=2)  # fmt: skip
        return False


CHUNK_ELEMENTS = 1 << 26  # fp32 logits per chunk: 256 MiB (tokens per chunk = this // V)
_REDUCTIONS = ("mean", "sum", "none")


def _chunks(n: int, v: int):
    step = max(1, min(n, CHUNK_ELEMENTS // max(v, 1)))
    return [(s, min(n, s + step)) for s in range(0, n, step)]


def _logits(h, weight, bias, softcap):
    """fp32 logits of a chunk, soft-capped; also tanh(z / cap) for the backward (or None)."""
    z = (h @ weight.T if bias is None else torch.addmm(bias, h, weight.T)).float()
    if softcap is None:
        return z, None
    t = torch.tanh(z / softcap)
    return t * softcap, t


def _forward(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap):
    """Per-token loss terms [N] (fp32, 0 where ignored) and lse [N]."""
    n, v = hidden.shape[0], weight.shape[0]
    loss = torch.empty(n, dtype=torch.float32, device=hidden.device)
    lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
    for s, e in _chunks(n, v):
        z, _ = _logits(hidden[s:e], weight, bias, softcap)
        tgt = target[s:e]
        valid = tgt != ignore_index
        safe = torch.where(valid, tgt, 0)
        chunk_lse = torch.logsumexp(z, dim=-1)
        z_t = z.gather(1, safe[:, None]).squeeze(1)
        nll = chunk_lse - z_t
        if label_smoothing:
            nll = (1 - label_smoothing) * nll + label_smoothing * (chunk_lse - z.mean(-1))
        if z_loss:
            nll = nll + z_loss * chunk_lse * chunk_lse
        loss[s:e] = torch.where(valid, nll, 0.0)
        lse[s:e] = chunk_lse
    return loss, lse


def _backward(grad_tok, hidden, weight, target, bias, lse, ignore_index, label_smoothing, z_loss,
              softcap):  # fmt: skip
    """grad_tok [N] fp32: d(output)/d(per-token loss); ignored tokens get no gradient whatever
    it holds there."""
    n, v = hidden.shape[0], weight.shape[0]
    dh = torch.empty_like(hidden)
    dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    db = torch.zeros(v, dtype=torch.float32, device=weight.device) if bias is not None else None
    for s, e in _chunks(n, v):
        h = hidden[s:e]
        z, t = _logits(h, weight, bias, softcap)
        tgt = target[s:e]
        valid = tgt != ignore_index
        safe = torch.where(valid, tgt, 0)
        g_lse = 1.0 + 2.0 * z_loss * lse[s:e] if z_loss else None
        p = torch.exp(z.sub_(lse[s:e, None]))  # softmax, in place of the logits
        if g_lse is not None:
            p.mul_(g_lse[:, None])
        if label_smoothing:
            p.sub_(label_smoothing / v)
        p.scatter_add_(1, safe[:, None], torch.full_like(safe[:, None], -(1 - label_smoothing),
                                                         dtype=p.dtype))  # fmt: skip
        p.mul_(torch.where(valid, grad_tok[s:e], 0.0)[:, None])  # ignored tokens get nothing
        if t is not None:
            p.mul_(1 - t * t)  # d(cap·tanh(x/cap))/dx
        g = p.to(hidden.dtype)  # as eager: the logit gradient in the input dtype
        dh[s:e] = g @ weight
        # dweight sums over the chunks in fp32. Rounding each chunk's product to bf16 first was
        # measured 1.4x eager's error (tests/test_linear_ce.py), so: on a GPU a bf16 GEMM that
        # writes fp32 (mm.dtype); elsewhere fp32 operands (slow on a GPU, fine on a CPU)
        if not (g.is_cuda and g.dtype != torch.float32 and _mm_fp32_out(dw, g.T, h)):
            dw.addmm_(p.T, h.float())
        if db is not None:
            db.add_(p.sum(0))
    return dh, dw.to(weight.dtype), (db.to(bias.dtype) if db is not None else None)


def _reduce(loss_tok, target, ignore_index, reduction):
    if reduction == "none":
        return loss_tok
    total = loss_tok.sum()
    if reduction == "sum":
        return total
    n_valid = (target != ignore_index).sum()
    # all tokens ignored: 0 (torch gives nan there), so a padded batch never poisons a run
    return total / n_valid.clamp(min=1).to(total.dtype)


def _grad_per_token(grad_out, target, ignore_index, reduction):
    """d(output)/d(per-token loss): grad_out per token ("none") or broadcast, / count ("mean")."""
    g = grad_out.float().expand(target.shape)
    if reduction == "mean":
        g = g / (target != ignore_index).sum().clamp(min=1)
    return g


class _LinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, bias, ignore_index, reduction, label_smoothing,
                z_loss, softcap):  # fmt: skip
        loss_tok, lse = _forward(hidden, weight, target, bias, ignore_index, label_smoothing,
                                 z_loss, softcap)  # fmt: skip
        ctx.save_for_backward(hidden, weight, target, bias, lse)
        ctx.args = (ignore_index, reduction, label_smoothing, z_loss, softcap)
        return _reduce(loss_tok, target, ignore_index, reduction)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        hidden, weight, target, bias, lse = ctx.saved_tensors
        ignore_index, reduction, label_smoothing, z_loss, softcap = ctx.args
        g_tok = _grad_per_token(grad_out, target, ignore_index, reduction)
        dh, dw, db = _backward(g_tok, hidden, weight, target, bias, lse, ignore_index,
                               label_smoothing, z_loss, softcap)  # fmt: skip
        return dh, dw, None, db, None, None, None, None, None


# --- custom ops: what torch.compile traces (eager calls take _LinearCE directly) -----------------


@torch.library.custom_op("fusewise::linear_ce_fwd", mutates_args=())
def linear_ce_fwd(hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None,
                  ignore_index: int, label_smoothing: float, z_loss: float,
                  softcap: float | None) -> tuple[Tensor, Tensor]:  # fmt: skip
    return _forward(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap)


@linear_ce_fwd.register_fake
def _(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap):
    n = hidden.shape[0]
    return hidden.new_empty(n, dtype=torch.float32), hidden.new_empty(n, dtype=torch.float32)


@torch.library.custom_op("fusewise::linear_ce_bwd", mutates_args=())
def linear_ce_bwd(grad_tok: Tensor, hidden: Tensor, weight: Tensor, target: Tensor,
                  bias: Tensor | None, lse: Tensor, ignore_index: int, label_smoothing: float,
                  z_loss: float, softcap: float | None) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    dh, dw, db = _backward(grad_tok, hidden, weight, target, bias, lse, ignore_index,
                           label_smoothing, z_loss, softcap)  # fmt: skip
    return dh, dw, db if db is not None else hidden.new_empty(0)


@linear_ce_bwd.register_fake
def _(grad_tok, hidden, weight, target, bias, lse, ignore_index, label_smoothing, z_loss, softcap):
    db = torch.empty_like(bias) if bias is not None else hidden.new_empty(0)
    return torch.empty_like(hidden), torch.empty_like(weight), db


def _setup(ctx, inputs, output):
    hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap = inputs
    ctx.save_for_backward(hidden, weight, target, bias, output[1])
    ctx.args = (ignore_index, label_smoothing, z_loss, softcap)
    ctx.mark_non_differentiable(output[1])


def _custom_backward(ctx, grad_tok, _grad_lse):
    hidden, weight, target, bias, lse = ctx.saved_tensors
    ignore_index, label_smoothing, z_loss, softcap = ctx.args
    dh, dw, db = linear_ce_bwd(grad_tok.float(), hidden, weight, target, bias, lse, ignore_index,
                               label_smoothing, z_loss, softcap)  # fmt: skip
    return dh, dw, None, (db if bias is not None else None), None, None, None, None


torch.library.register_autograd("fusewise::linear_ce_fwd", _custom_backward, setup_context=_setup)


def linear_cross_entropy(hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None,
                         *, ignore_index: int = -100, reduction: str = "mean",
                         label_smoothing: float = 0.0, z_loss: float = 0.0,
                         softcap: float | None = None) -> Tensor:  # fmt: skip
    """Cross-entropy of `hidden @ weight.T + bias` against `target` without the full logits.

    hidden [N, d] or [B, T, d]; weight [V, d]; target [N] or [B, T] (int64, in [0, V) or
    ignore_index); bias [V]. Returns a scalar ("mean", "sum") or [N] / [B, T] ("none"), fp32.
    With every token ignored, "mean" gives 0 and zero gradients (torch gives nan).
    """
    _check(hidden, weight, target, bias, ignore_index, reduction, label_smoothing, z_loss, softcap)
    lead = target.shape
    h2, t1 = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    if h2.stride(-1) != 1:
        h2 = h2.contiguous()
    _dispatch.record_path("linear_cross_entropy", "chunked-torch")
    args = (int(ignore_index), float(label_smoothing), float(z_loss),
            None if softcap is None else float(softcap))  # fmt: skip
    if torch.compiler.is_compiling():
        loss_tok, _ = linear_ce_fwd(h2, weight, t1, bias, *args)
        out = _reduce(loss_tok, t1, ignore_index, reduction)
    else:
        out = _LinearCE.apply(h2, weight, t1, bias, args[0], reduction, *args[1:])
    return out.view(lead) if reduction == "none" else out


def _check(hidden, weight, target, bias, ignore_index, reduction, label_smoothing, z_loss,
           softcap):  # fmt: skip
    for name, t in (("hidden", hidden), ("weight", weight)):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"weight must be [V, d] with d = hidden.shape[-1] = {hidden.shape[-1]}, "
                         f"got {tuple(weight.shape)}")  # fmt: skip
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden and weight must share a dtype, got {hidden.dtype} and "
                        f"{weight.dtype}")  # fmt: skip
    if target.dtype not in (torch.int64, torch.int32) or target.shape != hidden.shape[:-1]:
        raise ValueError(f"target must be an integer tensor of shape {tuple(hidden.shape[:-1])}, "
                         f"got {target.dtype} {tuple(target.shape)}")  # fmt: skip
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != weight.dtype):
        raise ValueError(f"bias must be [{weight.shape[0]}] in {weight.dtype}, got "
                         f"{bias.dtype} {tuple(bias.shape)}")  # fmt: skip
    for name, t in (("weight", weight), ("target", target), ("bias", bias)):
        if t is not None and t.device != hidden.device:
            raise ValueError(f"{name} is on {t.device} but hidden is on {hidden.device}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0 or z_loss < 0 or (softcap is not None and softcap <= 0):
        raise ValueError("need 0 <= label_smoothing <= 1, z_loss >= 0 and softcap > 0 (or None)")
    # On a GPU an out-of-range target is a device-side assert in the gather (checking here would
    # sync); under torch.compile the check would break the graph, and gather raises instead.
    if target.device.type == "cpu" and not torch.compiler.is_compiling():
        bad = (target != ignore_index) & ((target < 0) | (target >= weight.shape[0]))
        if bad.any():
            i = int(bad.nonzero()[0, 0]) if bad.dim() == 1 else bad.nonzero()[0].tolist()
            raise ValueError(f"target[{i}] = {int(target[bad][0])} is outside [0, "
                             f"{weight.shape[0]}) and is not ignore_index ({ignore_index})")  # fmt: skip
