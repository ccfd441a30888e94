"""The norms' backward with each row's columns shared out among SLICES programs (launch.Bwd.slice).

Why: the fused backward (kernels_bwd.norm_bwd_block_kernel) holds the weight- and bias-gradient
accumulators of a whole row in registers. For LayerNorm at 16,384 elements that is 128 KB of fp32,
half a multiprocessor's register file, so one program of 32 warps fills a multiprocessor and its
loads, row sums and stores follow one another with nothing to overlap them (49% of the copy
ceiling on an H200). Here program (group, slice) holds the accumulators of its slice of columns
only, so several programs share a multiprocessor.

dx needs two sums over the whole row, so every program of a row walks the whole row for them; the
slices' programs of a row run side by side (adjacent program ids), so a slice another program
reads is read from memory once and found in L2 by the others. The walk ends on the program's own
slice, which is read again for dx and the gradients (from L1, or L2). Memory traffic stays at one
read of x and dy and one write of dx; the L2 traffic grows with the slices.
"""

import triton
import triton.language as tl

from .kernels import _times
from .kernels_bwd import _accumulate, _store_dx, _store_partials, _xhat


@triton.jit
def _row_sums_chunk(
    X, W, DY, s1, s2, rows64, row_ok, cols, mean, rstd, N, stride_x, stride_dy,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
):  # fmt: skip
    """s1 += x̂·w·dy and (LayerNorm) s2 += w·dy over one chunk of the row's columns."""
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0)
    xhat = _xhat(x.to(tl.float32), mean, rstd, mask, IS_RMS)
    wdy = dy.to(tl.float32)
    if HAS_W:
        wdy = wdy * tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    s1 += xhat * wdy
    if not IS_RMS:
        s2 += wdy
    return s1, s2


@triton.jit
def norm_bwd_sliced_kernel(
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
    groups,
    rows_per_program,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_DH: tl.constexpr,
    SLICES: tl.constexpr,
    BLOCK_S: tl.constexpr,
    CHUNK: tl.constexpr,
    UNROLL: tl.constexpr,
    ALIGN: tl.constexpr = 1,
):
    """Program p is slice p % SLICES of row group p // SLICES: rows group, group + groups, ...;
    columns [slice·BLOCK_S, (slice + 1)·BLOCK_S). It writes dx there, and its fp32 partial sums
    of dy·x̂ and dy over its rows into row `group` of DW_part / DB_part, those columns (summed
    afterwards, in a fixed order). The row sums walk the row in CHUNK-element chunks, starting
    after the own slice so that it is read last; UNROLL: the walk unrolled whole (its loads in
    flight together: more registers, fewer programs a multiprocessor), else a loop. ALIGN: as
    the forward's (kernels.py)."""
    N, stride_x = _times(N, ALIGN), _times(stride_x, ALIGN)
    stride_dy, stride_dh = _times(stride_dy, ALIGN), _times(stride_dh, ALIGN)
    pid = tl.program_id(0)
    group = pid // SLICES
    part = pid % SLICES
    cols = part * BLOCK_S + tl.arange(0, BLOCK_S)
    col_ok = cols < N
    offs = tl.arange(0, CHUNK)
    PER_SLICE: tl.constexpr = BLOCK_S // CHUNK
    CHUNKS: tl.constexpr = SLICES * PER_SLICE
    first = (part + 1) * PER_SLICE
    dw_acc = tl.zeros([1, BLOCK_S], tl.float32)
    db_acc = tl.zeros([1, BLOCK_S], tl.float32)
    for i in range(0, rows_per_program):
        rows = group + i * groups + tl.arange(0, 1)  # rows past the end are masked off
        row_ok = rows < M
        rows64 = rows.to(tl.int64)[:, None]
        rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
        mean = rstd if IS_RMS else tl.load(Mean + rows, mask=row_ok, other=0.0)
        s1 = tl.zeros([1, CHUNK], tl.float32)
        s2 = tl.zeros([1, CHUNK], tl.float32)
        if UNROLL:  # the walk's loads all in flight together, in more registers
            for c in tl.static_range(CHUNKS):
                s1, s2 = _row_sums_chunk(
                    X, W, DY, s1, s2, rows64, row_ok, ((first + c) % CHUNKS) * CHUNK + offs,
                    mean, rstd, N, stride_x, stride_dy, IS_RMS, HAS_W,
                )  # fmt: skip
        else:
            for c in range(0, CHUNKS):
                s1, s2 = _row_sums_chunk(
                    X, W, DY, s1, s2, rows64, row_ok, ((first + c) % CHUNKS) * CHUNK + offs,
                    mean, rstd, N, stride_x, stride_dy, IS_RMS, HAS_W,
                )  # fmt: skip
        c1 = tl.sum(s1, axis=1) / N
        c2 = tl.sum(s2, axis=1) / N
        # the own slice again, evict-first: the compiler cannot merge these loads with the
        # walk's (another policy), and nothing reads them after
        mask = row_ok[:, None] & col_ok[None, :]
        x_ptrs, dy_ptrs = (
            X + rows64 * stride_x + cols[None, :],
            DY + rows64 * stride_dy + cols[None, :],
        )
        x = tl.load(x_ptrs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_ptrs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        xhat = _xhat(x, mean, rstd, mask, IS_RMS)
        dw_acc, db_acc = _accumulate(dw_acc, db_acc, dy, xhat, HAS_W, HAS_B)
        if HAS_W:
            dy = dy * tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        dx = dy - xhat * c1[:, None]
        if not IS_RMS:
            dx -= c2[:, None]
        _store_dx(dx * rstd[:, None], DH, DX, rows64, cols, mask, stride_dh, N, HAS_DH, True)
    _store_partials(DW_part, DB_part, group, cols, col_ok, N, dw_acc, db_acc, HAS_W, HAS_B)
