"""Host launchers for the normalisation kernels: pick the path and tile, allocate, launch.

All tensors arrive validated: x, residual, dy, dh 2-D ([M, N], unit stride along N; rows may be
strided, even stride 0), weight and bias contiguous [N]; op.py arranges it (and checks it
where the custom ops are called directly).
No host-device synchronisation: the launchers only read shapes, strides and device properties,
so they run inside CUDA-graph capture.
"""

from __future__ import annotations

import torch

from .._launch import cdiv, launch, next_power_of_2, sm_count
from . import kernels as K
from . import kernels_bwd as KB

# Widest row the block path keeps in registers (fp32 values per thread stay <= 32 at 16 warps).
# Wider rows take the chunked wide path. Module-level so tests can lower it to reach that path
# with small shapes.
MAX_BLOCK_N = 16384  # backward
MAX_BLOCK_N_FWD = 32768  # forward holds only x: 89% of the copy ceiling at 32768 vs 75% chunked
WIDE_CHUNK = 4096  # elements per chunk on the wide path (backward)
WIDE_WARPS = 16
# Forward: 16384-element chunks. The sweep (benchmarks/sweep_norm_configs.py, H200, bf16, kernel
# only) gave 74% / 63% of the copy ceiling at widths 65,536 / 262,144 against 63% / 60% for 4096;
# chosen after the benchmark rows in benchmarks/results/ were taken, not re-benchmarked yet.
WIDE_CHUNK_FWD = 16384
# Block-path tiles and warps, from benchmarks/sweep_norm_configs.py on an H200 (bf16, 2**27
# elements): forward 2048-element tiles at 16 elements a thread (at most 16 warps) reached 93-97%
# of the copy ceiling at widths 256..16384; backward 4096-element tiles, 16 a thread, 2 programs
# per SM was the best single setting.
TILE_ELEMENTS_FWD = 2048
TILE_ELEMENTS_BWD = 4096  # RMSNorm; LayerNorm (two more live tiles: mean, dbias) prefers
TILE_ELEMENTS_BWD_LN = 8192  # larger tiles, fewer warps and one program per SM
BWD_ELEMENTS_PER_THREAD_LN = 8
BWD_PROGRAMS_PER_SM_LN = 1
FWD_ELEMENTS_PER_THREAD = 16
BWD_ELEMENTS_PER_THREAD = 16
MAX_WARPS_FWD = 16
MAX_WARPS_BWD = 16
MAX_WARPS_BWD_WIDE = 32  # rows of MAX_BLOCK_N elements
PREFETCH_MAX_N = 8192  # wider rows: no software prefetch in the backward (registers spill)
BWD_PROGRAMS_PER_SM = 2  # persistent backward: programs per multiprocessor
# Split backward (kernels_bwd.py): rows at least this wide, and every row past MAX_BLOCK_N. At
# these widths a row's tiles and its weight-gradient accumulators do not fit the registers
# together, and the fused kernel spills.
SPLIT_MIN_N_LN = 16384
SPLIT_MIN_N_RMS = 32768
SUMS_CHUNK = 4096  # row sums: chunk of a row, elements per program's tile, warps
SUMS_TILE = 4096
SUMS_WARPS = 8
TILES_M = 16  # dx and weight-gradient tiles: rows, columns, warps
TILES_N = 512
TILES_WARPS = 8
TILES_WAVES = 4  # programs per multiprocessor the grid aims at
WIDE_BACKWARD = "split"  # sweep only: "rows" runs the one-program-per-row wide kernels


def alloc(shape, dtype, device) -> torch.Tensor:
    """Every output buffer comes from here (tests replace it with a NaN-filled allocator, so an
    element a kernel fails to write shows up)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _programs_per_wave(device: torch.device) -> int:
    # Under the interpreter a few programs keep tests fast and still exercise the cross-program
    # reduction of the weight gradient.
    return sm_count(device.index or 0) if device.type == "cuda" else 3


def block_config(n: int, backward: bool = False, is_rms: bool = True) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for rows of n elements on the block path."""
    block_n = next_power_of_2(n)
    if not backward:
        tile, per_thread = TILE_ELEMENTS_FWD, FWD_ELEMENTS_PER_THREAD
    elif is_rms:
        tile, per_thread = TILE_ELEMENTS_BWD, BWD_ELEMENTS_PER_THREAD
    else:
        tile, per_thread = TILE_ELEMENTS_BWD_LN, BWD_ELEMENTS_PER_THREAD_LN
    block_m = max(1, tile // block_n)
    elements = block_m * block_n
    max_warps = MAX_WARPS_BWD if backward else MAX_WARPS_FWD
    if backward and block_n >= MAX_BLOCK_N:
        max_warps = MAX_WARPS_BWD_WIDE  # one row per program: as many loads in flight as fit
    num_warps = min(max_warps, max(4, elements // (32 * per_thread)))
    return block_m, block_n, num_warps


def use_wide_path(n: int, backward: bool = False) -> bool:
    return n > (MAX_BLOCK_N if backward else MAX_BLOCK_N_FWD)


def use_split_backward(n: int, is_rms: bool) -> bool:
    return n > MAX_BLOCK_N or n >= (SPLIT_MIN_N_RMS if is_rms else SPLIT_MIN_N_LN)


def _partials(rows: int, n: int, has_w: bool, has_b: bool, dev):
    """fp32 buffers for per-program partial weight/bias gradients, in one allocation."""
    if not (has_w or has_b):
        return None, None
    buf = alloc((int(has_w) + int(has_b), rows, n), torch.float32, dev)
    return (buf[0] if has_w else None), (buf[-1] if has_b else None)


def norm_forward(x, residual, weight, bias, eps: float, is_rms: bool):
    """x, residual: [M, N]. Returns (y, h or None, mean or None, rstd), as
    reference.norm_forward does. Nothing is allocated for what is not returned: the kernels get
    another buffer of the same dtype in place of h and mean, which they never touch then."""
    m, n = x.shape
    dev = x.device
    y = alloc((m, n), x.dtype, dev)
    h = alloc((m, n), x.dtype, dev) if residual is not None else None
    rstd = alloc(m, torch.float32, dev)
    mean = None if is_rms else alloc(m, torch.float32, dev)
    if m == 0:
        return y, h, mean, rstd
    flags = dict(
        IS_RMS=is_rms,
        HAS_W=weight is not None,
        HAS_B=bias is not None,
        HAS_RES=residual is not None,
    )
    r = residual if residual is not None else x
    stride_r = r.stride(0)
    h_buf = h if h is not None else y
    mean_buf = mean if mean is not None else rstd
    if use_wide_path(n):
        launch(
            K.norm_fwd_wide_kernel,
            (m,),
            x,
            r,
            weight,
            bias,
            y,
            h_buf,
            mean_buf,
            rstd,
            n,
            x.stride(0),
            stride_r,
            eps,
            BLOCK_N=WIDE_CHUNK_FWD,
            num_warps=WIDE_WARPS,
            **flags,
        )
    else:
        block_m, block_n, num_warps = block_config(n)
        launch(
            K.norm_fwd_block_kernel,
            (cdiv(m, block_m),),
            x,
            r,
            weight,
            bias,
            y,
            h_buf,
            mean_buf,
            rstd,
            m,
            n,
            x.stride(0),
            stride_r,
            eps,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            num_warps=num_warps,
            **flags,
        )
    return y, h, mean, rstd


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
    if use_split_backward(n, is_rms) and not (WIDE_BACKWARD == "rows" and n > MAX_BLOCK_N):
        dw_part, db_part = _backward_split(dy, dh, x, weight, bias, mean, rstd, is_rms, dx)
    elif use_wide_path(n, backward=True):
        launch(
            KB.norm_bwd_wide_dx_kernel,
            (m,),
            x,
            weight,
            dy,
            dh_arg,
            dx,
            mean,
            rstd,
            n,
            x.stride(0),
            dy.stride(0),
            dh_arg.stride(0),
            IS_RMS=is_rms,
            HAS_W=has_w,
            HAS_DH=dh is not None,
            BLOCK_N=WIDE_CHUNK,
            num_warps=WIDE_WARPS,
        )
        if not (has_w or has_b):
            return dx, None, None
        block_n, block_m = 256, 16
        groups = max(1, min(cdiv(m, block_m), 4 * _programs_per_wave(dev) // cdiv(n, block_n)))
        rows_per_group = cdiv(m, groups)
        dw_part, db_part = _partials(groups, n, has_w, has_b, dev)
        launch(
            KB.norm_bwd_wide_dw_kernel,
            (cdiv(n, block_n), groups),
            x,
            dy,
            mean,
            rstd,
            dw_part,
            db_part,
            m,
            n,
            x.stride(0),
            dy.stride(0),
            rows_per_group,
            IS_RMS=is_rms,
            HAS_W=has_w,
            HAS_B=has_b,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            num_warps=4,
        )
    else:
        block_m, block_n, num_warps = block_config(n, backward=True, is_rms=is_rms)
        per_sm = BWD_PROGRAMS_PER_SM if is_rms else BWD_PROGRAMS_PER_SM_LN
        n_tiles = cdiv(m, block_m)
        programs = min(n_tiles, per_sm * _programs_per_wave(dev))
        dw_part, db_part = _partials(programs, n, has_w, has_b, dev)
        launch(
            KB.norm_bwd_block_kernel,
            (programs,),
            x,
            weight,
            dy,
            dh_arg,
            dx,
            mean,
            rstd,
            dw_part,
            db_part,
            m,
            n,
            x.stride(0),
            dy.stride(0),
            dh_arg.stride(0),
            programs,
            cdiv(n_tiles, programs),
            IS_RMS=is_rms,
            HAS_W=has_w,
            HAS_B=has_b,
            HAS_DH=dh is not None,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            PREFETCH=block_n <= PREFETCH_MAX_N,
            num_warps=num_warps,
        )
    return dx, *_finish_weight_grads(dw_part, db_part, weight, bias, dev)


def _backward_split(dy, dh, x, weight, bias, mean, rstd, is_rms: bool, dx):
    """Row sums, then dx and the weight-gradient partials by [rows, column block] tiles."""
    m, n = x.shape
    dev = x.device
    has_w, has_b = weight is not None, bias is not None
    sums = alloc((1 if is_rms else 2, m), torch.float32, dev)
    chunk = min(next_power_of_2(n), SUMS_CHUNK)
    rows = max(1, SUMS_TILE // chunk)
    flags = dict(IS_RMS=is_rms, HAS_W=has_w)
    launch(
        KB.norm_bwd_row_sums_kernel,
        (cdiv(m, rows),),
        x,
        weight,
        dy,
        mean,
        rstd,
        sums,
        m,
        n,
        x.stride(0),
        dy.stride(0),
        BLOCK_M=rows,
        BLOCK_N=chunk,
        num_warps=SUMS_WARPS,
        **flags,
    )
    block_n = min(next_power_of_2(n), TILES_N)
    column_blocks = cdiv(n, block_n)
    groups = max(1, min(cdiv(m, TILES_M), TILES_WAVES * _programs_per_wave(dev) // column_blocks))
    rows_per_group = cdiv(cdiv(m, groups), TILES_M) * TILES_M  # whole tiles per group
    groups = cdiv(m, rows_per_group)
    dw_part, db_part = _partials(groups, n, has_w, has_b, dev)
    dh_arg = dh if dh is not None else dy
    launch(
        KB.norm_bwd_tiles_kernel,
        (column_blocks, groups),
        x,
        weight,
        dy,
        dh_arg,
        dx,
        mean,
        rstd,
        sums,
        dw_part,
        db_part,
        m,
        n,
        x.stride(0),
        dy.stride(0),
        dh_arg.stride(0),
        rows_per_group,
        HAS_B=has_b,
        HAS_DH=dh is not None,
        BLOCK_M=TILES_M,
        BLOCK_N=block_n,
        num_warps=TILES_WARPS,
        **flags,
    )
    return dw_part, db_part


def _finish_weight_grads(dw_part, db_part, weight, bias, dev):
    """Second stage of the weight-gradient reduction (fixed order, fp32), one launch."""
    dw = alloc(weight.shape, weight.dtype, dev) if weight is not None else None
    db = alloc(bias.shape, bias.dtype, dev) if bias is not None else None
    part = dw_part if dw_part is not None else db_part
    if part is None:  # neither weight nor bias
        return None, None
    n = part.shape[1]
    launch(
        KB.sum_partials_kernel,
        (cdiv(n, 128),),
        dw_part,
        db_part,
        dw,
        db,
        part.shape[0],
        n,
        HAS_W=weight is not None,
        HAS_B=bias is not None,
        BLOCK_P=32,
        BLOCK_N=128,
        num_warps=4,
    )
    return dw, db
