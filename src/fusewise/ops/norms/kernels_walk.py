"""The norms' walking forward (launch.py takes it for settings.FWD_WALK's widths): one program per
row walks it in chunks, reducing once per walk and reading the row again from L1/L2 for the next
walk, so it holds no row in registers and several rows share a multiprocessor.

Each walk runs its whole chunks unmasked and, where the chunks overrun the row (EVEN false), a
last masked chunk after the loop: a width that is not a whole number of chunks (Falcon-180B's
14,848, Nemotron-4's 18,432, 65,528) pays the masks' compares and selects on one chunk, not on
all of them. LayerNorm's forward at 65,528 on an H100 went from 75.5% (bf16) and 78.8% (fp32) of
the copy ceiling, every chunk masked, to 81.0 and 87.1 (65,536, unmasked: 92 and 88).
"""

import triton
import triton.language as tl

from .._launch import round_to as _round
from .kernels import _load, _load_row_tile, _store, _times


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
def _first_walk_step(
    acc, m2, c, X, R, H, rows, offs, shift, N, stride_x, stride_r,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, WELFORD: tl.constexpr, CHUNK: tl.constexpr,
    EVEN: tl.constexpr,
):  # fmt: skip
    """Chunk c of the first walk into the lanes' accumulators: RMSNorm's squares, LayerNorm's
    sum of x less shift, or (WELFORD) each lane's running mean (acc) and M2 over its c + 1
    elements. EVEN: the chunk lies inside the row (no masks); a lane past N keeps what it had."""
    cols = c * CHUNK + offs
    mask = (cols < N)[None, :]
    x = _load_row_tile(
        X, R, H, rows, cols, mask, stride_x, stride_r, N, HAS_RES, True, EVEN, "evict_last"
    )
    if IS_RMS:
        acc += x * x
    elif WELFORD:
        delta = (x - shift) - acc
        moved = acc + delta * (1.0 / (c + 1.0))
        grown = m2 + delta * ((x - shift) - moved)
        acc = moved if EVEN else tl.where(mask, moved, acc)
        m2 = grown if EVEN else tl.where(mask, grown, m2)
    else:
        acc += (x - shift) if EVEN else tl.where(mask, x - shift, 0.0)
    return acc, m2


@triton.jit
def _centred_walk_step(
    acc, c, X, R, H, rows, offs, mean, N, stride_x, stride_r,
    HAS_RES: tl.constexpr, CHUNK: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    """Chunk c of LayerNorm's second walk: the squares of x less the row's mean into acc."""
    cols = c * CHUNK + offs
    mask = (cols < N)[None, :]
    x = _load_row_tile(
        X, R, H, rows, cols, mask, stride_x, stride_r, N, HAS_RES, False, EVEN, "evict_last"
    )
    xc = x - mean[:, None]
    xc = xc if EVEN else tl.where(mask, xc, 0.0)
    return acc + xc * xc


@triton.jit
def _output_walk_step(
    c, X, R, H, W, B, Y, rows, offs, mean, rstd, N, stride_x, stride_r,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr,
    CHUNK: tl.constexpr, EVEN: tl.constexpr, STREAM: tl.constexpr,
):  # fmt: skip
    """Chunk c of the last walk: y. x + residual is recomputed, not h read back (h's stores by
    other threads of this program are not guaranteed visible without a barrier)."""
    cols = c * CHUNK + offs
    col_ok = cols < N
    mask = col_ok[None, :]
    x = _load_row_tile(
        X, R, H, rows, cols, mask, stride_x, stride_r, N, HAS_RES, False, EVEN, "evict_first"
    )
    y = (x if IS_RMS else x - mean[:, None]) * rstd[:, None]
    _store_y(y, W, B, Y, rows, cols, col_ok, N, HAS_W, HAS_B, EVEN, STREAM)


@triton.jit
def _store_y(
    y, W, B, Y, rows, cols, col_ok, N,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, EVEN: tl.constexpr, STREAM: tl.constexpr,
):  # fmt: skip
    """y (normalised, fp32) times the weight plus the bias at cols, stored in Y's dtype."""
    if HAS_W:
        y = y * _load(W + cols, col_ok, EVEN, "evict_last").to(tl.float32)[None, :]
    if HAS_B:
        y = y + _load(B + cols, col_ok, EVEN, "evict_last").to(tl.float32)[None, :]
    y_ptrs = Y + rows.to(tl.int64)[:, None] * N + cols[None, :]
    _store(y_ptrs, _round(y, Y.dtype.element_ty), col_ok[None, :], EVEN, STREAM)


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
    on a multiprocessor (the shape of torch.compile's forward at these widths). UNROLL: whole
    chunks a loop step (launch.py passes all of them to unroll a walk: its loads all in flight
    at once, at more registers); EVEN: N == HOLD + CHUNK * CHUNKS, else the last chunk is masked
    and taken after the loop; STREAM (launch.FWD_CACHE): y stored streaming (_store).
    HOLD (a power of two below N, or 0): the row's first HOLD elements are loaded once and held in
    registers, and the chunks walk the rest from column HOLD on. Only the rest is read again, so
    the rows in flight take less of L2 (a row of 65,536 fp32 is 256 KB: 132 of them fill most of
    an H100's L2, and the later walks then miss)."""
    tl.static_assert(HOLD == 0 or not WELFORD, "a held part and the welford walk do not combine")
    N, stride_x, stride_r = _times(N, ALIGN), _times(stride_x, ALIGN), _times(stride_r, ALIGN)
    WHOLE: tl.constexpr = CHUNKS if EVEN else CHUNKS - 1  # chunks inside the row
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
    shift = tl.zeros([1, 1], tl.float32)
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
    for c in tl.range(0, WHOLE, loop_unroll_factor=UNROLL):
        acc, m2 = _first_walk_step(
            acc, m2, c, X, R, H, rows, offs, shift, N, stride_x, stride_r,
            IS_RMS, HAS_RES, WELFORD, CHUNK, True,
        )  # fmt: skip
    if not EVEN:
        acc, m2 = _first_walk_step(
            acc, m2, CHUNKS - 1, X, R, H, rows, offs, shift, N, stride_x, stride_r,
            IS_RMS, HAS_RES, WELFORD, CHUNK, False,
        )  # fmt: skip
    mean = tl.zeros([1], tl.float32)
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
        for c in tl.range(0, WHOLE, loop_unroll_factor=UNROLL):
            acc = _centred_walk_step(
                acc, c, X, R, H, rows, offs, mean, N, stride_x, stride_r, HAS_RES, CHUNK, True
            )
        if not EVEN:
            acc = _centred_walk_step(
                acc, CHUNKS - 1, X, R, H, rows, offs, mean, N, stride_x, stride_r,
                HAS_RES, CHUNK, False,
            )  # fmt: skip
        centred = tl.sum(acc, axis=1)
        if HOLD > 0:
            held = held - mean[:, None]
            centred += tl.sum(held * held, axis=1)
        rstd = tl.rsqrt(centred / N + eps)
        tl.store(Mean + rows, mean)
    tl.store(Rstd + rows, rstd)
    if HOLD > 0:
        # the held part's y first: its registers are free for the last walk (LayerNorm's held
        # part is centred already)
        _store_y(held * rstd[:, None], W, B, Y, rows, hcols, hcol_ok, N, HAS_W, HAS_B, True, STREAM)
    # (the constexprs passed one by one: unpacked from a tuple they reach the step as values,
    # and a weight or bias of None then fails to compile for the GPU)
    for c in tl.range(0, WHOLE, loop_unroll_factor=UNROLL):
        _output_walk_step(
            c, X, R, H, W, B, Y, rows, offs, mean, rstd, N, stride_x, stride_r,
            IS_RMS, HAS_W, HAS_B, HAS_RES, CHUNK, True, STREAM,
        )  # fmt: skip
    if not EVEN:
        _output_walk_step(
            CHUNKS - 1, X, R, H, W, B, Y, rows, offs, mean, rstd, N, stride_x, stride_r,
            IS_RMS, HAS_W, HAS_B, HAS_RES, CHUNK, False, STREAM,
        )  # fmt: skip
