"""The norms' cooperative backward: each row split into slices of columns, one program a slice,
the slices' partial row sums exchanged through global memory (TransformerEngine's CTAS_PER_ROW
design), so that a row too wide for one program to hold with the weight-gradient accumulators
is still read once from memory.

Why: the fused kernel (kernels_bwd.norm_bwd_block_kernel) holds a whole row's x, dy and the
weight- and bias-gradient accumulators in one program's registers; past ~8,192 elements that is
one program of 32 warps a multiprocessor, which idles on every load and every row sum (LayerNorm
bf16 at 16,384: 49% of the copy ceiling), and the split kernels read x and dy twice (43-55%). Here a
program holds SLICE columns of the accumulators, several programs share a multiprocessor, and a
row's slices run at once on several multiprocessors.

Schedule: a grid of lanes × parts, part-fastest (a lane's programs are consecutive and so
dispatched together). A lane walks row groups (ROWS rows) g = lane, lane + lanes, ...; for each,
every part
  1. (publish) reads its columns of the group's x and dy, adds dy·x̂ and dy to its accumulators
     and writes its per-slice sums Σx̂·w·dy and Σw·dy to Sums[j, slice, row], which the host
     filled with a sentinel no arithmetic writes;
  2. (finish) reads its x and dy again (from L1 or L2: read a moment before), reads every
     slice's sums (volatile: from L2, never a stale L1 line) until none is the sentinel, and
     writes dx.
No counter, fence or barrier: each sum is one word, seen whole or not at all, and a reader
needs nothing else another program wrote. AHEAD publishes group g + lanes before finishing g,
so the wait overlaps the next loads; PREFETCH issues a group's loads one publish earlier, so
that memory's latency is off the chain of dependent steps.
Deadlock-free without co-residency of the whole grid: blocks are dispatched in order, so a
waiting program's lane-mates are resident or about to be (the host keeps a lane within one wave).
The wait is bounded all the same (SPIN_LIMIT reads, about a second): past it dx is written
NaN, never a silently wrong value. Under Triton's interpreter programs run one after another,
so there one program takes a whole row (K = SLICES slices a program) and never waits.

The weight gradients: each program's fp32 accumulators summed over rows into row `lane` of
DW_part / DB_part at the end (its columns), then sum_partials_kernel, as the other kernels.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._launch import INTERPRETED, cdiv, launch, next_power_of_2
from .kernels_bwd import _accumulate, _store_dx, _store_partials, _xhat

SPIN_LIMIT = tl.constexpr(1 << 20)  # reads of a group's sums before giving up (~1 s; a real
# wait is microseconds)
# Sums is filled with this before the launch, a word no fp32 arithmetic writes (a signalling NaN:
# NaN results are the GPU's canonical 0x7FFFFFFF), so a sum still equal to it is unpublished.
SENTINEL_BITS = 0x7FBADBAD
SENTINEL = tl.constexpr(SENTINEL_BITS)


@triton.jit
def _slice_sums(v, ROWS: tl.constexpr, K: tl.constexpr, SLICE: tl.constexpr):
    """[ROWS, K·SLICE] -> [ROWS, K]: the sum over each slice's columns."""
    if K == 1:
        return tl.sum(v, axis=1)[:, None]
    return tl.sum(tl.reshape(v, [ROWS, K, SLICE]), axis=2)


@triton.jit
def _program_columns(N, SLICE: tl.constexpr, K: tl.constexpr, SLICES: tl.constexpr):
    """This program's lane and part (the grid is lanes × parts, part-fastest), its columns (K
    slices of SLICE from part·K·SLICE) and which of them lie in the row."""
    PARTS: tl.constexpr = SLICES // K
    pid = tl.program_id(0)
    cols = (pid % PARTS) * (K * SLICE) + tl.arange(0, K * SLICE)
    return pid // PARTS, pid % PARTS, cols, cols < N


@triton.jit
def _load_group(X, DY, Mean, Rstd, group, cols, col_ok, M, stride_x, stride_dy,
                EVICT: tl.constexpr, IS_RMS: tl.constexpr, ROWS: tl.constexpr):  # fmt: skip
    """This program's x and dy of the group's rows (in their dtype), the rows' mean and rstd."""
    rows = group * ROWS + tl.arange(0, ROWS)  # groups past the last row are masked off
    row_ok = rows < M
    mask = row_ok[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0, eviction_policy=EVICT)
    dy = tl.load(
        DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0, eviction_policy=EVICT
    )
    rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
    mean = rstd if IS_RMS else tl.load(Mean + rows, mask=row_ok, other=0.0)
    return x, dy, mean, rstd


@triton.jit
def _prepare(loaded, group, col_ok, M, IS_RMS: tl.constexpr, ROWS: tl.constexpr):
    """The group's rows (int32), their mask over the tile, x̂ and dy in fp32, rstd."""
    x, dy, mean, rstd = loaded
    rows = group * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    mask = row_ok[:, None] & col_ok[None, :]
    xhat = _xhat(x.to(tl.float32), mean, rstd, mask, IS_RMS)
    return rows, row_ok, mask, xhat, dy.to(tl.float32), rstd


@triton.jit
def _publish(
    loaded, Sums, w, dw_acc, db_acc, group, part, col_ok, M, IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ROWS: tl.constexpr, K: tl.constexpr,
    SLICE: tl.constexpr, SLICES: tl.constexpr,
):  # fmt: skip
    """Step 1 for a group (`loaded` by _load_group): the accumulators updated, this program's
    slice sums written over the sentinel (one 32-bit word each: a reader sees the old word or the
    new, never half)."""
    rows, row_ok, mask, xhat, dy, rstd = _prepare(loaded, group, col_ok, M, IS_RMS, ROWS)
    wdy = dy * w.to(tl.float32)[None, :] if HAS_W else dy
    at = (part * K + tl.arange(0, K))[None, :] * M + rows[:, None]  # Sums[j, slice, row]
    tl.store(Sums + at, _slice_sums(xhat * wdy, ROWS, K, SLICE), mask=row_ok[:, None])
    if not IS_RMS:
        tl.store(Sums + SLICES * M + at, _slice_sums(wdy, ROWS, K, SLICE), mask=row_ok[:, None])
    return _accumulate(dw_acc, db_acc, dy, xhat, HAS_W, HAS_B)


@triton.jit
def _unpublished(s1, s2, IS_RMS: tl.constexpr):
    """How many of the sums read are still the sentinel."""
    waiting = tl.sum(tl.where(s1.to(tl.int32, bitcast=True) == SENTINEL, 1, 0))
    if not IS_RMS:
        waiting += tl.sum(tl.where(s2.to(tl.int32, bitcast=True) == SENTINEL, 1, 0))
    return waiting


@triton.jit
def _wait_for_sums(
    Sums, group, M, IS_RMS: tl.constexpr, ROWS: tl.constexpr, SLICES: tl.constexpr,
    SLICES_BLOCK: tl.constexpr,
):  # fmt: skip
    """Every slice's sums of the group's rows, [ROWS, SLICES_BLOCK] (0 past the last slice or
    row; s2 is s1 for RMS), read until none is the sentinel or SPIN_LIMIT reads have passed; and
    whether all were published (else the caller writes NaN)."""
    rows = group * ROWS + tl.arange(0, ROWS)
    slices = tl.arange(0, SLICES_BLOCK)
    at = slices[None, :] * M + rows[:, None]
    ok = (rows < M)[:, None] & (slices < SLICES)[None, :]
    # volatile: every read goes to L2 (where the other programs' stores land), none from L1
    s1 = tl.load(Sums + at, mask=ok, other=0.0, volatile=True)
    s2 = s1 if IS_RMS else tl.load(Sums + SLICES * M + at, mask=ok, other=0.0, volatile=True)
    spins = 0
    while (_unpublished(s1, s2, IS_RMS) > 0) & (spins < SPIN_LIMIT):
        s1 = tl.load(Sums + at, mask=ok, other=0.0, volatile=True)
        if not IS_RMS:
            s2 = tl.load(Sums + SLICES * M + at, mask=ok, other=0.0, volatile=True)
        spins += 1
    return s1, s2, _unpublished(s1, s2, IS_RMS) == 0


@triton.jit
def _finish(
    X, DY, DH, DX, Mean, Rstd, Sums, w, group, cols, col_ok, M, N, stride_x, stride_dy,
    stride_dh, IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_DH: tl.constexpr,
    ROWS: tl.constexpr, SLICES: tl.constexpr, SLICES_BLOCK: tl.constexpr, EARLY: tl.constexpr,
):  # fmt: skip
    """Step 2 for a group: every slice's sums read until none is the sentinel, x and dy read
    again (EARLY: before the wait, their loads in flight during it, held in registers across
    it), then this program's dx."""
    # evict_first: another eviction policy than the first read's, so that the compiler cannot
    # take the two reads for one; and the tile is not read again
    if EARLY:
        again = _load_group(
            X, DY, Mean, Rstd, group, cols, col_ok, M, stride_x, stride_dy, "evict_first",
            IS_RMS, ROWS,
        )  # fmt: skip
    s1, s2, published = _wait_for_sums(Sums, group, M, IS_RMS, ROWS, SLICES, SLICES_BLOCK)
    if not EARLY:
        again = _load_group(
            X, DY, Mean, Rstd, group, cols, col_ok, M, stride_x, stride_dy, "evict_first",
            IS_RMS, ROWS,
        )  # fmt: skip
    rows, row_ok, mask, xhat, dy, rstd = _prepare(again, group, col_ok, M, IS_RMS, ROWS)
    wdy = dy * w.to(tl.float32)[None, :] if HAS_W else dy
    dx = wdy - xhat * (tl.sum(s1, axis=1) / N)[:, None]
    if not IS_RMS:
        dx -= (tl.sum(s2, axis=1) / N)[:, None]
    # past SPIN_LIMIT: NaN, never a silently wrong dx
    dx = tl.where(published, dx * rstd[:, None], float("nan"))
    _store_dx(dx, DH, DX, rows.to(tl.int64)[:, None], cols, mask, stride_dh, N, HAS_DH)


@triton.jit
def norm_bwd_coop_kernel(
    X, W, DY, DH, DX, Mean, Rstd, Sums, DW_part, DB_part, M, N, stride_x, stride_dy,
    stride_dh, lanes, groups_per_lane, IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
    HAS_B: tl.constexpr, HAS_DH: tl.constexpr, ROWS: tl.constexpr, SLICE: tl.constexpr,
    K: tl.constexpr, SLICES: tl.constexpr, SLICES_BLOCK: tl.constexpr, AHEAD: tl.constexpr,
    EARLY: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """Program (lane, part) of the cooperative backward (the module's docstring); its columns
    are K slices of SLICE from part·K·SLICE."""
    lane, part, cols, col_ok = _program_columns(N, SLICE, K, SLICES)
    w = tl.load(W + cols, mask=col_ok, other=0.0) if HAS_W else None
    # whole tiles accumulated, reduced over rows once at the end (see norm_bwd_block_kernel)
    dw_acc = tl.zeros([ROWS, K * SLICE], tl.float32)
    db_acc = tl.zeros([ROWS, K * SLICE], tl.float32)
    # AHEAD: publishing runs one group ahead of finishing (the last publish past the last row:
    # masked off); PREFETCH: loading one group ahead of publishing
    publishing = lane
    if PREFETCH:
        nxt = _load_group(
            X, DY, Mean, Rstd, publishing, cols, col_ok, M, stride_x, stride_dy, "evict_last",
            IS_RMS, ROWS,
        )  # fmt: skip
    for i in range(0, groups_per_lane + (1 if AHEAD else 0)):
        if PREFETCH:
            loaded = nxt
            nxt = _load_group(
                X, DY, Mean, Rstd, publishing + lanes, cols, col_ok, M, stride_x, stride_dy,
                "evict_last", IS_RMS, ROWS,
            )  # fmt: skip
        else:
            loaded = _load_group(
                X, DY, Mean, Rstd, publishing, cols, col_ok, M, stride_x, stride_dy,
                "evict_last", IS_RMS, ROWS,
            )  # fmt: skip
        dw_acc, db_acc = _publish(
            loaded, Sums, w, dw_acc, db_acc, publishing, part, col_ok, M, IS_RMS, HAS_W, HAS_B,
            ROWS, K, SLICE, SLICES,
        )  # fmt: skip
        publishing += lanes
        if not AHEAD or i > 0:
            _finish(
                X, DY, DH, DX, Mean, Rstd, Sums, w, publishing - lanes * (2 if AHEAD else 1),
                cols, col_ok, M, N, stride_x, stride_dy, stride_dh, IS_RMS, HAS_W, HAS_DH, ROWS,
                SLICES, SLICES_BLOCK, EARLY,
            )  # fmt: skip
    _store_partials(DW_part, DB_part, lane, cols, col_ok, N, dw_acc, db_acc, HAS_W, HAS_B)


class Schedule(NamedTuple):
    slice: int  # columns a slice
    slices: int  # slices a row
    k: int  # slices a program
    parts: int  # programs a lane
    lanes: int
    per_lane: int  # row groups a lane


def _slicing(n: int, setting, interpreted: bool) -> tuple[int, int, int]:
    """(columns a slice, slices a row, slices a program) for rows of n elements."""
    slice_ = min(setting.slice, next_power_of_2(n))
    slices = cdiv(n, slice_)
    if interpreted:
        # the interpreter runs programs one after another: one program takes the whole row, its
        # columns a power of two (the slices past the row's end are masked off)
        slices = next_power_of_2(slices)
        return slice_, slices, slices
    return slice_, slices, 1


def interpreted_on(device) -> bool:
    """Whether the kernel runs under Triton's interpreter for tensors on `device`."""
    return bool(INTERPRETED.value) or device.type != "cuda"


def fits(n: int, setting, wave: int, interpreted: bool) -> bool:
    """Whether a row's programs can all be resident at once (setting.per_sm on each of `wave`
    multiprocessors): else they could wait on each other forever. A setting tuned on an H200
    may not fit a GPU of fewer multiprocessors (a MIG slice); the launcher then takes the
    other kernels."""
    if n < 1:  # rows of no elements: no slices (the other kernels take them)
        return False
    _, slices, k = _slicing(n, setting, interpreted)
    return slices // k <= setting.per_sm * wave


def pick(table: dict, op: str, x, wave: int):
    """The setting of `table` (launch.FWD_COOP or BWD_COOP, by (op, bytes per element); read on
    every call, so a table replaced is seen) for x's width, if it fits `wave`
    multiprocessors (`fits`); else None, and the other kernels take the rows."""
    n = x.shape[1]
    entries = table.get((op, x.element_size()), ())
    coop = next((c for c in entries if c.narrowest <= n <= c.widest), None)
    return coop if coop is not None and fits(n, coop, wave, interpreted_on(x.device)) else None


def schedule(m: int, n: int, setting, wave: int, interpreted: bool) -> Schedule:
    """How the cooperative backward (settings.Coop `setting`) splits [m, n] rows; `wave`: the
    multiprocessors, times setting.per_sm the programs resident at once. Raises ValueError for a
    setting the kernel cannot take, or one whose row does not fit (`fits`)."""
    s = setting
    if s.slice & (s.slice - 1) or s.rows & (s.rows - 1) or s.per_sm * s.warps > 64:
        raise ValueError(
            f"cooperative norm kernel: {s} needs slice and rows powers of two and per_sm x"
            " warps <= 64 (a multiprocessor's 2048 threads)"
        )
    slice_, slices, k = _slicing(n, setting, interpreted)
    parts = slices // k
    if not fits(n, setting, wave, interpreted):
        raise ValueError(
            f"cooperative norm kernel: {parts} slices of {slice_} a row cannot all be resident"
            f" at once ({setting.per_sm} programs a multiprocessor, {wave} multiprocessors)"
        )
    groups = cdiv(m, setting.rows)
    lanes = max(1, min(groups, setting.per_sm * wave // parts))
    return Schedule(slice_, slices, k, parts, lanes, cdiv(groups, lanes))


def unpublished_sums(count: int, device) -> torch.Tensor:
    """The exchange buffer, fp32 words all holding the sentinel (not from launch.alloc: every
    word must start as it)."""
    return torch.full((count,), SENTINEL_BITS, dtype=torch.int32, device=device).view(torch.float32)


def compile_options(setting, interpreted: bool) -> dict:
    """num_warps, and on a GPU the registers capped so that setting.per_sm programs fit a
    multiprocessor's 64K (ptxas otherwise takes ~100 for LayerNorm's backward at 16 warps, one
    program a multiprocessor). The interpreter takes no compiler options."""
    if interpreted:
        return {"num_warps": setting.warps}
    regs = min(255, 65536 // (setting.per_sm * setting.warps * 32) // 8 * 8)
    return {"num_warps": setting.warps, "maxnreg": regs}


def norm_backward_coop(dy, dh, x, weight, bias, mean, rstd, is_rms, dx, setting, wave, alloc):
    """Launch the cooperative backward (settings.Coop `setting`) writing dx; returns the fp32
    weight- and bias-gradient partials, [lanes, N] each (None where absent), for
    launch._finish_weight_grads. `wave`: the multiprocessors (schedule); `alloc`: launch.alloc."""
    m, n = x.shape
    dev = x.device
    interpreted = interpreted_on(dev)
    plan = schedule(m, n, setting, wave, interpreted)
    slices, lanes = plan.slices, plan.lanes
    has_w, has_b = weight is not None, bias is not None
    # the groups past the last row that AHEAD publishes write nothing (their rows are masked off)
    sums = unpublished_sums((1 if is_rms else 2) * slices * m, dev)
    partials = alloc((int(has_w) + int(has_b), lanes, n), torch.float32, dev)
    dw_part = partials[0] if has_w else None
    db_part = partials[-1] if has_b else None
    dh_arg = dh if dh is not None else dy
    launch(
        norm_bwd_coop_kernel,
        (lanes * plan.parts,),
        *(x, weight, dy, dh_arg, dx, mean, rstd, sums, dw_part, db_part, m, n),
        *(x.stride(0), dy.stride(0), dh_arg.stride(0), lanes, plan.per_lane),
        IS_RMS=is_rms,
        HAS_W=has_w,
        HAS_B=has_b,
        HAS_DH=dh is not None,
        ROWS=setting.rows,
        SLICE=plan.slice,
        K=plan.k,
        SLICES=slices,
        SLICES_BLOCK=next_power_of_2(slices),
        AHEAD=setting.ahead,
        EARLY=setting.early,
        PREFETCH=setting.prefetch,
        **compile_options(setting, interpreted),
    )
    return dw_part, db_part
