"""Triton kernels of the norms' backward (LayerNorm, RMSNorm, add+RMSNorm; the forward is in
kernels.py). dx = rstd·(w·dy − x̂·mean(x̂·w·dy) − mean(w·dy)) (RMS: no last term); dweight =
Σ_rows dy·x̂ and dbias = Σ_rows dy, reduced in two stages in a fixed order (deterministic, no
atomics): per-program fp32 partial rows, then sum_partials_kernel.

Two shapes of work:
  * fused (norm_bwd_block_kernel): persistent programs hold whole rows and the partial weight
    gradients in registers, so x and dy are read once from memory and dx written once (RELOAD
    reads a tile's x and dy a second time, a moment after the first, from L1 or L2).
  * split (norm_bwd_row_sums_kernel, then norm_bwd_tiles_kernel): for rows too wide for the
    registers to hold a row's tiles and its weight-gradient accumulators together. The first
    kernel reads x and dy for the two row sums; the second walks [rows, column block] tiles,
    writing dx and accumulating the weight gradients of its columns. x and dy are read twice
    from memory.
Row offsets are int64 so tensors past 2**31 elements index correctly. ALIGN: as the forward's
(kernels.py): N and the row strides arrive divided by it.
"""

import triton
import triton.language as tl

from .._launch import round_to as _round
from .kernels import _times


@triton.jit
def _xhat(x, mean, rstd, mask, IS_RMS: tl.constexpr):
    """x̂ = (x − mean)·rstd (RMS: x·rstd), 0 outside the tile's mask (x̂ of a masked element is
    −mean·rstd, −inf for a huge constant row, and −inf·0 would be NaN in the sums)."""
    xhat = x * rstd[:, None] if IS_RMS else (x - mean[:, None]) * rstd[:, None]
    return tl.where(mask, xhat, 0.0)


@triton.jit
def _dx_tile(xhat, dy, w, rstd, N, IS_RMS: tl.constexpr, HAS_W: tl.constexpr):
    """dx = rstd·(w·dy − x̂·mean(x̂·w·dy) − mean(w·dy)) for a tile of whole rows. w may be in its
    storage dtype: it is widened here, at its use."""
    wdy = dy * w.to(tl.float32)[None, :] if HAS_W else dy
    c1 = tl.sum(xhat * wdy, axis=1) / N
    dx = wdy - xhat * c1[:, None]
    if not IS_RMS:
        dx -= (tl.sum(wdy, axis=1) / N)[:, None]
    return dx * rstd[:, None]


@triton.jit
def _dx_reloaded(
    X, W, DY, xhat, dy, mean, rstd, rows, cols, mask, col_ok, stride_x, stride_dy, N,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
):  # fmt: skip
    """dx for a tile whose x and dy are read again after the row sums (from L1 or L2: the
    tile was read a moment before), so that neither is held in registers across the sums'
    cross-thread reduction beside the weight-gradient accumulators. Those are what spilled
    LayerNorm at 16384 elements a row: 16 elements a thread on 32 warps, x, dy and the two
    accumulators at 16 registers each against the 64 a thread has there."""
    wdy = dy * tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :] if HAS_W else dy
    c1 = tl.sum(xhat * wdy, axis=1) / N
    if not IS_RMS:
        c2 = tl.sum(wdy, axis=1) / N
    rows64 = rows.to(tl.int64)[:, None]
    # evict_first: another eviction policy than the first read's, so the compiler cannot merge
    # the two reads into one held value, which is the point; and the tile is not read again
    x = tl.load(
        X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first"
    ).to(tl.float32)
    dy = tl.load(
        DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first"
    ).to(tl.float32)
    xhat = _xhat(x, mean, rstd, mask, IS_RMS)
    if HAS_W:
        dy = dy * tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    dx = dy - xhat * c1[:, None]
    if not IS_RMS:
        dx -= c2[:, None]
    return dx * rstd[:, None]


@triton.jit
def _store_dx(
    dx, DH, DX, rows64, cols, mask, stride_dh, N, HAS_DH: tl.constexpr, STREAM: tl.constexpr = False
):
    """Write dx, plus the residual branch's gradient (add+RMSNorm). STREAM: a streaming store
    (".cs", evict first), so that dx does not push out of L2 the rows other programs read."""
    if HAS_DH:
        dx += tl.load(DH + rows64 * stride_dh + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    ptrs = DX + rows64 * N + cols[None, :]
    if STREAM:
        tl.store(ptrs, _round(dx, DX.dtype.element_ty), mask=mask, cache_modifier=".cs")
    else:
        tl.store(ptrs, _round(dx, DX.dtype.element_ty), mask=mask)


@triton.jit
def _accumulate(dw_acc, db_acc, dy, xhat, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """Add the tile's dy·x̂ and dy to the weight- and bias-gradient accumulators."""
    if HAS_W:
        dw_acc += dy * xhat
    if HAS_B:
        db_acc += dy
    return dw_acc, db_acc


@triton.jit
def _store_partials(
    DW_part, DB_part, index, cols, col_ok, N, dw_acc, db_acc,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr,
):  # fmt: skip
    """Row `index` of the partial weight and bias gradients: the accumulators summed over their
    rows (once, at the end: see norm_bwd_block_kernel). The partials are fp32, or with a single
    program the gradients themselves, rounded to their dtype here as sum_partials_kernel would."""
    if HAS_W:
        dw = _round(tl.sum(dw_acc, axis=0), DW_part.dtype.element_ty)
        tl.store(DW_part + index.to(tl.int64) * N + cols, dw, mask=col_ok)
    if HAS_B:
        db = _round(tl.sum(db_acc, axis=0), DB_part.dtype.element_ty)
        tl.store(DB_part + index.to(tl.int64) * N + cols, db, mask=col_ok)


@triton.jit
def _load_bwd_tile(
    X,
    DY,
    Mean,
    Rstd,
    tile,
    M,
    stride_x,
    stride_dy,
    cols,
    col_ok,
    IS_RMS: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # tiles past the end are fully masked off
    row_ok = rows < M
    mask = row_ok[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0)
    rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
    mean = rstd if IS_RMS else tl.load(Mean + rows, mask=row_ok, other=0.0)
    return x, dy, mean, rstd


@triton.jit
def norm_bwd_block_kernel(
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr,
    LEAN: tl.constexpr,
    RELOAD: tl.constexpr,
    ALIGN: tl.constexpr = 1,
):
    """Persistent: program p takes row tiles p, p+P, ...; writes dx, and its fp32 partial sums
    of dy·x̂ and dy into row p of DW_part / DB_part (summed afterwards: deterministic, no atomics).
    Reads x and dy once from memory, writes dx once. PREFETCH: the next tile's loads are issued
    before this tile is computed; without it a tile's loads (the weight's too, from L1) are
    issued at its turn, which leaves registers free for rows too wide to hold two tiles. LEAN:
    the weight-gradient sums before dx and the weight in its storage dtype, fewer registers live
    across the row sums (each faster at some widths and slower at others: settings.BWD_CONFIGS).
    RELOAD: the weight-gradient sums first too, and x and dy read again for dx after the row
    sums instead of held across them (_dx_reloaded)."""
    N, stride_x = _times(N, ALIGN), _times(stride_x, ALIGN)
    stride_dy, stride_dh = _times(stride_dy, ALIGN), _times(stride_dh, ALIGN)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0) if HAS_W else None
    if HAS_W and not LEAN:
        w = w.to(tl.float32)
    # accumulate whole tiles and reduce over rows once at the end: a reduction across rows in
    # every iteration costs a shared-memory round trip per tile (seen: 6x slower at N=256)
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    db_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    # software prefetch: the next tile's loads (statistics too) are in flight while this tile is
    # computed; a persistent program otherwise idles on every load.
    if PREFETCH:
        nxt = _load_bwd_tile(
            X, DY, Mean, Rstd, pid, M, stride_x, stride_dy, cols, col_ok, IS_RMS, BLOCK_M
        )
    for i in range(0, tiles_per_program):
        tile = pid + i * n_programs
        if PREFETCH:
            x_raw, dy_raw, mean, rstd = nxt
            nxt = _load_bwd_tile(
                X, DY, Mean, Rstd, tile + n_programs, M, stride_x, stride_dy, cols, col_ok,
                IS_RMS, BLOCK_M,
            )  # fmt: skip
        else:
            x_raw, dy_raw, mean, rstd = _load_bwd_tile(
                X, DY, Mean, Rstd, tile, M, stride_x, stride_dy, cols, col_ok, IS_RMS, BLOCK_M
            )
        x, dy = x_raw.to(tl.float32), dy_raw.to(tl.float32)
        if HAS_W and not (PREFETCH or RELOAD):  # from L1, not held: 74.2% -> 90.4% (16384)
            w = tl.load(W + cols, mask=col_ok, other=0.0)
            if not LEAN:
                w = w.to(tl.float32)
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < M)[:, None] & col_ok[None, :]
        xhat = _xhat(x, mean, rstd, mask, IS_RMS)
        # LEAN: the weight-gradient sums first, so dy is dead across the row sums dx needs (SASS
        # sm_90, RMSNorm at 16384 on 32 warps, no prefetch: 33 spilled registers -> 12, and 0
        # with the weight loaded at each tile). RELOAD: first too (_dx_reloaded loads the
        # weight itself).
        if LEAN or RELOAD:
            dw_acc, db_acc = _accumulate(dw_acc, db_acc, dy, xhat, HAS_W, HAS_B)
        if RELOAD:
            dx = _dx_reloaded(
                X, W, DY, xhat, dy, mean, rstd, rows, cols, mask, col_ok, stride_x, stride_dy,
                N, IS_RMS, HAS_W,
            )  # fmt: skip
        else:
            dx = _dx_tile(xhat, dy, w, rstd, N, IS_RMS, HAS_W)
        _store_dx(dx, DH, DX, rows.to(tl.int64)[:, None], cols, mask, stride_dh, N, HAS_DH)
        if not (LEAN or RELOAD):
            dw_acc, db_acc = _accumulate(dw_acc, db_acc, dy, xhat, HAS_W, HAS_B)
    _store_partials(DW_part, DB_part, pid, cols, col_ok, N, dw_acc, db_acc, HAS_W, HAS_B)


@triton.jit
def norm_bwd_row_sums_kernel(
    X,
    W,
    DY,
    Mean,
    Rstd,
    Sums,
    M,
    N,
    stride_x,
    stride_dy,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UNROLL: tl.constexpr,
    ALIGN: tl.constexpr = 1,
):
    """Split backward, first kernel: the row sums dx needs, Σx̂·w·dy / N into Sums[0, row] and
    (LayerNorm) Σw·dy / N into Sums[1, row], for BLOCK_M rows of any width. The row is walked
    in steps of UNROLL chunks of BLOCK_N, unrolled so a step's loads are in flight together."""
    N, stride_x, stride_dy = _times(N, ALIGN), _times(stride_x, ALIGN), _times(stride_dy, ALIGN)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)[:, None]
    rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
    mean = rstd if IS_RMS else tl.load(Mean + rows, mask=row_ok, other=0.0)
    offs = tl.arange(0, BLOCK_N)
    s1 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    s2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for step in range(0, tl.cdiv(N, UNROLL * BLOCK_N)):
        for c in tl.static_range(UNROLL):
            cols = (step * UNROLL + c) * BLOCK_N + offs
            col_ok = cols < N
            mask = row_ok[:, None] & col_ok[None, :]
            x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0)
            dy = tl.load(DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0)
            x, dy = x.to(tl.float32), dy.to(tl.float32)
            xhat = x * rstd[:, None] if IS_RMS else (x - mean[:, None]) * rstd[:, None]
            # masked x̂ is -mean·rstd, -inf for a huge constant row, and -inf·0 would be NaN
            xhat = tl.where(mask, xhat, 0.0)
            if HAS_W:
                dy = dy * tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            s1 += xhat * dy
            if not IS_RMS:
                s2 += dy
    tl.store(Sums + rows, tl.sum(s1, axis=1) / N, mask=row_ok)
    if not IS_RMS:
        tl.store(Sums + M + rows, tl.sum(s2, axis=1) / N, mask=row_ok)


@triton.jit
def norm_bwd_tiles_kernel(
    X,
    W,
    DY,
    DH,
    DX,
    Mean,
    Rstd,
    Sums,
    DW_part,
    DB_part,
    M,
    N,
    stride_x,
    stride_dy,
    stride_dh,
    rows_per_group,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_DH: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ALIGN: tl.constexpr = 1,
):
    """Split backward, second kernel. Grid (column blocks, row groups): dx for the program's
    columns of every row in its group, and the fp32 partial sums of dy·x̂ and dy over the group
    into row `group` of DW_part / DB_part."""
    N, stride_x = _times(N, ALIGN), _times(stride_x, ALIGN)
    stride_dy, stride_dh = _times(stride_dy, ALIGN), _times(stride_dh, ALIGN)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    group = tl.program_id(1)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :] if HAS_W else None
    # whole tiles accumulated, reduced over rows once at the end (see norm_bwd_block_kernel)
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    db_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    row_end = tl.minimum(M, (group + 1) * rows_per_group)
    for start in range(group * rows_per_group, row_end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)[:, None]
        c1 = tl.load(Sums + rows, mask=row_ok, other=0.0)
        c2 = c1 if IS_RMS else tl.load(Sums + M + rows, mask=row_ok, other=0.0)
        if IS_RMS:
            xhat = x * rstd
        else:
            xhat = (x - tl.load(Mean + rows, mask=row_ok, other=0.0)[:, None]) * rstd
        xhat = tl.where(mask, xhat, 0.0)
        dx = (dy * w if HAS_W else dy) - xhat * c1[:, None]
        if not IS_RMS:
            dx -= c2[:, None]
        _store_dx(dx * rstd, DH, DX, rows64, cols, mask, stride_dh, N, HAS_DH)
        dw_acc, db_acc = _accumulate(dw_acc, db_acc, dy, xhat, HAS_W, HAS_B)
    _store_partials(DW_part, DB_part, group, cols, col_ok, N, dw_acc, db_acc, HAS_W, HAS_B)


@triton.jit
def sum_partials_kernel(
    DW_part,
    DB_part,
    DW,
    DB,
    P,
    N,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Second stage of the weight-gradient reduction: sum the P partial rows in a fixed order in
    fp32 and write dweight / dbias in their own dtype (one launch for both). Loads [BLOCK_P,
    BLOCK_N] tiles so a column block needs P / BLOCK_P dependent loads, not P (one row at a time
    took ~0.3 ms for P = 264)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    dw = tl.zeros([BLOCK_P, BLOCK_N], tl.float32)
    db = tl.zeros([BLOCK_P, BLOCK_N], tl.float32)
    for p0 in range(0, P, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & col_ok[None, :]
        offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
        if HAS_W:
            dw += tl.load(DW_part + offs, mask=mask, other=0.0)
        if HAS_B:
            db += tl.load(DB_part + offs, mask=mask, other=0.0)
    if HAS_W:
        tl.store(DW + cols, _round(tl.sum(dw, axis=0), DW.dtype.element_ty), mask=col_ok)
    if HAS_B:
        tl.store(DB + cols, _round(tl.sum(db, axis=0), DB.dtype.element_ty), mask=col_ok)
