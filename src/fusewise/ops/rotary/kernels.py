"""Triton kernel of the rotary position embedding, forward and backward, q and k in one launch.

One program per (b, s) row: it loads that row's cos and sin once (fp32), then the heads of q and
k in chunks of [BLOCK_H, BLOCK_HALF] tiles of rotation pairs (all of a chunk's loads before its
stores), each tile reading its two halves of x once and writing them once, plus the pass-through
features Dr..D-1 copied as they are. q and k [B, H, S, D] have their own strides over B, H and S
(HF's transposed q is read in place), features adjacent; each output has its input's strides;
cos and sin [B, S, Dr] have strides over B (0 for a broadcast) and S, features adjacent. Few
arguments on purpose: Triton's launcher costs host time per argument, and at Llama's sizes the
host, not the GPU, set the time.

The pair of feature i < h = Dr / 2 is (a, b) = (i, i + h) (rotate_half, "NeoX") or (2i, 2i + 1)
(INTERLEAVED, GPT-J). Forward, the rotation R:
    y[a] = x[a]·cos[a] - x[b]·sin[a]        y[b] = x[b]·cos[b] + x[a]·sin[b]
BACKWARD applies Rᵀ to dy, which is the same formula with (sin[a], sin[b]) -> (-sin[b], -sin[a]):
    dx[a] = dy[a]·cos[a] + dy[b]·sin[b]     dx[b] = dy[b]·cos[b] - dy[a]·sin[a]
Math in fp32 whatever the storage dtype, one rounding at the store. A row's start is an int64
offset; offsets within a row (head · stride_h + feature) are int32 unless WIDE (the launcher sets
it when they could pass 2**31): with int64 offsets the kernel measured 1-2% slower on the H200
(more address instructions; benchmarks/results/README.md, 2026-12-03/04).
"""

import triton
import triton.language as tl

from .._launch import round_to as _round


@triton.jit
def _head_offsets(h0, stride_h, BLOCK_H: tl.constexpr, WIDE: tl.constexpr):
    """[BLOCK_H, 1] offsets of heads h0.. within a row, int64 only when WIDE."""
    heads = h0 + tl.arange(0, BLOCK_H)
    if WIDE:
        return heads.to(tl.int64)[:, None] * stride_h
    return heads[:, None] * stride_h


@triton.jit
def _load_pairs(X, stride_h, h0, fa, fb, pair_mask, N_HEADS, BLOCK_H: tl.constexpr, MASKED, WIDE):
    """The two halves (a, b) of the rotation pairs of heads h0..h0+BLOCK_H-1 of one (b, s) row,
    as stored (converted when used: half the registers while the loads are in flight). X points
    at the row's head 0, feature 0. Unmasked when the tiles fit the heads and pairs exactly."""
    heads = h0 + tl.arange(0, BLOCK_H)
    rows = X + _head_offsets(h0, stride_h, BLOCK_H, WIDE)
    if MASKED:
        mask = (heads < N_HEADS)[:, None] & pair_mask[None, :]
        xa = tl.load(rows + fa[None, :], mask=mask, other=0.0)
        xb = tl.load(rows + fb[None, :], mask=mask, other=0.0)
    else:
        xa = tl.load(rows + fa[None, :])
        xb = tl.load(rows + fb[None, :])
    return xa, xb


@triton.jit
def _store_rotated(
    X,
    OUT,
    stride_h,
    h0,
    xa,
    xb,
    fa,
    fb,
    pair_mask,
    ca,
    cb,
    sa,
    sb,
    ft,
    tail_mask,
    N_HEADS,
    BLOCK_H: tl.constexpr,
    MASKED,
    HAS_TAIL,
    WIDE,
):
    """Writes the rotated pairs (xa, xb) of _load_pairs to OUT (X's strides), and copies the
    pass-through features Dr..D-1 of those heads bit for bit (same dtype in and out)."""
    heads = h0 + tl.arange(0, BLOCK_H)
    offsets = _head_offsets(h0, stride_h, BLOCK_H, WIDE)
    x_row = X + offsets
    o_row = OUT + offsets
    xa = xa.to(tl.float32)
    xb = xb.to(tl.float32)
    ya = _round(xa * ca[None, :] - xb * sa[None, :], OUT.dtype.element_ty)
    yb = _round(xb * cb[None, :] + xa * sb[None, :], OUT.dtype.element_ty)
    if MASKED:
        mask = (heads < N_HEADS)[:, None] & pair_mask[None, :]
        tl.store(o_row + fa[None, :], ya, mask=mask)
        tl.store(o_row + fb[None, :], yb, mask=mask)
    else:
        tl.store(o_row + fa[None, :], ya)
        tl.store(o_row + fb[None, :], yb)
    if HAS_TAIL:
        mask_t = (heads < N_HEADS)[:, None] & tail_mask[None, :]
        t = tl.load(x_row + ft[None, :], mask=mask_t)
        tl.store(o_row + ft[None, :], t, mask=mask_t)


@triton.jit
def rotary_kernel(
    Q,
    K,
    COS,
    SIN,
    QO,
    KO,
    S,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_cb,
    stride_cs,
    stride_sb,
    stride_ss,
    N_Q: tl.constexpr,
    N_K: tl.constexpr,
    HALF: tl.constexpr,
    N_TAIL: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BACKWARD: tl.constexpr,
    N_CHUNKS: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
    MASK_Q: tl.constexpr,
    MASK_K: tl.constexpr,
    HAS_TAIL: tl.constexpr,
    WIDE: tl.constexpr,
):
    """(q, k) -> (R q, R k), or with BACKWARD (dq_out, dk_out) -> (Rᵀ dq_out, Rᵀ dk_out): reads
    q, k and one cos and sin row per program once, writes both outputs once. N_Q or N_K 0: that
    tensor is skipped (a gradient not needed). Head counts and widths are compile-time
    constants, as in a model they are fixed.

    The row's heads go in N_CHUNKS chunks (unrolled), chunk c being BLOCK_HQ heads of q and
    BLOCK_HK of k; each chunk issues all its loads, q's and k's, before its first store (a Llama
    row of 32 + 8 heads x 128 is one chunk, 10 KB in bf16), as Liger's kernel does with a whole
    row. Measured on the H200, that alone was level with storing each 1,024-element tile before
    loading the next (x0.996); with int32 offsets as well, 1-2% faster, level with Liger."""
    row = tl.program_id(0).to(tl.int64)
    b = row // S
    s = row - b * S
    i = tl.arange(0, BLOCK_HALF)
    pair_mask = i < HALF
    if WIDE:
        i = i.to(tl.int64)
    if INTERLEAVED:
        fa = 2 * i
        fb = fa + 1
    else:
        fa = i
        fb = i + HALF
    cos_row = COS + b * stride_cb + s * stride_cs
    sin_row = SIN + b * stride_sb + s * stride_ss
    ca = tl.load(cos_row + fa, mask=pair_mask, other=0.0).to(tl.float32)
    cb = tl.load(cos_row + fb, mask=pair_mask, other=0.0).to(tl.float32)
    sa = tl.load(sin_row + fa, mask=pair_mask, other=0.0).to(tl.float32)
    sb = tl.load(sin_row + fb, mask=pair_mask, other=0.0).to(tl.float32)
    if BACKWARD:  # Rᵀ: sin[a] -> -sin[b], sin[b] -> -sin[a]
        sin_a = sa
        sa = -sb
        sb = -sin_a
    j = tl.arange(0, BLOCK_TAIL)
    tail_mask = j < N_TAIL
    ft = 2 * HALF + j
    q_in = Q + b * stride_qb + s * stride_qs
    q_out = QO + b * stride_qb + s * stride_qs
    k_in = K + b * stride_kb + s * stride_ks
    k_out = KO + b * stride_kb + s * stride_ks
    for c in tl.static_range(N_CHUNKS):
        # a chunk past one tensor's heads (fewer kv heads than chunks' worth) skips it
        if c * BLOCK_HQ < N_Q:
            qa, qb = _load_pairs(
                q_in, stride_qh, c * BLOCK_HQ, fa, fb, pair_mask, N_Q, BLOCK_HQ, MASK_Q, WIDE
            )
        if c * BLOCK_HK < N_K:
            ka, kb = _load_pairs(
                k_in, stride_kh, c * BLOCK_HK, fa, fb, pair_mask, N_K, BLOCK_HK, MASK_K, WIDE
            )
        if c * BLOCK_HQ < N_Q:
            _store_rotated(
                q_in,
                q_out,
                stride_qh,
                c * BLOCK_HQ,
                qa,
                qb,
                fa,
                fb,
                pair_mask,
                ca,
                cb,
                sa,
                sb,
                ft,
                tail_mask,
                N_Q,
                BLOCK_HQ,
                MASK_Q,
                HAS_TAIL,
                WIDE,
            )
        if c * BLOCK_HK < N_K:
            _store_rotated(
                k_in,
                k_out,
                stride_kh,
                c * BLOCK_HK,
                ka,
                kb,
                fa,
                fb,
                pair_mask,
                ca,
                cb,
                sa,
                sb,
                ft,
                tail_mask,
                N_K,
                BLOCK_HK,
                MASK_K,
                HAS_TAIL,
                WIDE,
            )
