"""Triton kernels of the norms' forward: LayerNorm, RMSNorm and add+RMSNorm (the backward is in
kernels_bwd.py).

One kernel body per stage with constexpr switches: IS_RMS (no mean, no bias), HAS_W, HAS_B,
HAS_RES (add a residual first and also write the sum h = x + residual); kernels_bwd.py takes
the same switches.

Three shapes of work (launch.py picks by op, dtype and width; settings.FWD_WALK names the walked
widths):
  * block path: a [BLOCK_M, BLOCK_N] tile holds BLOCK_M whole rows in registers, so x is read once
    and y written once; statistics come from registers (mean, then the centred sum of squares: as
    accurate as a two-pass algorithm at the traffic of one).
  * wide path (rows wider than one block): one program per row walks the row in chunks, merging
    chunk statistics with Chan's parallel Welford update, then walks it again *backwards* to
    normalise, so the chunks read last (most likely still in L2) are re-read first.
  * walk (norm_fwd_walk_kernel): one program per row walks it in a constant number of chunks,
    reducing once per walk and reading the row again from L1/L2 for the next walk, so it holds
    no row in registers and several rows share a multiprocessor.
Row offsets are int64 so tensors past 2**31 elements index correctly.

ALIGN (each kernel; launch.align_of): a power of two that divides N and the row strides, which
the host passes divided by it; the kernel multiplies them back, so that Triton knows they are
multiples of it. Triton marks an integer argument divisible only by 16: a row of 65,528 bf16
elements (16-byte aligned, but N % 16 == 8) was loaded an element at a time, at a third of the
copy ceiling where torch made 55%. 1: the arguments as they are.
"""

import triton
import triton.language as tl

from .._launch import round_to as _round


@triton.jit
def _load(ptrs, mask, EVEN: tl.constexpr, POLICY: tl.constexpr = None):
    """tl.load, unmasked where the tile lies wholly inside the tensor (EVEN); POLICY: the
    eviction policy, None for the default (a default of "" fails to compile for a GPU)."""
    if POLICY is None:
        if EVEN:
            return tl.load(ptrs)
        return tl.load(ptrs, mask=mask, other=0.0)
    if EVEN:
        return tl.load(ptrs, eviction_policy=POLICY)
    return tl.load(ptrs, mask=mask, other=0.0, eviction_policy=POLICY)


@triton.jit
def _store(ptrs, value, mask, EVEN: tl.constexpr, STREAM: tl.constexpr = False):
    """tl.store, unmasked where EVEN; STREAM: as a streaming store (".cs", evict first), so that
    the output's lines do not push out of L2 the input a later walk reads again."""
    if STREAM:
        if EVEN:
            tl.store(ptrs, value, cache_modifier=".cs")
        else:
            tl.store(ptrs, value, mask=mask, cache_modifier=".cs")
    elif EVEN:
        tl.store(ptrs, value)
    else:
        tl.store(ptrs, value, mask=mask)


@triton.jit
def _times(value, ALIGN: tl.constexpr):
    """value * ALIGN, known to Triton as a multiple of ALIGN (ALIGN: a constexpr power of two)."""
    if ALIGN > 1:
        value = value * ALIGN
    return value


@triton.jit
def _load_row_tile(
    X,
    R,
    H,
    rows,
    cols,
    mask,
    stride_x,
    stride_r,
    N,
    HAS_RES: tl.constexpr,
    STORE_H: tl.constexpr,
    EVEN: tl.constexpr = False,
    POLICY: tl.constexpr = None,
):
    """Load x (or x + residual, rounded to the activation dtype and optionally stored) as fp32."""
    rows64 = rows.to(tl.int64)
    x = _load(X + rows64[:, None] * stride_x + cols[None, :], mask, EVEN, POLICY)
    if HAS_RES:
        r = _load(R + rows64[:, None] * stride_r + cols[None, :], mask, EVEN, POLICY)
        h = _round(x.to(tl.float32) + r.to(tl.float32), X.dtype.element_ty)
        if STORE_H:
            _store(H + rows64[:, None] * N + cols[None, :], h, mask, EVEN)
        x = h
    return x.to(tl.float32)


@triton.jit
def norm_fwd_block_kernel(
    X,
    R,
    W,
    B,
    Y,
    H,
    Mean,
    Rstd,
    M,
    N,
    stride_x,
    stride_r,
    eps,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_RES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN: tl.constexpr = False,
    ALIGN: tl.constexpr = 1,
):
    """Reads x [M, N] (and residual) once, writes y (and h) once, plus rstd (and mean) per row.
    EVEN: N == BLOCK_N and BLOCK_M divides M, so no load or store needs a mask."""
    N, stride_x, stride_r = _times(N, ALIGN), _times(stride_x, ALIGN), _times(stride_r, ALIGN)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    x = _load_row_tile(X, R, H, rows, cols, mask, stride_x, stride_r, N, HAS_RES, True, EVEN)
    if IS_RMS:
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
        y = x * rstd[:, None]
    else:
        mean = tl.sum(x, axis=1) / N
        xc = x - mean[:, None] if EVEN else tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
        y = xc * rstd[:, None]
        _store(Mean + rows, mean, row_ok, EVEN)
    _store(Rstd + rows, rstd, row_ok, EVEN)
    if HAS_W:
        y = y * _load(W + cols, col_ok, EVEN).to(tl.float32)[None, :]
    if HAS_B:
        y = y + _load(B + cols, col_ok, EVEN).to(tl.float32)[None, :]
    y_ptrs = Y + rows.to(tl.int64)[:, None] * N + cols[None, :]
    _store(y_ptrs, _round(y, Y.dtype.element_ty), mask, EVEN)


@triton.jit
def norm_fwd_wide_kernel(
    X,
    R,
    W,
    B,
    Y,
    H,
    Mean,
    Rstd,
    N,
    stride_x,
    stride_r,
    eps,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_RES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CACHE: tl.constexpr = 0,
    ALIGN: tl.constexpr = 1,
):
    """One program per row of any width: chunked single-pass statistics, then a reverse pass.
    CACHE (launch.FWD_CACHE): 1 stores y streaming (_store's STREAM), 2 also
    loads the first walk evict-last and the second evict-first."""
    N, stride_x, stride_r = _times(N, ALIGN), _times(stride_x, ALIGN), _times(stride_r, ALIGN)
    first: tl.constexpr = "evict_last" if CACHE >= 2 else None
    second: tl.constexpr = "evict_first" if CACHE >= 2 else None
    row = tl.program_id(0)
    rows = tl.full([1], 0, tl.int32) + row
    offs = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)
    count = tl.zeros([1], tl.float32)
    mean = tl.zeros([1], tl.float32)
    m2 = tl.zeros([1], tl.float32)  # sum of squares about the mean (LN) or about 0 (RMS)
    for c in range(0, n_chunks):
        cols = c * BLOCK_N + offs
        mask = (cols < N)[None, :]
        x = _load_row_tile(
            X, R, H, rows, cols, mask, stride_x, stride_r, N, HAS_RES, True, False, first
        )
        if IS_RMS:
            m2 += tl.sum(x * x, axis=1)
        else:
            n_c = tl.minimum(N - c * BLOCK_N, BLOCK_N).to(tl.float32)
            mean_c = tl.sum(x, axis=1) / n_c
            d = tl.where(mask, x - mean_c[:, None], 0.0)
            total = count + n_c
            delta = mean_c - mean
            mean += delta * (n_c / total)
            m2 += tl.sum(d * d, axis=1) + delta * delta * (count * n_c / total)
            count = total
    rstd = tl.rsqrt(m2 / N + eps)
    tl.store(Rstd + rows, rstd)
    if not IS_RMS:
        tl.store(Mean + rows, mean)
    for i in range(0, n_chunks):
        cols = (n_chunks - 1 - i) * BLOCK_N + offs
        col_ok = cols < N
        mask = col_ok[None, :]
        # x + residual is recomputed rather than re-read from h: h's stores by other threads of
        # this program are not guaranteed visible without a barrier.
        x = _load_row_tile(
            X, R, H, rows, cols, mask, stride_x, stride_r, N, HAS_RES, False, False, second
        )
        y = (x if IS_RMS else x - mean[:, None]) * rstd[:, None]
        if HAS_W:
            y = y * tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_B:
            y = y + tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        y_ptrs = Y + row.to(tl.int64) * N + cols[None, :]
        _store(y_ptrs, _round(y, Y.dtype.element_ty), mask, False, CACHE >= 1)


@triton.jit
def _median5(row_ptr, N):
    """The median of the row's elements at 0, N/4, N/2, 3N/4 and N - 1, in fp32: one or two
    outliers among them are never chosen. Sort the pairs (a, b) and (c, d); the lower of the two
    minimums has three elements above it, so it is not the median: drop it. The median is then
    the second smallest of the four left (its pair's maximum, the other pair, e): with its
    pair's maximum and e sorted into (lo, hi), min(max(lo, c), min(hi, d))."""
    a = tl.load(row_ptr).to(tl.float32)
    b = tl.load(row_ptr + N // 4).to(tl.float32)
    c = tl.load(row_ptr + N // 2).to(tl.float32)
    d = tl.load(row_ptr + N - N // 4 - 1).to(tl.float32)
    e = tl.load(row_ptr + N - 1).to(tl.float32)
    a, b = tl.minimum(a, b), tl.maximum(a, b)
    c, d = tl.minimum(c, d), tl.maximum(c, d)
    first_lower = a <= c  # drop the lower minimum; its pair's maximum stays
    kept_max = tl.where(first_lower, b, d)
    c, d = tl.where(first_lower, c, a), tl.where(first_lower, d, b)
    lo, hi = tl.minimum(kept_max, e), tl.maximum(kept_max, e)
    return tl.minimum(tl.maximum(lo, c), tl.minimum(hi, d))


@triton.jit
def norm_fwd_walk_kernel(
    X,
    R,
    W,
    B,
    Y,
    H,
    Mean,
    Rstd,
    N,
    stride_x,
    stride_r,
    eps,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_RES: tl.constexpr,
    CHUNK: tl.constexpr,
    CHUNKS: tl.constexpr,
    EVEN: tl.constexpr,
    UNROLL: tl.constexpr = 1,
    WELFORD: tl.constexpr = False,
    STREAM: tl.constexpr = False,
    HOLD: tl.constexpr = 0,
    ALIGN: tl.constexpr = 1,
):
    """One program per row, walking it in CHUNKS chunks: the sum (LayerNorm) or the sum of
    squares (RMSNorm) into an elementwise accumulator reduced once, LayerNorm's centred sum of
    squares the same way, then y. The later walks read the row again, from L1/L2: no register
    holds it across a reduction, so a program needs few registers and several rows are in flight
    on a multiprocessor (the shape of torch.compile's forward at these widths). UNROLL: chunks a
    loop step (CHUNKS: each walk's loads all in flight at once, at more registers); EVEN:
    N == HOLD + CHUNK * CHUNKS, no masks; STREAM (launch.FWD_CACHE): y stored streaming (_store).
    HOLD (a power of two below N, or 0): the row's first HOLD elements are loaded once and held in
    registers, and the chunks walk the rest from column HOLD on. Only the rest is read again, so
    the rows in flight take less of L2 (a row of 65,536 fp32 is 256 KB: 132 of them fill most of
    an H100's L2, and the later walks then miss)."""
    tl.static_assert(HOLD == 0 or not WELFORD, "a held part and the welford walk do not combine")
    N, stride_x, stride_r = _times(N, ALIGN), _times(stride_x, ALIGN), _times(stride_r, ALIGN)
    rows = tl.full([1], 0, tl.int32) + tl.program_id(0)
    offs = HOLD + tl.arange(0, CHUNK)
    acc = tl.zeros([1, CHUNK], tl.float32)
    if HOLD > 0:
        hcols = tl.arange(0, HOLD)
        hcol_ok = hcols < N  # all true (HOLD < N): the loads and stores go unmasked
        hmask = hcol_ok[None, :]
        held = _load_row_tile(  # read once: evict-first
            X, R, H, rows, hcols, hmask, stride_x, stride_r, N, HAS_RES, True, True, "evict_first"
        )
    m2 = tl.zeros([1, CHUNK], tl.float32)  # WELFORD: each lane's sum of squares about its mean
    if not IS_RMS:
        # the lanes walk x less a shift near the row's mean: their running means (WELFORD) or
        # sums then stay near 0 (a mean far from 0 would carry its rounding into M2 at first
        # order, and a plain fp32 sum's into the mean: a review found 1e4 + randn rows 2.3x
        # less accurate held than on the wide kernel's merged statistics, and 1e3 + randn rows
        # 2.2x less accurate walked plainly than on the block kernel). The shift is the median
        # of five elements spread over the row, not x[0]: an outlier x[0] (an outlier channel)
        # made every shifted element large, and y 40x less accurate than eager in fp32. Not the
        # first chunk's mean either (7dec0df): its reduction before the walk cost 15% at 65,536
        # bf16 on the H100. Five scalar loads, no reduction: but they too cost 14% there (the
        # A/B at 5c7ec22; 0-2% elsewhere), and a bf16 or fp16 y rounds the difference away, so
        # those take x[0] and fp32 alone the median.
        row_start = X + rows.to(tl.int64) * stride_x
        if X.dtype.element_ty == tl.float32:
            shift = _median5(row_start, N)[:, None]
        else:
            shift = tl.load(row_start).to(tl.float32)[:, None]
    for c in tl.range(0, CHUNKS, loop_unroll_factor=UNROLL):
        cols = c * CHUNK + offs
        mask = (cols < N)[None, :]
        x = _load_row_tile(
            X, R, H, rows, cols, mask, stride_x, stride_r, N, HAS_RES, True, EVEN, "evict_last"
        )
        if IS_RMS:
            acc += x * x
        elif WELFORD:
            # each lane's running mean (acc) and M2 over its elements so far, c + 1 of them
            # (only the last chunk can be ragged: a lane past N there keeps what it had)
            delta = (x - shift) - acc
            moved = acc + delta * (1.0 / (c + 1.0))
            grown = m2 + delta * ((x - shift) - moved)
            acc = moved if EVEN else tl.where(mask, moved, acc)
            m2 = grown if EVEN else tl.where(mask, grown, m2)
        else:
            acc += (x - shift) if EVEN else tl.where(mask, x - shift, 0.0)
    if IS_RMS:
        squares = tl.sum(acc, axis=1)
        if HOLD > 0:
            squares += tl.sum(held * held, axis=1)
        rstd = tl.rsqrt(squares / N + eps)
    elif WELFORD:
        # the lanes merged exactly (Chan): the mean of their means by count, then their M2s
        # plus each lane's count times its mean's squared distance from the row's
        counts = (CHUNKS - 1 + ((CHUNKS - 1) * CHUNK + offs < N).to(tl.float32))[None, :]
        shifted_mean = tl.sum(acc * counts, axis=1) / N
        d = acc - shifted_mean[:, None]
        rstd = tl.rsqrt(tl.sum(m2 + counts * d * d, axis=1) / N + eps)
        mean = shift.reshape([1]) + shifted_mean
        tl.store(Mean + rows, mean)
    else:
        shifted_sum = tl.sum(acc, axis=1)  # the lanes summed x less shift
        if HOLD > 0:
            shifted_sum += tl.sum(held - shift, axis=1)
        mean = shift.reshape([1]) + shifted_sum / N
        acc = tl.zeros([1, CHUNK], tl.float32)
        for c in tl.range(0, CHUNKS, loop_unroll_factor=UNROLL):
            cols = c * CHUNK + offs
            mask = (cols < N)[None, :]
            x = _load_row_tile(
                X, R, H, rows, cols, mask, stride_x, stride_r, N, HAS_RES, False, EVEN, "evict_last"
            )
            xc = x - mean[:, None]
            xc = xc if EVEN else tl.where(mask, xc, 0.0)
            acc += xc * xc
        centred = tl.sum(acc, axis=1)
        if HOLD > 0:
            held = held - mean[:, None]
            centred += tl.sum(held * held, axis=1)
        rstd = tl.rsqrt(centred / N + eps)
        tl.store(Mean + rows, mean)
    tl.store(Rstd + rows, rstd)
    if HOLD > 0:
        # the held part's y first: its registers are free for the last walk (LayerNorm's held
        # part is centred already). Names of their own: a name the walk's loop assigns must
        # keep its shape.
        y_held = held * rstd[:, None]
        if HAS_W:
            y_held = y_held * _load(W + hcols, hcol_ok, True, "evict_last").to(tl.float32)[None, :]
        if HAS_B:
            y_held = y_held + _load(B + hcols, hcol_ok, True, "evict_last").to(tl.float32)[None, :]
        held_ptrs = Y + rows.to(tl.int64)[:, None] * N + hcols[None, :]
        _store(held_ptrs, _round(y_held, Y.dtype.element_ty), hmask, True, STREAM)
    for c in tl.range(0, CHUNKS, loop_unroll_factor=UNROLL):
        cols = c * CHUNK + offs
        col_ok = cols < N
        mask = col_ok[None, :]
        # x + residual recomputed, not h read back (as in the wide kernel)
        x = _load_row_tile(
            X, R, H, rows, cols, mask, stride_x, stride_r, N, HAS_RES, False, EVEN, "evict_first"
        )
        y = (x if IS_RMS else x - mean[:, None]) * rstd[:, None]
        if HAS_W:
            y = y * _load(W + cols, col_ok, EVEN, "evict_last").to(tl.float32)[None, :]
        if HAS_B:
            y = y + _load(B + cols, col_ok, EVEN, "evict_last").to(tl.float32)[None, :]
        y_ptrs = Y + rows.to(tl.int64)[:, None] * N + cols[None, :]
        _store(y_ptrs, _round(y, Y.dtype.element_ty), mask, EVEN, STREAM)
