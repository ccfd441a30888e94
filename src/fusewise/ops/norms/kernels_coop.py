"""The norms' forward for rows too wide for one program's registers: several programs to a row.

The wide kernel (kernels.py) has one program walk a row twice, and a row of 262,144 bf16 elements
is 512 KB: with a program on each of 132 multiprocessors, 66 MB of rows are in flight, more than
the 50 MB of L2, so the second walk reads most of the row from DRAM again. That is 3 * M * N
bytes of traffic for a byte model of 2 * M * N, and it measured 65-69% of the copy ceiling.

Here a row is cut into PIECES pieces of PIECE elements, one program each. A program loads its
piece once and holds it in registers, publishes its piece's statistics (the mean and the centred
sum of squares: Chan's parallel update merges them without cancellation), waits for the row's
other pieces, merges all of them in the same order (so every piece of a row gets bit-identical
mean and rstd) and writes its part of y from the registers: x is read once, y written once.

Waiting for other programs needs them to run at the same time as the waiter. Programs take their
(row, piece) from a ticket counter in the order they start, not from program_id: every ticket
below the highest one handed out belongs to a program that started, so every row but the newest
one has all of its pieces started and will finish, freeing room for the next programs. Only the
newest row can wait on programs not yet started, and it cannot block them as long as PIECES
programs fit on the GPU at once (launch_coop.coop_pieces keeps PIECES to half the
multiprocessors: a program of at most 32 warps fits on any, and other work may hold some). This
is the forward-progress argument of single-pass scans (decoupled look-back).

How much a program holds matters: its ticket, wait and merge are a fixed cost, paid while its
multiprocessor has nothing else to load (32 warps fill its registers). Pieces of 128 KB (32,768
fp32 elements) made 85-98% of the copy ceiling on an H100, pieces of 64 KB (32,768 bf16 ones,
held in fp32 registers) 68-81%. NARROW holds 16-bit inputs as they are, two to a register, and
converts them at each use: 65,536 bf16 elements, 128 KB, on 32 warps. Between the uses an opaque
step (_opaque) keeps the compiler from merging the conversions into one fp32 copy held across
the wait, which would spill. ptxas for sm_90a, RMSNorm: 184 and 248 bytes a thread without it
under Triton 3.6 and 3.9 (as much as held in fp32), 0 and 4 with it. LayerNorm, whose statistics
use x twice before the wait, still spills 32 and 220 with it, and is not shipped narrow. Two
programs share a multiprocessor at 32 registers a thread on 32 warps (Coop.registers): RMSNorm
bf16 narrow on pieces of 32,768 and fp32 on 16,384 fit with no spill under both Tritons, and made
86.9-90.0% and 91.5-93.7% on an H100, from 75.2-77.7 and 87.0-90.7 (settings.FWD_COOP).

PHASE (constexpr): 0, one launch as above (a GPU); 1 and 2, two launches with no waiting: 1
publishes the statistics, 2 merges them and writes y from x read again. Triton's interpreter runs
programs one after another, so a waiting program would wait for ever there: tests on the CPU run
phases 1 and 2, which share every step but the wait with phase 0.
"""

import triton
import triton.language as tl

from .._launch import round_to as _round
from .kernels import _load_row_tile, _store, _times


@triton.jit
def _piece_statistics(
    x, mask, n_p, IS_RMS: tl.constexpr, NARROW: tl.constexpr, PHASE: tl.constexpr
):
    """A piece's (mean, sum of squares): about its mean for LayerNorm, about 0 for RMSNorm. x:
    fp32, or 16-bit (NARROW), converted at each use."""
    if IS_RMS:
        xf = x.to(tl.float32)
        return 0.0, tl.sum(tl.sum(xf * xf, axis=1), axis=0)
    mean_p = tl.sum(tl.sum(x.to(tl.float32), axis=1), axis=0) / n_p
    x = _opaque(x, NARROW, PHASE)
    d = tl.where(mask, x.to(tl.float32) - mean_p, 0.0)
    return mean_p, tl.sum(tl.sum(d * d, axis=1), axis=0)


@triton.jit
def _merged_statistics(
    Part, row, N, eps, IS_RMS: tl.constexpr, PIECE: tl.constexpr, PIECES: tl.constexpr
):
    """(mean, rstd) of a row from its pieces' statistics, in piece order. Loaded from L2 (.cg):
    other multiprocessors wrote them, and this one's L1 must not answer."""
    p = tl.arange(0, triton.next_power_of_2(PIECES))
    p_ok = p < PIECES
    part = Part + row.to(tl.int64) * (2 * PIECES) + 2 * p
    m2s = tl.load(part + 1, mask=p_ok, other=0.0, cache_modifier=".cg")
    if IS_RMS:
        return 0.0, tl.rsqrt(tl.sum(m2s, axis=0) / N + eps)
    means = tl.load(part, mask=p_ok, other=0.0, cache_modifier=".cg")
    counts = tl.where(p_ok, tl.minimum(N - p * PIECE, PIECE), 0).to(tl.float32)
    mean = tl.sum(counts * means, axis=0) / N
    dm = means - mean
    m2 = tl.sum(m2s + counts * dm * dm, axis=0)
    return mean, tl.rsqrt(m2 / N + eps)


@triton.jit
def _opaque(x, NARROW: tl.constexpr, PHASE: tl.constexpr):
    """x (16-bit) unchanged, through a step the compiler cannot see through, move or merge
    (volatile inline PTX: NVIDIA GPUs; the interpreter runs none). Conversions of x to fp32 on
    its two sides are then two conversions, not one fp32 copy kept live: that copy would take
    twice the registers of the 16-bit x that NARROW holds."""
    if NARROW and PHASE == 0:
        bits = tl.inline_asm_elementwise(
            "mov.b32 $0, $1;", "=r,r", [x.to(tl.int16, bitcast=True)], dtype=tl.int16,
            is_pure=False, pack=2,
        )  # fmt: skip
        x = bits.to(x.dtype, bitcast=True)
    return x


@triton.jit
def norm_fwd_coop_kernel(
    X,
    R,
    W,
    B,
    Y,
    H,
    Mean,
    Rstd,
    Part,
    Sync,
    N,
    stride_x,
    stride_r,
    eps,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_RES: tl.constexpr,
    PIECE: tl.constexpr,
    PIECES: tl.constexpr,
    PHASE: tl.constexpr = 0,
    ALIGN: tl.constexpr = 1,
    NARROW: tl.constexpr = False,
):
    """Part: fp32 [M, PIECES, 2], each piece's (mean, sum of squares). Sync: int32 [1 + M], zeros
    (PHASE 0: the ticket counter, then each row's count of published pieces; unused otherwise).
    PIECES * PIECE >= N > (PIECES - 1) * PIECE. NARROW: X (and R) 16-bit, held as loaded."""
    N, stride_x, stride_r = _times(N, ALIGN), _times(stride_x, ALIGN), _times(stride_r, ALIGN)
    if PHASE == 0:
        ticket = tl.atomic_add(Sync, 1)
    else:
        ticket = tl.program_id(0)
    row = ticket // PIECES
    piece = ticket % PIECES
    rows = tl.full([1], 0, tl.int32) + row
    # the piece's columns from a scalar start added to the pointers: a vector of column indices
    # would stay live until y's store, and spill (ptxas, pieces of 32,768 on 32 warps)
    start = piece * PIECE
    cols = tl.arange(0, PIECE)
    held = tl.minimum(N - start, PIECE)  # this piece's columns
    col_ok = cols < held
    mask = col_ok[None, :]
    # evict-first: each piece is read once (PHASE 2 reads it again, but only on the interpreter)
    x = _load_row_tile(
        X + start, R + start, H + start, rows, cols, mask, stride_x, stride_r, N, HAS_RES,
        PHASE < 2, False, "evict_first", NARROW,
    )  # fmt: skip
    if PHASE < 2:
        n_p = held.to(tl.float32)
        mean_p, m2_p = _piece_statistics(x, mask, n_p, IS_RMS, NARROW, PHASE)
        part = Part + row.to(tl.int64) * (2 * PIECES) + 2 * piece
        tl.store(part, mean_p)
        tl.store(part + 1, m2_p)
    if PHASE == 1:
        return
    if PHASE == 0:
        # every thread's stores before the release that publishes them; the acquiring loads
        # below see every piece's statistics once the count reaches PIECES
        tl.debug_barrier()
        arrived = tl.atomic_add(Sync + 1 + row, 1, sem="acq_rel") + 1
        while arrived < PIECES:
            arrived = tl.atomic_add(Sync + 1 + row, 0, sem="acquire")
    mean, rstd = _merged_statistics(Part, row, N, eps, IS_RMS, PIECE, PIECES)
    first = (tl.full([1], 0, tl.int32) + piece) == 0
    tl.store(Rstd + rows, tl.full([1], 0.0, tl.float32) + rstd, mask=first)
    if not IS_RMS:
        tl.store(Mean + rows, tl.full([1], 0.0, tl.float32) + mean, mask=first)
    x = _opaque(x, NARROW, PHASE).to(tl.float32)
    y = (x if IS_RMS else x - mean) * rstd
    if HAS_W:
        y = y * tl.load(W + start + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        y = y + tl.load(B + start + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = Y + (row.to(tl.int64) * N + start) + cols[None, :]
    _store(y_ptrs, _round(y, Y.dtype.element_ty), mask, False, True)
