"""The fused norm backward on rows held in two blocks (settings.Bwd.head): a head of HEAD
elements and a tail of TAIL, each a power of two, for rows between them. One block of the next
power of two over the row (norm_bwd_block_kernel) leaves up to half its lanes masked off, yet
holds registers for all of them: at 8,704 elements a row, 16,384 lanes for 8,704 elements. Two
blocks of 8,192 and 512 hold what the row needs, so a row of 8,704 fits the registers of a
program on 8 warps with the next row's loads in flight (PREFETCH), as rows of 8,192 do.

Otherwise as norm_bwd_block_kernel (kernels_bwd.py): persistent programs, x and dy read once,
dx written once, the weight and bias gradients accumulated in registers per column and written
as each program's fp32 partial row (summed afterwards in a fixed order). One row a tile, its
statistics and sums scalars: the two blocks have layouts of their own, and [rows] vectors of
each would go through shared memory (a barrier each) to be added and broadcast."""

import triton
import triton.language as tl

from .._launch import round_to as _round
from .kernels import _times
from .kernels_bwd import _accumulate


@triton.jit
def _load_row(X, DY, row, stride_x, stride_dy, cols, col_ok):
    """A row's x and dy at `cols`, in their storage dtype; nothing past the last row."""
    row64 = row.to(tl.int64)
    x = tl.load(X + row64 * stride_x + cols, mask=col_ok, other=0.0)
    return x, tl.load(DY + row64 * stride_dy + cols, mask=col_ok, other=0.0)


@triton.jit
def _stats(Mean, Rstd, row, M, IS_RMS: tl.constexpr):
    """(mean, rstd) of a row, 0 past the last (RMS: rstd twice)."""
    rstd = tl.load(Rstd + row, mask=row < M, other=0.0)
    return (rstd if IS_RMS else tl.load(Mean + row, mask=row < M, other=0.0)), rstd


@triton.jit
def _block_sums(x, dy, w, mean, rstd, mask, IS_RMS: tl.constexpr, HAS_W: tl.constexpr):
    """(x̂, dy, w·dy, Σx̂·w·dy, Σw·dy) of a row's block in fp32 (RMS: Σx̂·w·dy twice); x̂ 0
    outside the mask (see kernels_bwd._xhat)."""
    x, dy = x.to(tl.float32), dy.to(tl.float32)
    xhat = tl.where(mask, x * rstd if IS_RMS else (x - mean) * rstd, 0.0)
    wdy = dy * w.to(tl.float32) if HAS_W else dy
    s1 = tl.sum(xhat * wdy, axis=0)
    return xhat, dy, wdy, s1, s1 if IS_RMS else tl.sum(wdy, axis=0)


@triton.jit
def _store_block(wdy, xhat, c1, c2, rstd, DH, DX, row, cols, mask, stride_dh, N,
                 IS_RMS: tl.constexpr, HAS_DH: tl.constexpr):  # fmt: skip
    """dx = rstd·(w·dy − x̂·c1 − c2) (RMS: no c2), plus dh (add+RMSNorm), at a row's block."""
    dx = wdy - xhat * c1
    if not IS_RMS:
        dx -= c2
    dx *= rstd
    row64 = row.to(tl.int64)
    if HAS_DH:
        dx += tl.load(DH + row64 * stride_dh + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(DX + row64 * N + cols, _round(dx, DX.dtype.element_ty), mask=mask)


@triton.jit
def _store_block_partials(DW_part, DB_part, pid, cols, col_ok, N, dw, db,
                          HAS_W: tl.constexpr, HAS_B: tl.constexpr):  # fmt: skip
    """Row pid of the partial gradients (or, for one program, the gradients, rounded)."""
    if HAS_W:
        tl.store(DW_part + pid.to(tl.int64) * N + cols, _round(dw, DW_part.dtype.element_ty),
                 mask=col_ok)  # fmt: skip
    if HAS_B:
        tl.store(DB_part + pid.to(tl.int64) * N + cols, _round(db, DB_part.dtype.element_ty),
                 mask=col_ok)  # fmt: skip


@triton.jit
def norm_bwd_pieces_kernel(
    X,
    W,
    DY,
    DH,
    DX,
    Mean,
    Rstd,
    DW_part,
    DB_part,
    M,
    N,
    stride_x,
    stride_dy,
    stride_dh,
    n_programs,
    tiles_per_program,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_DH: tl.constexpr,
    HEAD: tl.constexpr,
    TAIL: tl.constexpr,
    PREFETCH: tl.constexpr,
    ALIGN: tl.constexpr = 1,
):
    """Program p takes rows p, p+P, ... of HEAD < N <= HEAD + TAIL elements: columns [0, HEAD)
    as one block, [HEAD, N) as another of TAIL lanes. PREFETCH: the next row's loads issued
    before this row is computed; without it at its turn."""
    N, stride_x = _times(N, ALIGN), _times(stride_x, ALIGN)
    stride_dy, stride_dh = _times(stride_dy, ALIGN), _times(stride_dh, ALIGN)
    pid = tl.program_id(0)
    head = tl.arange(0, HEAD)
    tail = HEAD + tl.arange(0, TAIL)
    w_head = tl.load(W + head, mask=head < N, other=0.0) if HAS_W else None
    w_tail = tl.load(W + tail, mask=tail < N, other=0.0) if HAS_W else None
    dw_head, db_head = tl.zeros([HEAD], tl.float32), tl.zeros([HEAD], tl.float32)
    dw_tail, db_tail = tl.zeros([TAIL], tl.float32), tl.zeros([TAIL], tl.float32)
    # a row past the last is masked off whole: its columns compared with a width of 0 (one
    # comparison: a row bound and'ed with the columns' came out as integers, not booleans, under
    # Triton 3.9's interpreter, which then refused them as load masks)
    if PREFETCH:
        width = tl.where(pid < M, N, 0)
        nxt_head = _load_row(X, DY, pid, stride_x, stride_dy, head, head < width)
        nxt_tail = _load_row(X, DY, pid, stride_x, stride_dy, tail, tail < width)
        nxt_stats = _stats(Mean, Rstd, pid, M, IS_RMS)
    for i in range(0, tiles_per_program):
        row = pid + i * n_programs
        width = tl.where(row < M, N, 0)
        mask_head, mask_tail = head < width, tail < width
        if PREFETCH:
            xh, dyh = nxt_head
            xt, dyt = nxt_tail
            mean, rstd = nxt_stats
            nxt = row + n_programs
            nxt_width = tl.where(nxt < M, N, 0)
            nxt_head = _load_row(X, DY, nxt, stride_x, stride_dy, head, head < nxt_width)
            nxt_tail = _load_row(X, DY, nxt, stride_x, stride_dy, tail, tail < nxt_width)
            nxt_stats = _stats(Mean, Rstd, nxt, M, IS_RMS)
        else:
            xh, dyh = _load_row(X, DY, row, stride_x, stride_dy, head, mask_head)
            xt, dyt = _load_row(X, DY, row, stride_x, stride_dy, tail, mask_tail)
            mean, rstd = _stats(Mean, Rstd, row, M, IS_RMS)
        xhat_h, dyh, wdy_h, s1_h, s2_h = _block_sums(
            xh, dyh, w_head, mean, rstd, mask_head, IS_RMS, HAS_W
        )
        xhat_t, dyt, wdy_t, s1_t, s2_t = _block_sums(
            xt, dyt, w_tail, mean, rstd, mask_tail, IS_RMS, HAS_W
        )
        c1, c2 = (s1_h + s1_t) / N, (s2_h + s2_t) / N
        _store_block(wdy_h, xhat_h, c1, c2, rstd, DH, DX, row, head, mask_head, stride_dh, N,
                     IS_RMS, HAS_DH)  # fmt: skip
        _store_block(wdy_t, xhat_t, c1, c2, rstd, DH, DX, row, tail, mask_tail, stride_dh, N,
                     IS_RMS, HAS_DH)  # fmt: skip
        dw_head, db_head = _accumulate(dw_head, db_head, dyh, xhat_h, HAS_W, HAS_B)
        dw_tail, db_tail = _accumulate(dw_tail, db_tail, dyt, xhat_t, HAS_W, HAS_B)
    _store_block_partials(DW_part, DB_part, pid, head, head < N, N, dw_head, db_head, HAS_W, HAS_B)
    _store_block_partials(DW_part, DB_part, pid, tail, tail < N, N, dw_tail, db_tail, HAS_W, HAS_B)
