"""The norms' cooperative forward: each row split into slices of columns, one program a slice,
the slices' statistics exchanged through global memory, with the cooperative backward's schedule,
sentinel and wait (kernels_bwd_coop's docstring).

Why: the walk (kernels.norm_fwd_walk_kernel) and the wide kernel read a row two or three times,
the later reads from L1/L2. Past ~32K elements the rows in flight no longer stay there (at
262,144 elements, 132 rows of 512 KB against 50 MB of L2) and the later reads go to memory:
61-91% of the copy ceiling at 65,536 and 262,144 (results/README.md, 35509e9). Here a program
reads its slice a second time a moment after the first, from L1 or L2 (a few MB in flight on
the whole GPU), so each element comes from memory once.

For a group of ROWS rows every part
  1. (publish) reads its slice of x (add+RMSNorm: x + residual, writing h), writes its
     statistics over the sentinel: RMSNorm the sum of squares; LayerNorm the sum and the sum of
     squares about the slice's own mean, merged by the readers with Chan's update, as the wide
     kernel merges its chunks and TransformerEngine its CTAs (accuracy: as the wide kernel's,
     tests/test_norm_coop_fwd.py; a shift by the row's first element was more accurate for rows
     far from zero and far less for an outlier there, a review's finding);
  2. (finish) waits for every slice's statistics, merges them into the row's mean and rstd,
     reads its slice again and writes y; part 0 writes mean and rstd.
AHEAD, EARLY and PREFETCH as in the backward. A wait past SPIN_LIMIT writes NaN.
"""

import triton
import triton.language as tl

from .._launch import launch, next_power_of_2, round_to
from .kernels import _load_row_tile
from .kernels_bwd_coop import (
    _program_columns,
    _slice_sums,
    _wait_for_sums,
    compile_options,
    interpreted_on,
    schedule,
    unpublished_sums,
)


@triton.jit
def _load_x(X, R, H, group, cols, col_ok, M, N, stride_x, stride_r, HAS_RES: tl.constexpr,
            STORE_H: tl.constexpr, ROWS: tl.constexpr, POLICY: tl.constexpr):  # fmt: skip
    """This program's [ROWS, columns] of x (x + residual, rounded, h written if STORE_H) in fp32,
    0 outside the rows and columns."""
    rows = group * ROWS + tl.arange(0, ROWS)  # groups past the last row are masked off
    mask = (rows < M)[:, None] & col_ok[None, :]
    return _load_row_tile(
        X, R, H, rows, cols, mask, stride_x, stride_r, N, HAS_RES, STORE_H, False, POLICY
    )  # fmt: skip


@triton.jit
def _columns(slices, N, SLICE: tl.constexpr):
    """How many of the row's columns each slice holds (the last ragged, those past the row 0),
    in fp32."""
    return tl.minimum(tl.maximum(N - slices * SLICE, 0), SLICE).to(tl.float32)


@triton.jit
def _publish(x, Sums, group, part, col_ok, M, N, IS_RMS: tl.constexpr, ROWS: tl.constexpr,
             K: tl.constexpr, SLICE: tl.constexpr, SLICES: tl.constexpr):  # fmt: skip
    """Step 1: this program's slices' statistics of the group's rows written over the sentinel
    (Sums[j, slice, row]; one 32-bit word each)."""
    rows = group * ROWS + tl.arange(0, ROWS)
    row_ok = (rows < M)[:, None]
    slices = part * K + tl.arange(0, K)
    at = slices[None, :] * M + rows[:, None]
    if IS_RMS:
        tl.store(Sums + at, _slice_sums(x * x, ROWS, K, SLICE), mask=row_ok)
    else:
        total = _slice_sums(x, ROWS, K, SLICE)  # [ROWS, K]
        mean = total / tl.maximum(_columns(slices, N, SLICE), 1.0)[None, :]
        if K == 1:
            centred = x - mean
        else:  # the interpreter: K slices in this program, each about its own mean
            centred = tl.reshape(tl.reshape(x, [ROWS, K, SLICE]) - mean[:, :, None],
                                 [ROWS, K * SLICE])  # fmt: skip
        centred = tl.where(row_ok & col_ok[None, :], centred, 0.0)
        tl.store(Sums + at, total, mask=row_ok)
        squares = _slice_sums(centred * centred, ROWS, K, SLICE)
        tl.store(Sums + SLICES * M + at, squares, mask=row_ok)


@triton.jit
def _finish(
    X, R, W, B, Y, Mean, Rstd, Sums, group, part, cols, col_ok, M, N, stride_x, stride_r, eps,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr,
    ROWS: tl.constexpr, SLICE: tl.constexpr, SLICES: tl.constexpr, SLICES_BLOCK: tl.constexpr,
    EARLY: tl.constexpr,
):  # fmt: skip
    """Step 2: every slice's statistics merged into the rows' mean and rstd, x read again (from
    L1/L2; EARLY: before the wait), y written."""
    # evict_first: another policy than the first read's, so the compiler cannot take the two
    # reads for one; the tile is not read again
    if EARLY:
        x = _load_x(X, R, Y, group, cols, col_ok, M, N, stride_x, stride_r, HAS_RES, False, ROWS,
                    "evict_first")  # fmt: skip
    s1, s2, published = _wait_for_sums(Sums, group, M, IS_RMS, ROWS, SLICES, SLICES_BLOCK)
    if not EARLY:
        x = _load_x(X, R, Y, group, cols, col_ok, M, N, stride_x, stride_r, HAS_RES, False, ROWS,
                    "evict_first")  # fmt: skip
    if IS_RMS:
        rstd = tl.rsqrt(tl.sum(s1, axis=1) / N + eps)
        y = x * rstd[:, None]
    else:
        # Chan: the row's M2 is the slices' M2s plus each slice's columns times its mean's squared
        # distance from the row's (a slice of no columns adds 0)
        counts = _columns(tl.arange(0, SLICES_BLOCK), N, SLICE)[None, :]
        mean = tl.sum(s1, axis=1) / N
        apart = s1 / tl.maximum(counts, 1.0) - mean[:, None]
        rstd = tl.rsqrt(tl.sum(s2 + counts * apart * apart, axis=1) / N + eps)
        y = (x - mean[:, None]) * rstd[:, None]
    # past SPIN_LIMIT: NaN, never a silently wrong y
    rstd = tl.where(published, rstd, float("nan"))
    y = tl.where(published, y, float("nan"))
    if HAS_W:
        w = tl.load(W + cols, mask=col_ok, other=0.0, eviction_policy="evict_last")
        y = y * w.to(tl.float32)[None, :]
    if HAS_B:
        b = tl.load(B + cols, mask=col_ok, other=0.0, eviction_policy="evict_last")
        y = y + b.to(tl.float32)[None, :]
    rows = group * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    mask = row_ok[:, None] & col_ok[None, :]
    y_ptrs = Y + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(y_ptrs, round_to(y, Y.dtype.element_ty), mask=mask)
    if part == 0:
        tl.store(Rstd + rows, rstd, mask=row_ok)
        if not IS_RMS:
            tl.store(Mean + rows, mean, mask=row_ok)


@triton.jit
def norm_fwd_coop_kernel(
    X, R, W, B, Y, H, Mean, Rstd, Sums, M, N, stride_x, stride_r, eps, lanes, groups_per_lane,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr,
    ROWS: tl.constexpr, SLICE: tl.constexpr, K: tl.constexpr, SLICES: tl.constexpr,
    SLICES_BLOCK: tl.constexpr, AHEAD: tl.constexpr, EARLY: tl.constexpr,
    PREFETCH: tl.constexpr,
):  # fmt: skip
    """Program (lane, part) of the cooperative forward (the module's docstring); its columns are
    K slices of SLICE from part·K·SLICE."""
    lane, part, cols, col_ok = _program_columns(N, SLICE, K, SLICES)
    publishing = lane
    if PREFETCH:
        nxt = _load_x(X, R, H, publishing, cols, col_ok, M, N, stride_x, stride_r, HAS_RES, True,
                      ROWS, "evict_last")  # fmt: skip
    for i in range(0, groups_per_lane + (1 if AHEAD else 0)):
        if PREFETCH:
            x = nxt
            nxt = _load_x(X, R, H, publishing + lanes, cols, col_ok, M, N, stride_x, stride_r,
                          HAS_RES, True, ROWS, "evict_last")  # fmt: skip
        else:
            x = _load_x(X, R, H, publishing, cols, col_ok, M, N, stride_x, stride_r, HAS_RES, True,
                        ROWS, "evict_last")  # fmt: skip
        _publish(x, Sums, publishing, part, col_ok, M, N, IS_RMS, ROWS, K, SLICE, SLICES)
        publishing += lanes
        if not AHEAD or i > 0:
            _finish(
                X, R, W, B, Y, Mean, Rstd, Sums, publishing - lanes * (2 if AHEAD else 1), part,
                cols, col_ok, M, N, stride_x, stride_r, eps, IS_RMS, HAS_W, HAS_B, HAS_RES, ROWS,
                SLICE, SLICES, SLICES_BLOCK, EARLY,
            )  # fmt: skip


def norm_forward_coop(x, r, weight, bias, y, h, mean, rstd, eps, flags, setting, wave):
    """Launch the cooperative forward (settings.Coop `setting`) into y, h, mean, rstd (the
    buffers launch.norm_forward passes its kernels: h and mean stand-ins where absent). flags:
    (is_rms, has_w, has_b, has_res). `wave`: the multiprocessors (kernels_bwd_coop.schedule)."""
    m, n = x.shape
    interpreted = interpreted_on(x.device)
    plan = schedule(m, n, setting, wave, interpreted)
    is_rms = flags[0]
    # the groups past the last row that AHEAD publishes write nothing (their rows are masked off)
    sums = unpublished_sums((1 if is_rms else 2) * plan.slices * m, x.device)
    launch(
        norm_fwd_coop_kernel,
        (plan.lanes * plan.parts,),
        *(x, r, weight, bias, y, h, mean, rstd, sums, m, n, x.stride(0), r.stride(0), eps),
        *(plan.lanes, plan.per_lane),
        **dict(zip(("IS_RMS", "HAS_W", "HAS_B", "HAS_RES"), flags)),
        ROWS=setting.rows,
        SLICE=plan.slice,
        K=plan.k,
        SLICES=plan.slices,
        SLICES_BLOCK=next_power_of_2(plan.slices),
        AHEAD=setting.ahead,
        EARLY=setting.early,
        PREFETCH=setting.prefetch,
        **compile_options(setting, interpreted),
    )
