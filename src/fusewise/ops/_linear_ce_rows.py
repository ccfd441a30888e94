"""The per-chunk cross-entropy pass of linear_cross_entropy: one [rows, V] block of logits in,
per-token loss and log-sum-exp out, and (optionally) the logit gradient written over the logits
in place, so the chunk costs one read for the statistics and one read + one write for the
gradient, and no second [rows, V] buffer exists.

Per row (z the logits after the optional soft-cap c·tanh(z/c), s the smoothing, y the target):

    lse  = log Σ exp(z)
    loss = (1-s)(lse - z_y) + s(lse - mean z) + z_loss·lse²      (0 where y == ignore_index)
    dz   = scale · (softmax(z)·(1 + 2·z_loss·lse) - s/V - (1-s)·[v == y]) · (1 - tanh²)

`scale` is d(output)/d(this token's loss): one value for every token (1 for "sum", 1/n_valid for
"mean", read from the device so nothing syncs) or one per token (reduction="none"'s backward).
The target and a per-token scale are read through their strides (a target t[::2], or a stride-0
grad_output from .sum()'s backward, needs no copy); the logits need unit stride along V.
A non-ignored target outside [0, V) cannot raise on the GPU without a sync; its loss is NaN.

Two implementations with the same contract: the Triton kernel (GPU, or the interpreter) and
torch ops (the reference path, used for CPU tensors without TRITON_INTERPRET and for float64).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._norm_launch import _sm_count as sm_count
from ._triton_utils import round_to

# From benchmarks/profile_linear_ce.py on an H200 ([1024, 128256] bf16, statistics + gradient):
# 4096 columns a step at 16 warps, up to 8 programs per SM (here one per row) ran at 239 us,
# 3.3 TB/s counting both reads and the write; 2 per SM (fewer rows in flight, hoping the second
# read of a row would hit L2) ran at 282 us, 1 per SM at 359 us: memory-level parallelism wins.
BLOCK_V = 4096
ROW_WARPS = 16
PROGRAMS_PER_SM = 8
SCALE_BLOCK = 4096


@triton.jit
def _tanh(x):
    # exp-based and stable at both ends; libdevice's tanh is not available to the interpreter
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _ce_row(
    z_ptr,
    stride_z,
    tgt_ptr,
    stride_t,
    loss_ptr,
    lse_ptr,
    scale_ptr,
    stride_s,
    row,
    row_ok,
    V,
    ignore_index,
    smoothing,
    z_loss,
    softcap,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTH: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    SCALE_PER_ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    base = z_ptr + row.to(tl.int64) * stride_z
    tgt = tl.load(tgt_ptr + row.to(tl.int64) * stride_t, mask=row_ok, other=ignore_index)
    valid = tgt != ignore_index
    in_range = (tgt >= 0) & (tgt < V)
    offs = tl.arange(0, BLOCK)
    # Online log-sum-exp per lane; the running max starts finite so the first rescale is exp(0)
    # rather than exp(-inf + inf).
    m = tl.full([BLOCK], -1e38, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    zsum = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + offs
        mask = (cols < V) & row_ok
        x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_SOFTCAP:
            x = softcap * _tanh(x / softcap)
        x = tl.where(mask, x, -float("inf"))
        m_new = tl.maximum(m, x)
        s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new
        if SMOOTH:
            zsum += tl.where(mask, x, 0.0)
    mx = tl.max(m, 0)
    lse = mx + tl.log(tl.sum(s * tl.exp(m - mx), 0))
    zt = tl.load(base + tl.where(valid & in_range, tgt, 0), mask=row_ok, other=0.0).to(tl.float32)
    if HAS_SOFTCAP:
        zt = softcap * _tanh(zt / softcap)
    nll = lse - zt
    if SMOOTH:
        nll = (1.0 - smoothing) * nll + smoothing * (lse - tl.sum(zsum, 0) / V)
    nll += z_loss * lse * lse
    nll = tl.where(in_range, nll, float("nan"))  # a bad target poisons the loss, visibly
    tl.store(loss_ptr + row, tl.where(valid, nll, 0.0), mask=row_ok)
    tl.store(lse_ptr + row, lse, mask=row_ok)
    if WRITE_GRAD:
        if SCALE_PER_ROW:
            scale = tl.load(scale_ptr + row.to(tl.int64) * stride_s, mask=row_ok, other=0.0)
        else:
            scale = tl.load(scale_ptr)
        scale = tl.where(valid, scale, 0.0)
        coeff = 1.0 + 2.0 * z_loss * lse
        # second read of the row: recent enough to come from L2 when few rows are in flight
        for start in range(0, V, BLOCK):
            cols = start + offs
            mask = (cols < V) & row_ok
            x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_SOFTCAP:
                t = _tanh(x / softcap)
                x = softcap * t
            p = tl.exp(x - lse) * coeff - smoothing / V
            p -= tl.where(cols == tgt, 1.0 - smoothing, 0.0)
            if HAS_SOFTCAP:
                p *= 1.0 - t * t
            tl.store(base + cols, round_to(p * scale, z_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _ce_rows_kernel(
    z_ptr,
    stride_z,
    tgt_ptr,
    stride_t,
    loss_ptr,
    lse_ptr,
    scale_ptr,
    stride_s,
    rows,
    V,
    ignore_index,
    smoothing,
    z_loss,
    softcap,
    rows_per_program,
    n_programs,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTH: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    SCALE_PER_ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Persistent: program p takes rows p, p + P, ... (P programs in all)."""
    pid = tl.program_id(0)
    for i in range(0, rows_per_program):
        row = pid + i * n_programs
        _ce_row(
            z_ptr,
            stride_z,
            tgt_ptr,
            stride_t,
            loss_ptr,
            lse_ptr,
            scale_ptr,
            stride_s,
            row,
            row < rows,
            V,
            ignore_index,
            smoothing,
            z_loss,
            softcap,
            HAS_SOFTCAP,
            SMOOTH,
            WRITE_GRAD,
            SCALE_PER_ROW,
            BLOCK,
        )


@triton.jit
def _scale_kernel(src_ptr, dst_ptr, g_ptr, n, BLOCK: tl.constexpr):
    """dst = src * g, g a device scalar, rounded once to dst's dtype (src may be dst)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr).to(tl.float32)
    x = tl.load(src_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst_ptr + offs, round_to(x * g, dst_ptr.dtype.element_ty), mask=mask)


def _sm_count(device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter: PROGRAMS_PER_SM programs, so rows loop inside a program
    return sm_count(device.index or 0)  # cached: asked once per chunk


def ce_rows_triton(z, target, loss, lse, scale, opts):
    """Launch over the rows of z [rows, V] (unit stride along V). opts = (ignore_index,
    label_smoothing, z_loss, softcap); scale None (statistics only), [1] or [rows] fp32;
    target [rows] and a [rows] scale in any strides."""
    ignore_index, smoothing, z_loss, softcap = opts
    rows, v = z.shape
    if rows == 0:
        return
    block = min(BLOCK_V, triton.next_power_of_2(v))
    programs = min(rows, PROGRAMS_PER_SM * _sm_count(z.device))
    write_grad = scale is not None
    per_row = write_grad and scale.numel() > 1
    scale = scale if write_grad else lse  # a placeholder: not read without WRITE_GRAD
    _ce_rows_kernel[(programs,)](
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
        triton.cdiv(rows, programs),
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
        _scale_kernel[(triton.cdiv(n, SCALE_BLOCK),)](
            src, dst, g, n, BLOCK=SCALE_BLOCK, num_warps=8
        )
    return dst


def ce_rows_torch(z, target, loss, lse, scale, opts):
    """The same contract as the kernel, in torch ops (the reference path)."""
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
