"""Triton kernels of the gated activations y = act(gate) * up (SwiGLU: act = SiLU; GeGLU: act =
GELU, exact or tanh-approximated), forward and backward.

Both kernels walk a [M, N] view in [BLOCK_M, BLOCK_N] tiles (a 1-D grid, tile -> (row block,
column block)); gate, up and dy have unit stride along N and any row stride (0 for a broadcast,
2·N for the two halves of a fused gate_up projection); the forward's output is contiguous [M, N],
the backward's outputs have unit stride along N and their own row strides (over gate and up
themselves when the launcher is given them as out= buffers). The
launcher views contiguous inputs as one row [1, M·N], so the common case is a flat stream.
Math in fp32 whatever the storage dtype, one rounding at the store. Offsets are int64.

ACT (constexpr): 0 SiLU, 1 GELU exact (erf), 2 GELU tanh. The tanh form is written through the
sigmoid: 1 + tanh(z) = 2·sigmoid(2z) and 1 - tanh(z)² = 4·sigmoid(2z)·sigmoid(-2z), so neither
cancels where tanh(z) is near ±1.
"""

import triton
import triton.language as tl

from .._launch import round_to as _round


@triton.jit
def _activation(g, ACT: tl.constexpr, GRAD: tl.constexpr):
    """(act(g), act'(g)) in fp32; act'(g) is 0.0 unless GRAD."""
    if ACT == 0:
        s = tl.sigmoid(g)
        a = g * s
        da = 0.0
        if GRAD:
            da = s * (1.0 + g * (1.0 - s))
    elif ACT == 1:
        cdf = 0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476))
        a = g * cdf
        da = 0.0
        if GRAD:
            da = cdf + g * 0.3989422804014327 * tl.exp(-0.5 * g * g)
    else:
        # z = k·(g + 0.044715·g³), k = sqrt(2 / pi), with the constants folded by hand (Triton
        # does not reassociate)
        g2 = g * g
        z = g * (0.7978845608028654 + 0.035677408136300125 * g2)
        if GRAD:
            # sigmoid(2z) and sigmoid(-2z) = 1 - sigmoid(2z) from one exp and one reciprocal,
            # t = exp(-2|z|) <= 1 (no overflow): one is 1 / (1 + t), the other t / (1 + t). Not
            # 1 - s by subtraction: exact where s is near 1, and the term is scaled by
            # g·(1 + 3·0.044715·g²). Two sigmoids and unfolded constants made this backward
            # issue-bound: 57 instructions an element (sm_90a SASS), 18 of them FMUL, 4 MUFU.
            t = tl.exp2(tl.abs(z) * -2.8853900817779268)  # exp(-2|z|)
            r = 1.0 / (1.0 + t)
            tr = t * r
            s = tl.where(z >= 0, r, tr)
            a = g * s  # 0.5 · g · (1 + tanh z)
            # act' = s + g·s·(1 - s)·2k·(1 + 3·0.044715·g²)
            da = s + a * tl.where(z >= 0, tr, r) * (1.5957691216057308 + 0.21406444881780075 * g2)
        else:
            a = g * tl.sigmoid(2.0 * z)
            da = 0.0
    return a, da


@triton.jit
def _tile(pid, M, N, n_col_blocks, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows (int64), columns (int64) and the mask of tile `pid`."""
    pid_m = pid // n_col_blocks
    pid_n = pid - pid_m * n_col_blocks
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    return rows, cols, mask


@triton.jit
def gated_fwd_kernel(
    G,
    U,
    Y,
    M,
    N,
    stride_g,
    stride_u,
    n_col_blocks,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """y = act(gate) * up: reads gate and up once, writes y once."""
    rows, cols, mask = _tile(tl.program_id(0), M, N, n_col_blocks, BLOCK_M, BLOCK_N)
    g = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0)
    u = tl.load(U + rows[:, None] * stride_u + cols[None, :], mask=mask, other=0.0)
    a, _ = _activation(g.to(tl.float32), ACT, False)
    y = a * u.to(tl.float32)
    tl.store(Y + rows[:, None] * N + cols[None, :], _round(y, Y.dtype.element_ty), mask=mask)


@triton.jit
def gated_bwd_kernel(
    G,
    U,
    DY,
    DG,
    DU,
    M,
    N,
    stride_g,
    stride_u,
    stride_dy,
    stride_dg,
    stride_du,
    n_col_blocks,
    ACT: tl.constexpr,
    NEED_DG: tl.constexpr,
    NEED_DU: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dgate = dy * up * act'(gate), dup = dy * act(gate), the activation recomputed from gate:
    reads gate, up (only if dgate is needed) and dy once, writes dgate and dup once.

    DG may be G and DU may be U (the launcher's out= buffers, written over the inputs): every
    element is loaded before it is stored, by the same thread, since the loads and the stores
    take their offsets from the same rows and cols (one layout), and no two programs share an
    element."""
    rows, cols, mask = _tile(tl.program_id(0), M, N, n_col_blocks, BLOCK_M, BLOCK_N)
    g = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
    a, da = _activation(g.to(tl.float32), ACT, NEED_DG)
    dy = dy.to(tl.float32)
    if NEED_DG:
        u = tl.load(U + rows[:, None] * stride_u + cols[None, :], mask=mask, other=0.0)
        dg = dy * u.to(tl.float32) * da
        out = rows[:, None] * stride_dg + cols[None, :]
        tl.store(DG + out, _round(dg, DG.dtype.element_ty), mask=mask)
    if NEED_DU:
        out = rows[:, None] * stride_du + cols[None, :]
        tl.store(DU + out, _round(dy * a, DU.dtype.element_ty), mask=mask)
