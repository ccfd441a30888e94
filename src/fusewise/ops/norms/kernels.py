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
  * walk (kernels_walk.py): one program per row walks it in a constant number of chunks,
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
    RAW: tl.constexpr = False,
):
    """Load x (or x + residual, rounded to the activation dtype and optionally stored) as fp32, or
    RAW in its own dtype."""
    rows64 = rows.to(tl.int64)
    x = _load(X + rows64[:, None] * stride_x + cols[None, :], mask, EVEN, POLICY)
    if HAS_RES:
        r = _load(R + rows64[:, None] * stride_r + cols[None, :], mask, EVEN, POLICY)
        h = _round(x.to(tl.float32) + r.to(tl.float32), X.dtype.element_ty)
        if STORE_H:
            _store(H + rows64[:, None] * N + cols[None, :], h, mask, EVEN)
        x = h
    if not RAW:
        x = x.to(tl.float32)
    return x


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
