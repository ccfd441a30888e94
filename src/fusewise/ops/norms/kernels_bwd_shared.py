"""The norms' backward with each row shared by SHARE programs (issue #14: LayerNorm at 16,384).

The fused kernel (kernels_bwd.norm_bwd_block_kernel) holds a row's weight- and bias-gradient
accumulators in registers beside the row itself. At 16,384 elements a row on 32 warps that is
16 registers each for x, dy, dweight and dbias out of the 64 a thread has, and LayerNorm spilled
(ptxas: 80 bytes, 16 stores and 18 loads a tile; 49% of the copy ceiling). Here SHARE programs
take the same rows: each reads the whole row for dx's two row sums, then writes dx and
accumulates the weight gradients for its own 1/SHARE of the columns only, so the accumulators
are 1/SHARE as large. The programs sharing a row are neighbours in the grid and run at the same
time, so of the SHARE reads of a row one goes to memory and the rest find it in L2: memory
traffic stays that of one read of x and dy and one write of dx, as the fused kernel's.

Deterministic, as the fused kernel: per-group fp32 partial weight gradients, summed afterwards
by kernels_bwd.sum_partials_kernel.
"""

import triton
import triton.language as tl

from .kernels_bwd import _accumulate, _store_dx, _store_partials, _xhat

_FIRST = tl.constexpr("evict_first")


@triton.jit
def _part_sums(
    X, W, DY, rows64, row_ok, mean, rstd, stride_x, stride_dy, N, s1, s2, p,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, PART: tl.constexpr,
):  # fmt: skip
    """Part p of the row added into the element-wise row sums s1 (x̂·w·dy) and s2 (w·dy)."""
    cols = p * PART + tl.arange(0, PART)
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_W:
        dy = dy * tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    s1 += _xhat(x, mean, rstd, mask, IS_RMS) * dy
    if not IS_RMS:
        s2 += dy
    return s1, s2


@triton.jit
def _row_sums(
    X, W, DY, rows64, row_ok, mean, rstd, stride_x, stride_dy, N,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, BLOCK_M: tl.constexpr, SHARE: tl.constexpr,
    PART: tl.constexpr, HOIST: tl.constexpr,
):  # fmt: skip
    """dx's row sums, Σx̂·w·dy / N and (LayerNorm) Σw·dy / N, read part by part and added up
    element-wise, then reduced across threads once. HOIST unrolls the parts, so that their
    loads are in flight together (more registers); otherwise one part is live at a time."""
    s1 = tl.zeros([BLOCK_M, PART], tl.float32)
    s2 = tl.zeros([BLOCK_M, PART], tl.float32)
    if HOIST:
        for p in tl.static_range(SHARE):
            s1, s2 = _part_sums(
                X, W, DY, rows64, row_ok, mean, rstd, stride_x, stride_dy, N, s1, s2, p,
                IS_RMS, HAS_W, PART,
            )  # fmt: skip
    else:
        for p in range(0, SHARE):
            s1, s2 = _part_sums(
                X, W, DY, rows64, row_ok, mean, rstd, stride_x, stride_dy, N, s1, s2, p,
                IS_RMS, HAS_W, PART,
            )  # fmt: skip
    c1 = tl.sum(s1, axis=1) / N
    c2 = c1 if IS_RMS else tl.sum(s2, axis=1) / N
    return c1, c2


@triton.jit
def norm_bwd_shared_kernel(
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
    n_groups,
    tiles_per_group,
    IS_RMS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_DH: tl.constexpr,
    BLOCK_M: tl.constexpr,
    PART: tl.constexpr,
    SHARE: tl.constexpr,
    HOIST: tl.constexpr,
):
    """Program p belongs to group p // SHARE and owns part p % SHARE of the columns, PART of
    them (SHARE = cdiv(N, PART)). A group takes row tiles g, g + n_groups, ...; each of its
    programs writes dx and the partial sums of dy·x̂ and dy over the group's rows for its own
    columns, into row g of DW_part / DB_part (fp32, or with one group the gradients themselves,
    rounded to their dtype)."""
    pid = tl.program_id(0)
    group = pid // SHARE
    cols = (pid % SHARE) * PART + tl.arange(0, PART)
    col_ok = cols < N
    dw_acc = tl.zeros([BLOCK_M, PART], tl.float32)
    db_acc = tl.zeros([BLOCK_M, PART], tl.float32)
    for i in range(0, tiles_per_group):
        rows = (group + i * n_groups) * BLOCK_M + tl.arange(0, BLOCK_M)  # past the end: masked
        row_ok = rows < M
        rows64 = rows.to(tl.int64)[:, None]
        rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
        mean = rstd if IS_RMS else tl.load(Mean + rows, mask=row_ok, other=0.0)
        c1, c2 = _row_sums(
            X, W, DY, rows64, row_ok, mean, rstd, stride_x, stride_dy, N,
            IS_RMS, HAS_W, BLOCK_M, SHARE, PART, HOIST,
        )  # fmt: skip
        # this program's columns again, from L1 (read a moment ago by _row_sums; evict_first,
        # another policy than that read's, so the compiler cannot hold that value instead)
        mask = row_ok[:, None] & col_ok[None, :]
        x = tl.load(
            X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0, eviction_policy=_FIRST
        )
        dy = tl.load(
            DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0, eviction_policy=_FIRST
        )
        x, dy = x.to(tl.float32), dy.to(tl.float32)
        xhat = _xhat(x, mean, rstd, mask, IS_RMS)
        dw_acc, db_acc = _accumulate(dw_acc, db_acc, dy, xhat, HAS_W, HAS_B)
        if HAS_W:
            dy = dy * tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        dx = dy - xhat * c1[:, None]
        if not IS_RMS:
            dx -= c2[:, None]
        _store_dx(dx * rstd[:, None], DH, DX, rows64, cols, mask, stride_dh, N, HAS_DH)
    _store_partials(DW_part, DB_part, group, cols, col_ok, N, dw_acc, db_acc, HAS_W, HAS_B)
