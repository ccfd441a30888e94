"""Host launchers for the normalisation kernels: pick the path and tile, allocate, launch.

All tensors arrive validated: x, residual, dy, dh 2-D ([M, N], unit stride along N; rows may be
strided, even stride 0), weight and bias contiguous [N]; op.py arranges it (and checks it
where the custom ops are called directly).
No host-device synchronisation: the launchers only read shapes, strides and device properties,
so they run inside CUDA-graph capture.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch

from .._launch import _aligned, align_of, cdiv, launch, next_power_of_2, sm_count  # noqa: F401
from . import kernels as K
from . import kernels_bias as KBIAS
from . import kernels_bwd as KB
from . import kernels_bwd_pieces as KBP
from . import kernels_bwd_sliced as KBS
from . import kernels_coop as KC
from . import kernels_walk as KW
from .launch_coop import coop_forward, coop_pieces

# the launchers read launch.BWD_CONFIGS, FWD_*: tests and sweeps replace them here
from .settings import BWD_CONFIGS, FWD_COOP, FWD_UNMASKED, FWD_WALK, Bwd, Coop, Walk  # noqa: F401

# Widest row the forward keeps in registers; wider rows take the chunked wide path (FWD_WALK's
# widths walk instead, on either side of it). The backward keeps rows up to the widest block of
# BWD_CONFIGS in registers with the weight-gradient accumulators (the fused kernel); wider rows
# take the split kernels. Module-level so tests can lower them to reach those paths.
MAX_BLOCK_N_FWD = 32768  # forward holds only x: 89% of the copy ceiling at 32768 vs 75% chunked
MAX_BLOCK_N = 16384  # a cap on BWD_CONFIGS' widest blocks (tests lower it)
# Forward wide path: 32768-element chunks on 32 warps. The sweep (benchmarks/sweep_norm_configs.py,
# H200, bf16, kernels only, 2**27 elements, at 7174099) gave RMSNorm 82.8% / 65.6% of the copy
# ceiling at widths 65,536 / 262,144 against 76.1% / 64.9% for 16384 on 16 warps, LayerNorm
# 71.2% / 62.4% against 70.5% / 62.6% (16384 had beaten 4096 chunks earlier: 74% / 63% against
# 63% / 60%).
WIDE_WARPS = 32
WIDE_CHUNK_FWD = 32768
# How the walked and wide forwards use the cache: 0 default; 1 y stored streaming (evict first),
# so that it does not push out of L2 the rows a later walk reads again; 2 also the wide kernel's
# first walk loaded evict-last and its second evict-first (the walk kernel always loads so).
# The sweep (part fwdcache, H100, afe4cac; results/README.md) gave 2 at 16,384-262,144: walked
# widths +0 to +4.3 (RMSNorm fp32 65,536 83.2 -> 87.5), the wide kernel +1 to +6 (LayerNorm fp32
# 65,536 76.4 -> 82.3); slower only for add+RMSNorm bf16 at 8,192-32,768 (0.3-0.5, still above
# 100% of the byte model; the landing run at 1de93e7).
FWD_CACHE = 2
# Forward block-path tiles and warps, from the sweep on an H200 (bf16, 2**27 elements):
# 2048-element tiles at 16 elements a thread (at most 16 warps) reached 93-97% of the copy
# ceiling at widths 256..16384, but for LayerNorm at 8192; 32 elements a thread (70d96fb: 4
# warps at 4096, 8 at 8192) took LayerNorm at 8192 from 86.1% to 94.9%, RMSNorm level.
TILE_ELEMENTS_FWD = 2048
FWD_ELEMENTS_PER_THREAD = 32
MAX_WARPS_FWD = 16
# Backward, fused kernel: settings.BWD_CONFIGS.
# Backward, split kernels (rows past the fused kernel's reach, use_wide_path): 2.2-2.9x the
# previous one-program-per-row kernels at 32768-262144 in the same sweep.
SUMS_CHUNK = 4096  # row sums: elements of a row per load
SUMS_TILE = 4096  # elements per program and load: rows × chunk
SUMS_WARPS = 4  # 4: +7% for LayerNorm over 8 in the sweep at 6b14187
SUMS_UNROLL = 4  # loads of a row in flight together
TILES_M = 4  # dx and weight-gradient tiles: rows, columns, warps
TILES_N = 1024
TILES_WARPS = 4
TILES_WAVES = 4  # programs per multiprocessor the grid aims at
COLSUM_M, COLSUM_N, COLSUM_WARPS = 8, 1024, 8  # Bwd.bias_apart's column sums: rows, columns, warps


def alloc(shape, dtype, device) -> torch.Tensor:
    """Every output buffer comes from here (tests replace it with a NaN-filled allocator, so an
    element a kernel fails to write shows up)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _programs_per_wave(device: torch.device) -> int:
    # Under the interpreter a few programs keep tests fast and still exercise the cross-program
    # reduction of the weight gradient.
    return sm_count(device.index or 0) if device.type == "cuda" else 3


def block_config(n: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for rows of n elements on the forward's block path."""
    block_n = next_power_of_2(n)
    block_m = max(1, TILE_ELEMENTS_FWD // block_n)
    elements = block_m * block_n
    num_warps = min(MAX_WARPS_FWD, max(4, elements // (32 * FWD_ELEMENTS_PER_THREAD)))
    return block_m, block_n, num_warps


def op_name(is_rms: bool, has_residual: bool) -> str:
    """The op's public name, also the key of BWD_CONFIGS. For a backward, has_residual is
    whether the residual's gradient dh is added: an add_rms_norm whose h got no gradient runs
    RMSNorm's backward and settings."""
    return "add_rms_norm" if has_residual else ("rms_norm" if is_rms else "layer_norm")


def bwd_config(n: int, op: str, element_size: int = 2) -> tuple[int, int, Bwd]:
    """(BLOCK_M, BLOCK_N, setting) for the fused backward of `op` (a key of BWD_CONFIGS) on rows
    of n elements of element_size bytes (fp16 takes bf16's settings)."""
    block_n = next_power_of_2(n)
    configs = BWD_CONFIGS[op, element_size]
    # the first setting whose block holds the row and, for two blocks, whose tail does
    fits = (c for c in configs if block_n <= c.widest and (not c.head or n <= c.head + c.tail))
    setting = next(fits, configs[-1])
    if setting.slice:  # one row a program, BLOCK_N its slice
        return 1, min(block_n, setting.slice), setting
    if n > setting.head > 0:  # one row a tile, BLOCK_N its head block (Bwd.head)
        return 1, setting.head, setting
    return max(1, setting.tile // block_n), block_n, setting


def use_wide_path(
    n: int, backward: bool = False, op: str = "layer_norm", element_size: int = 2
) -> bool:
    """Forward: the chunked kernel. Backward: the split kernels, past the widest fused block
    for `op` (a key of BWD_CONFIGS) and element size, or below the `fused_from` of the setting
    the row falls to."""
    if not backward:
        return n > MAX_BLOCK_N_FWD
    return _fused_setting(n, op, element_size) is None


def _fused_setting(n: int, op: str, element_size: int) -> tuple[int, int, Bwd] | None:
    """bwd_config(n, op, element_size), or None where the split kernels take the rows: past the
    widest setting, on a block (or slice) wider than MAX_BLOCK_N, or below its fused_from."""
    if n > BWD_CONFIGS[op, element_size][-1].widest:
        return None
    config = bwd_config(n, op, element_size)
    setting = config[2]
    # a row past a two-block setting's reach (the table's last, taken by default) is split
    past_tail = setting.head and n > setting.head + setting.tail
    return None if config[1] > MAX_BLOCK_N or n < setting.fused_from or past_tail else config


def _partials(rows: int, n: int, has_w: bool, has_b: bool, dev):
    """fp32 buffers for per-program partial weight/bias gradients, in one allocation."""
    if not (has_w or has_b):
        return None, None
    buf = alloc((int(has_w) + int(has_b), rows, n), torch.float32, dev)
    return (buf[0] if has_w else None), (buf[-1] if has_b else None)


class _FwdPlan(NamedTuple):
    """What the forward's shapes and settings decide: the kernel, its grid, the integer arguments
    before eps, and the constexprs."""

    kernel: object
    grid: tuple
    ints: tuple
    meta: dict


# Forward plans by (shape, strides, flags, settings); a model has a handful. Cleared past
# _MAX_PLANS (row counts that change every call).
_fwd_plans: dict = {}
_MAX_PLANS = 1024


def _forward_plan(
    m: int, n: int, stride_x: int, stride_r: int, flags: tuple, element_size: int, sms: int = 0,
    fp16: bool = False,
) -> _FwdPlan:  # fmt: skip
    # FWD_UNMASKED's, FWD_WALK's and FWD_COOP's say for this width (fp16 takes bf16's but for
    # its narrow Coop settings: measured in bf16 alone, and under Triton 3.9 an fp16 narrow piece
    # spills), read on every call: a table replaced or edited in place is seen. sms: the GPU's
    # multiprocessors (0: no GPU), which bounds a row's cooperating programs (coop_pieces)
    op = (op_name(flags[0], flags[3]), element_size)
    unmasked = n in FWD_UNMASKED.get(op, ())
    walk = next((w for w in FWD_WALK.get(op, ()) if w.narrowest <= n <= w.widest), None)
    coops = (c for c in FWD_COOP.get(op, ()) if not (fp16 and c.narrow))
    coop = next((c for c in coops if c.narrowest <= n <= c.widest), None)
    pieces = coop_pieces(coop, m, n, sms) if coop is not None else 0
    coop = coop if pieces else None  # where the pieces cannot all run at once: the wide kernel
    key = (m, n, stride_x, stride_r, op, flags, unmasked, walk, coop, MAX_BLOCK_N_FWD)
    key += (WIDE_CHUNK_FWD,)  # op: (name, element size), which Coop.narrow reads
    key += (WIDE_WARPS, TILE_ELEMENTS_FWD, FWD_ELEMENTS_PER_THREAD, MAX_WARPS_FWD, FWD_CACHE)
    plan = _fwd_plans.get(key)
    if plan is not None:
        return plan
    if len(_fwd_plans) >= _MAX_PLANS:
        _fwd_plans.clear()
    meta = dict(zip(("IS_RMS", "HAS_W", "HAS_B", "HAS_RES"), flags))
    meta["ALIGN"], ints = _aligned(n, stride_x, stride_r)
    if coop is not None:
        meta |= dict(PIECE=coop.piece, PIECES=pieces, num_warps=coop.warps)
        meta["NARROW"] = coop.narrow and element_size == 2
        if coop.registers:  # a compile option, which the interpreter ignores
            meta["maxnreg"] = coop.registers
        plan = _FwdPlan(KC.norm_fwd_coop_kernel, (m * pieces,), ints, meta)
    elif walk is not None:
        chunk, chunks, even = walk.chunks_of(n)
        meta |= dict(CHUNK=chunk, CHUNKS=chunks, EVEN=even, num_warps=walk.warps, HOLD=walk.hold)
        # unrolled: every chunk of the loop (the whole ones; a ragged last is taken after it)
        unroll = max(1, chunks - (not even)) if walk.unroll else 1
        meta |= dict(UNROLL=unroll, WELFORD=walk.welford)
        meta |= dict(STREAM=FWD_CACHE >= 1)
        plan = _FwdPlan(KW.norm_fwd_walk_kernel, (m,), ints, meta)
    elif use_wide_path(n):
        meta |= dict(BLOCK_N=WIDE_CHUNK_FWD, num_warps=WIDE_WARPS, CACHE=FWD_CACHE)
        plan = _FwdPlan(K.norm_fwd_wide_kernel, (m,), ints, meta)
    else:
        block_m, block_n, num_warps = block_config(n)
        even = unmasked and n == block_n and m % block_m == 0
        plan = _FwdPlan(
            K.norm_fwd_block_kernel,
            (cdiv(m, block_m),),
            (m, *ints),
            dict(BLOCK_M=block_m, BLOCK_N=block_n, EVEN=even, num_warps=num_warps, **meta),
        )
    _fwd_plans[key] = plan
    return plan


def norm_forward(x, residual, weight, bias, eps: float, is_rms: bool):
    """x, residual: [M, N]. Returns (y, h or None, mean or None, rstd), as
    reference.norm_forward does. Nothing is allocated for what is not returned: the kernels get
    another buffer of the same dtype in place of h and mean, which they never touch then.
    What shapes and settings decide is looked up (_forward_plan): at a launch-bound size the
    eager call's host time is the step's."""
    m, n = x.shape
    dev = x.device
    y = alloc((m, n), x.dtype, dev)
    h = alloc((m, n), x.dtype, dev) if residual is not None else None
    rstd = alloc(m, torch.float32, dev)
    mean = None if is_rms else alloc(m, torch.float32, dev)
    if m == 0:
        return y, h, mean, rstd
    r = residual if residual is not None else x
    flags = (is_rms, weight is not None, bias is not None, residual is not None)
    h_buf = h if h is not None else y
    mean_buf = mean if mean is not None else rstd
    sms = sm_count(dev.index or 0) if x.is_cuda else 0
    fp16 = x.dtype == torch.float16
    plan = _forward_plan(m, n, x.stride(0), r.stride(0), flags, x.element_size(), sms, fp16)
    tensors = (x, r, weight, bias, y, h_buf, mean_buf, rstd)
    if plan.kernel is KC.norm_fwd_coop_kernel:
        coop_forward(plan, tensors, eps, m, alloc)
    else:
        launch(plan.kernel, plan.grid, *tensors, *plan.ints, eps, **plan.meta)
    return y, h, mean, rstd


class _BwdPlan(NamedTuple):
    """The fused backward's schedule for one shape and setting table: grid, tiles per program,
    the setting, and whether one group of programs takes every tile (then it writes the weight
    gradients themselves, with no partials to sum: one launch and three allocations fewer, where
    a launch-bound call's time is the host's)."""

    settings: tuple  # BWD_CONFIGS, its entry for the op, MAX_BLOCK_N, SINGLE_PROGRAM_ELEMENTS
    # when it was made (held, compared by identity: tests and sweeps replace them)
    block_m: int
    block_n: int  # the row's block, a program's slice of it (Bwd.slice) or its head (Bwd.head)
    setting: Bwd
    groups: int  # rows of the weight-gradient partials: programs taking the same rows count once
    slices: int  # programs a row's columns are shared out among (1: whole rows a program)
    tiles_per_program: int


_bwd_plans: dict = {}
# One program takes every tile of a backward up to this many elements (bf16 8 x 4096: 4 tiles).
SINGLE_PROGRAM_ELEMENTS = 32768


def _backward_plan(m: int, n: int, op: str, element_size: int, dev) -> _BwdPlan | None:
    """The fused kernel's schedule, or None where the split kernels take the rows."""
    key = (m, n, op, element_size, dev)
    plan = _bwd_plans.get(key)
    # the table and its entry by identity: a table replaced or edited in place is seen
    entry = BWD_CONFIGS.get((op, element_size))
    settings = (BWD_CONFIGS, entry, MAX_BLOCK_N, SINGLE_PROGRAM_ELEMENTS)
    if plan is not None and all(map(operator.is_, plan.settings, settings)):
        return plan
    fused = _fused_setting(n, op, element_size)
    if fused is None:
        return None
    if len(_bwd_plans) >= _MAX_PLANS:
        _bwd_plans.clear()
    block_m, block_n, setting = fused
    n_tiles = cdiv(m, block_m)
    slices = cdiv(n, block_n) if setting.slice else 1
    if slices == 1 and n_tiles * block_m * block_n <= SINGLE_PROGRAM_ELEMENTS:
        groups = 1
    else:
        groups = max(1, min(n_tiles, setting.per_sm * _programs_per_wave(dev) // slices))
    plan = _BwdPlan(settings, block_m, block_n, setting, groups, slices, cdiv(n_tiles, groups))
    _bwd_plans[key] = plan
    return plan


def norm_backward(dy, dh, x, weight, bias, mean, rstd, is_rms: bool):
    """dy, dh, x: [M, N]; mean None (or empty) for RMS. Returns (dx, dweight or None, dbias or
    None)."""
    m, n = x.shape
    dev = x.device
    dx = alloc((m, n), x.dtype, dev)
    has_w, has_b = weight is not None, bias is not None
    if m == 0:
        dw = torch.zeros_like(weight) if has_w else None
        db = torch.zeros_like(bias) if has_b else None
        return dx, dw, db
    dh_arg = dh if dh is not None else dy
    if mean is None:  # RMS: the kernels never read it; any fp32 buffer holds the place
        mean = rstd
    op, size = op_name(is_rms, dh is not None), x.element_size()
    plan = _backward_plan(m, n, op, size, dev)
    if plan is None:
        dw_part, db_part = _backward_split(dy, dh, x, weight, bias, mean, rstd, is_rms, dx)
        return dx, *_finish_weight_grads(dw_part, db_part, weight, bias, dev)
    if plan.groups == 1:  # the kernel writes the gradients themselves
        dw_part, db_part = dw, db = _weight_grads(weight, bias, dev)
    else:
        dw_part, db_part = _partials(plan.groups, n, has_w, has_b, dev)
    setting = plan.setting
    bias_apart = has_b and setting.bias_apart
    align, ints = _aligned(n, x.stride(0), dy.stride(0), dh_arg.stride(0))
    args = (x, weight, dy, dh_arg, dx, mean, rstd, dw_part, db_part, m, *ints)
    args += (plan.groups, plan.tiles_per_program)
    flags = dict(IS_RMS=is_rms, HAS_W=has_w, HAS_B=has_b and not bias_apart, HAS_DH=dh is not None)
    flags |= dict(num_warps=setting.warps, ALIGN=align)
    if setting.slice:
        meta = dict(SLICES=plan.slices, BLOCK_S=plan.block_n, CHUNK=min(setting.tile, plan.block_n))
        meta |= dict(UNROLL=setting.unroll)
        launch(KBS.norm_bwd_sliced_kernel, (plan.groups * plan.slices,), *args, **flags, **meta)
    elif n > plan.block_n:  # a head block and a tail block (Bwd.head); else one block of n
        meta = dict(HEAD=plan.block_n, TAIL=next_power_of_2(n - plan.block_n))
        meta["PREFETCH"] = setting.prefetch
        launch(KBP.norm_bwd_pieces_kernel, (plan.groups,), *args, **flags, **meta)
    else:
        meta = dict(BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, PREFETCH=setting.prefetch)
        meta |= dict(LEAN=setting.lean, RELOAD=setting.reload)
        launch(KB.norm_bwd_block_kernel, (plan.groups,), *args, **flags, **meta)
    if bias_apart:
        _column_sums(dy, db_part, plan.groups)
    if plan.groups == 1:
        return dx, dw, db
    return dx, *_finish_weight_grads(dw_part, db_part, weight, bias, dev)


def _backward_split(dy, dh, x, weight, bias, mean, rstd, is_rms: bool, dx):
    """Row sums, then dx and the weight-gradient partials by [rows, column block] tiles."""
    m, n = x.shape
    dev = x.device
    has_w, has_b = weight is not None, bias is not None
    chunk = min(next_power_of_2(n), SUMS_CHUNK)
    rows = max(1, SUMS_TILE // chunk)
    sums = alloc((1 if is_rms else 2, m), torch.float32, dev)
    dh_arg = dh if dh is not None else dy
    align, ints = _aligned(n, x.stride(0), dy.stride(0), dh_arg.stride(0))
    n_, stride_x, stride_dy, _ = ints
    flags = dict(IS_RMS=is_rms, HAS_W=has_w, ALIGN=align)
    sums_args = (x, weight, dy, mean, rstd, sums, m, n_, stride_x, stride_dy)
    meta = dict(BLOCK_M=rows, BLOCK_N=chunk, UNROLL=SUMS_UNROLL, num_warps=SUMS_WARPS)
    launch(KB.norm_bwd_row_sums_kernel, (cdiv(m, rows),), *sums_args, **meta, **flags)
    block_n = min(next_power_of_2(n), TILES_N)
    column_blocks = cdiv(n, block_n)
    groups = max(1, min(cdiv(m, TILES_M), TILES_WAVES * _programs_per_wave(dev) // column_blocks))
    rows_per_group = cdiv(cdiv(m, groups), TILES_M) * TILES_M  # whole tiles per group
    groups = cdiv(m, rows_per_group)
    dw_part, db_part = _partials(groups, n, has_w, has_b, dev)
    tiles_args = (x, weight, dy, dh_arg, dx, mean, rstd, sums, dw_part, db_part, m, *ints)
    meta = dict(HAS_B=has_b, HAS_DH=dh is not None, BLOCK_M=TILES_M, BLOCK_N=block_n)
    meta |= dict(num_warps=TILES_WARPS)
    grid = (column_blocks, groups)
    launch(KB.norm_bwd_tiles_kernel, grid, *tiles_args, rows_per_group, **meta, **flags)
    return dw_part, db_part


def _column_sums(dy, part, groups: int) -> None:
    """Σ dy over rows into `groups` rows of part (fp32 partials, or dbias itself for one)."""
    m, n = dy.shape
    rows_per_group = cdiv(m, groups)
    align, (n_, stride) = _aligned(n, dy.stride(0))
    grid = (cdiv(n, COLSUM_N), groups)
    meta = dict(BLOCK_M=COLSUM_M, BLOCK_N=min(COLSUM_N, next_power_of_2(n)), ALIGN=align)
    launch(KBIAS.column_sums_kernel, grid, dy, part, m, n_, stride, rows_per_group, **meta,
           num_warps=COLSUM_WARPS)  # fmt: skip


def _weight_grads(weight, bias, dev):
    """(dweight, dbias) buffers in the parameters' dtypes, None for an absent parameter."""
    dw = alloc(weight.shape, weight.dtype, dev) if weight is not None else None
    db = alloc(bias.shape, bias.dtype, dev) if bias is not None else None
    return dw, db


def _finish_weight_grads(dw_part, db_part, weight, bias, dev):
    """Second stage of the weight-gradient reduction (fixed order, fp32), one launch."""
    dw, db = _weight_grads(weight, bias, dev)
    part = dw_part if dw_part is not None else db_part
    if part is None:  # neither weight nor bias
        return None, None
    n = part.shape[1]
    flags = dict(HAS_W=weight is not None, HAS_B=bias is not None)
    launch(KB.sum_partials_kernel, (cdiv(n, 128),), dw_part, db_part, dw, db, part.shape[0], n,
           **flags, BLOCK_P=32, BLOCK_N=128, num_warps=4)  # fmt: skip
    return dw, db
