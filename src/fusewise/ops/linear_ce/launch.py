"""Host side of linear_cross_entropy: the row-pass and scaling launchers, the chunk loop, and the
one forward and one backward that every path takes (the eager autograd.Function and the custom
ops torch.compile traces, op.py).

Per chunk of tokens: the logits by one cuBLAS GEMM into a reused [chunk, V] buffer; one row pass
(kernels.py, or its torch twin reference.ce_rows on the reference path) turns them into
per-token loss and log-sum-exp and, when gradients are wanted, into the logit gradient in place;
then dhidden = g @ W and dweight += g.T @ h by cuBLAS.

Three matmuls in all (6·N·d·V FLOP) for reduction "mean"/"sum": the forward already knows each
token's weight in the loss (1, or 1/n_valid on the device), so it computes the gradients there
and the backward only multiplies them by grad_output (one Triton pass, one rounding).
reduction="none" cannot know its per-token grad_output in the forward: its backward recomputes
the logits (four matmuls).

The weight gradient sums over chunks. By default it accumulates in the weight's dtype (one
rounding per chunk, as Liger does): on the H200 at N=4096, V=32768 with 16 chunks its error
against float64 was 1.14x that of the full-logits formula (and below F.cross_entropy on bf16
logits); benchmarks/results/h200_linear_ce_profile.csv. fp32_accumulate=True keeps an fp32
accumulator and rounds once (as accurate as eager) for 4 more bytes per weight element (2.1 GB
at V=128256, d=4096) and 3-6% more time. dhidden is complete per chunk and kept in fp32 until
the backward scales it, so it is rounded once either way.

No host sync: the count of non-ignored tokens stays on the device.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from .. import _dispatch
from .._launch import cdiv, launch, next_power_of_2, sm_count
from . import reference
from .kernels import ce_rows_kernel, scale_kernel

# From benchmarks/profile_linear_ce.py on an H200 ([1024, 128256] bf16, statistics + gradient):
# 4096 columns a step at 16 warps, up to 8 programs per SM (here one per row) ran at 239 us,
# 3.3 TB/s counting both reads and the write; 2 per SM (fewer rows in flight, hoping the second
# read of a row would hit L2) ran at 282 us, 1 per SM at 359 us: memory-level parallelism wins.
BLOCK_V = 4096
ROW_WARPS = 16
PROGRAMS_PER_SM = 8
SCALE_BLOCK = 4096
# Tokens per chunk: as many as fit CHUNK_BYTES of logits in the input dtype (2048 at V=128256
# in bf16), in whole GEMM tiles. Each chunk re-reads and re-writes the weight-gradient
# accumulator, so larger chunks are faster and take more memory. H200, N=16384, d=4096,
# V=128256, against 77.7 ms for three bare cuBLAS matmuls in the same run: 1024 tokens 84.8 ms /
# 1.58 GB peak extra, 2048 tokens 81.8 ms / 1.84 GB, 4096 tokens 81.6 ms / 2.37 GB
# (benchmarks/results/h200_linear_ce.csv).
CHUNK_BYTES = 512 << 20
_fp32_out_gemm = True  # torch.ops.aten.{mm,addmm}.dtype_out on CUDA; cleared if it fails


def _programs(device) -> int:
    if device.type != "cuda":
        return PROGRAMS_PER_SM  # the interpreter: a few programs, so rows loop inside a program
    return PROGRAMS_PER_SM * sm_count(device.index or 0)  # cached: asked once per chunk


def ce_rows_triton(z, target, loss, lse, scale, opts):
    """Launch over the rows of z [rows, V] (unit stride along V). opts = (ignore_index,
    label_smoothing, z_loss, softcap); scale None (statistics only), [1] or [rows] fp32;
    target [rows] and a [rows] scale in any strides."""
    ignore_index, smoothing, z_loss, softcap = opts
    rows, v = z.shape
    if rows == 0:
        return
    block = min(BLOCK_V, next_power_of_2(v))
    programs = min(rows, _programs(z.device))
    write_grad = scale is not None
    per_row = write_grad and scale.numel() > 1
    scale = scale if write_grad else lse  # a placeholder: not read without WRITE_GRAD
    launch(
        ce_rows_kernel,
        (programs,),
        z,
        z.stride(0),
        target,
        target.stride(0),
        loss,
        lse,
        scale,
        scale.stride(0),
        rows,
        v,
        ignore_index,
        smoothing,
        z_loss,
        softcap or 1.0,
        cdiv(rows, programs),
        programs,
        HAS_SOFTCAP=softcap is not None,
        SMOOTH=smoothing != 0.0,
        WRITE_GRAD=write_grad,
        SCALE_PER_ROW=per_row,
        BLOCK=block,
        num_warps=ROW_WARPS if block >= 2048 else 4,
    )


def scale_into(src, dst, g):
    """dst = src * g (g a one-element device tensor), one rounding; contiguous, same numel."""
    n = src.numel()
    if n:
        launch(
            scale_kernel, (cdiv(n, SCALE_BLOCK),), src, dst, g, n, BLOCK=SCALE_BLOCK, num_warps=8
        )
    return dst


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
                stacklevel=_dispatch.caller_stacklevel(),
            )
    out.addmm_(a.float(), b.float()) if accumulate else torch.mm(a.float(), b.float(), out=out)


def run(hidden, weight, target, bias, opts, scale, need, cfg, path, final):
    """One pass over token chunks. hidden [N, d], weight [V, d] as the GEMMs take them, target
    [N]. Returns per-token loss and lse [N] (fp32) and, if scale is a device tensor ([1] or [N],
    d(output)/d(token loss)), the gradients named in need = (dhidden, dweight, dbias), None
    where not needed. cfg = (fp32_accumulate, chunk_size). final=False leaves the gradients in
    fp32 where that keeps a rounding for the caller's scaling (dhidden, dbias, and dweight with
    fp32_accumulate)."""
    n, v = hidden.shape[0], weight.shape[0]
    dev, dt = hidden.device, hidden.dtype
    exact, chunk_size = cfg
    rows = reference.ce_rows if path == _dispatch.REFERENCE else ce_rows_triton
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


# --- the one forward and the one backward of every path ----------------------------------------


def _n_valid(target, ignore_index):
    return (target != ignore_index).sum().clamp(min=1).float()


def _token_scale(target, ignore_index, reduction):
    """d(output)/d(token loss) for "mean"/"sum", as a [1] device tensor (no sync)."""
    if reduction == "mean":
        return (1.0 / _n_valid(target, ignore_index)).reshape(1)
    return torch.ones(1, dtype=torch.float32, device=target.device)


def _reduce(loss_tok, target, ignore_index, reduction):
    if reduction == "none":
        return loss_tok
    total = loss_tok.sum()
    if reduction == "sum":
        return total
    # all tokens ignored: 0 (torch gives nan), so a padded batch never poisons a run
    return total / _n_valid(target, ignore_index)


def forward(hidden, weight, target, bias, reduction, opts, cfg, path, need):
    """The loss as `reduction` asks ([N] fp32 for "none", else a 0-d fp32) and its lse [N].
    For "mean"/"sum" with any of need = (dhidden, dweight, dbias) set, also the gradients for
    grad_output = 1 (the fused case: the backward only scales them, scale_grad); else None.
    target has N elements in any shape."""
    t1 = target.reshape(-1)
    fused = any(need) and reduction != "none"
    scale = _token_scale(t1, opts[0], reduction) if fused else None
    loss, lse, dh, dw, db = run(hidden, weight, t1, bias, opts, scale, need, cfg, path, False)
    return _reduce(loss, t1, opts[0], reduction), lse, ((dh, dw, db) if fused else None)


def scale_grad(grad, grad_out, dtype, path, in_place: bool):
    """The fused case's backward: grad (as forward left it) · grad_out (a device scalar), rounded
    once to dtype. One Triton pass (torch's mixed-dtype multiply took 2.5 ms for a 1 GB gradient).
    in_place: write over grad when it already has that dtype (the eager path; a custom op must
    return a new tensor)."""
    if grad is None:
        return None
    if in_place and grad.dtype == dtype:
        out = grad
    else:
        out = torch.empty(grad.shape, dtype=dtype, device=grad.device)
    if path == _dispatch.REFERENCE:
        return torch.mul(grad, grad_out, out=out)
    # a one-element grad_out on another device (a CPU scalar given to the custom op directly;
    # autograd always gives grad's device) is brought over: the kernel reads it through a pointer
    return scale_into(grad, out, grad_out.to(grad.device, torch.float32).reshape(1))


def backward(grad_out, hidden, weight, target, bias, reduction, opts, cfg, path, need):
    """The recomputing backward (reduction "none", or an output whose forward kept no
    gradients): the logits again, the gradients scaled per token ([N] grad_out in any strides)
    or by grad_out / n_valid ("mean") or grad_out ("sum"). Returns (dh, dw, db), None where not
    in need."""
    t1 = target.reshape(-1)
    scale = grad_out.float()  # any strides (stride 0 from .sum()): the kernel reads them
    if reduction != "none":
        scale = scale.reshape(1) * _token_scale(t1, opts[0], reduction)
    return run(hidden, weight, t1, bias, opts, scale, need, cfg, path, True)[2:]
