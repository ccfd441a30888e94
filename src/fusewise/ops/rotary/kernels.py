"""Triton kernel of the rotary position embedding, forward and backward, q and k in one launch.

One program per (b, s) row: it loads that row's cos and sin once (fp32), then walks the heads of
q and then those of k in [BLOCK_H, BLOCK_HALF] tiles of rotation pairs, each tile reading its two
halves of x once and writing them once, plus the pass-through features Dr..D-1 copied as they
are. q and k [B, H, S, D] have their own strides over B, H and S (HF's transposed q is read in
place), features adjacent; each output has its input's strides; cos and sin [B, S, Dr] have
strides over B (0 for a broadcast) and S, features adjacent. Few arguments on purpose: Triton's
launcher costs host time per argument, and at Llama's sizes the host, not the GPU, set the time.

The pair of feature i < h = Dr / 2 is (a, b) = (i, i + h) (rotate_half, "NeoX") or (2i, 2i + 1)
(INTERLEAVED, GPT-J). Forward, the rotation R:
    y[a] = x[a]·cos[a] - x[b]·sin[a]        y[b] = x[b]·cos[b] + x[a]·sin[b]
BACKWARD applies Rᵀ to dy, which is the same formula with (sin[a], sin[b]) -> (-sin[b], -sin[a]):
    dx[a] = dy[a]·cos[a] + dy[b]·sin[b]     dx[b] = dy[b]·cos[b] - dy[a]·sin[a]
Math in fp32 whatever the storage dtype, one rounding at the store; offsets are int64.
"""

import triton
import triton.language as tl

from .._launch import round_to as _round


@triton.jit
def _rotate_heads(
    X,
    OUT,
    stride_h,
    fa,
    fb,
    pair_mask,
    ca,
    cb,
    sa,
    sb,
    ft,
    tail_mask,
    N_HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    MASKED: tl.constexpr,
    HAS_TAIL: tl.constexpr,
):
    """Rotates the N_HEADS heads of one (b, s) row; X, OUT point at the row's head 0, feature 0
    (both: heads stride_h apart, features adjacent). The head loop is unrolled (N_HEADS is a
    compile-time constant: one compilation per model's head counts) and, when the tiles fit the
    heads and pairs exactly (not MASKED), the loads and stores carry no mask."""
    for h0 in tl.static_range(0, N_HEADS, BLOCK_H):
        heads = h0 + tl.arange(0, BLOCK_H)
        x_row = X + heads.to(tl.int64)[:, None] * stride_h
        o_row = OUT + heads.to(tl.int64)[:, None] * stride_h
        if MASKED:
            mask = (heads < N_HEADS)[:, None] & pair_mask[None, :]
            xa = tl.load(x_row + fa[None, :], mask=mask, other=0.0).to(tl.float32)
            xb = tl.load(x_row + fb[None, :], mask=mask, other=0.0).to(tl.float32)
        else:
            xa = tl.load(x_row + fa[None, :]).to(tl.float32)
            xb = tl.load(x_row + fb[None, :]).to(tl.float32)
        ya = _round(xa * ca[None, :] - xb * sa[None, :], OUT.dtype.element_ty)
        yb = _round(xb * cb[None, :] + xa * sb[None, :], OUT.dtype.element_ty)
        if MASKED:
            tl.store(o_row + fa[None, :], ya, mask=mask)
            tl.store(o_row + fb[None, :], yb, mask=mask)
        else:
            tl.store(o_row + fa[None, :], ya)
            tl.store(o_row + fb[None, :], yb)
        if HAS_TAIL:  # features Dr..D-1: copied bit for bit (same dtype in and out)
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
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
    MASK_Q: tl.constexpr,
    MASK_K: tl.constexpr,
    HAS_TAIL: tl.constexpr,
):
    """(q, k) -> (R q, R k), or with BACKWARD (dq_out, dk_out) -> (Rᵀ dq_out, Rᵀ dk_out): reads
    q, k and one cos and sin row per program once, writes both outputs once. N_Q or N_K 0: that
    tensor is skipped (a gradient not needed). Head counts and widths are compile-time
    constants, as in a model they are fixed."""
    row = tl.program_id(0).to(tl.int64)
    b = row // S
    s = row - b * S
    i = tl.arange(0, BLOCK_HALF)
    pair_mask = i < HALF
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
    ft = 2 * HALF + j.to(tl.int64)
    _rotate_heads(
        Q + b * stride_qb + s * stride_qs,
        QO + b * stride_qb + s * stride_qs,
        stride_qh,
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
    )
    _rotate_heads(
        K + b * stride_kb + s * stride_ks,
        KO + b * stride_kb + s * stride_ks,
        stride_kh,
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
    )
