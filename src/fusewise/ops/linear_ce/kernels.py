"""The per-chunk cross-entropy pass of linear_cross_entropy as Triton kernels: one [rows, V] block
of logits in, per-token loss and log-sum-exp out, and (WRITE_GRAD) the logit gradient written
over the logits in place, so a chunk costs one read for the statistics and one read + one write
for the gradient, and no second [rows, V] buffer exists; and the scaling pass of the backward.

Per row (z the logits after the optional soft-cap c·tanh(z/c), s the smoothing, y the target):

    lse  = log Σ exp(z)
    loss = (1-s)(lse - z_y) + s(lse - mean z) + z_loss·lse²      (0 where y == ignore_index)
    dz   = scale · (softmax(z)·(1 + 2·z_loss·lse) - s/V - (1-s)·[v == y]) · (1 - tanh²)

`scale` is d(output)/d(this token's loss): one value for every token (1 for "sum", 1/n_valid for
"mean", read from the device so nothing syncs) or one per token (reduction="none"'s backward).
The target and a per-token scale are read through their strides; the logits need unit stride
along V. A non-ignored target outside [0, V) cannot raise on the GPU without a sync; its loss
is NaN. reference.ce_rows is the same contract in torch ops.
"""

import triton
import triton.language as tl

from .._launch import round_to


@triton.jit
def _tanh(x):
    # exp-based and stable at both ends; libdevice's tanh is not available to the interpreter
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _ce_row(
    z_ptr,
    stride_z,
    tgt_ptr,
    stride_t,
    loss_ptr,
    lse_ptr,
    scale_ptr,
    stride_s,
    row,
    row_ok,
    V,
    ignore_index,
    smoothing,
    z_loss,
    softcap,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTH: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    SCALE_PER_ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    base = z_ptr + row.to(tl.int64) * stride_z
    tgt = tl.load(tgt_ptr + row.to(tl.int64) * stride_t, mask=row_ok, other=ignore_index)
    valid = tgt != ignore_index
    in_range = (tgt >= 0) & (tgt < V)
    offs = tl.arange(0, BLOCK)
    # The columns of this row to touch: V, or none past the last row. A column bound rather than
    # `(cols < V) & row_ok`: Triton's interpreter broadcasts a scalar comparison as an int32
    # block (its handle carries the operands' type), which 3.9's masked load/store refuse
    # ("mask has unsupported dtype"); a block comparison is a bool mask on every version.
    v_row = tl.where(row_ok, V, 0)
    # Online log-sum-exp per lane; the running max starts finite so the first rescale is exp(0)
    # rather than exp(-inf + inf).
    m = tl.full([BLOCK], -1e38, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    zsum = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + offs
        mask = cols < v_row
        x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_SOFTCAP:
            x = softcap * _tanh(x / softcap)
        x = tl.where(mask, x, -float("inf"))
        m_new = tl.maximum(m, x)
        s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new
        if SMOOTH:
            zsum += tl.where(mask, x, 0.0)
    mx = tl.max(m, 0)
    lse = mx + tl.log(tl.sum(s * tl.exp(m - mx), 0))
    zt = tl.load(base + tl.where(valid & in_range, tgt, 0), mask=row_ok, other=0.0).to(tl.float32)
    if HAS_SOFTCAP:
        zt = softcap * _tanh(zt / softcap)
    nll = lse - zt
    if SMOOTH:
        nll = (1.0 - smoothing) * nll + smoothing * (lse - tl.sum(zsum, 0) / V)
    nll += z_loss * lse * lse
    nll = tl.where(in_range, nll, float("nan"))  # a bad target poisons the loss, visibly
    tl.store(loss_ptr + row, tl.where(valid, nll, 0.0), mask=row_ok)
    tl.store(lse_ptr + row, lse, mask=row_ok)
    if WRITE_GRAD:
        if SCALE_PER_ROW:
            scale = tl.load(scale_ptr + row.to(tl.int64) * stride_s, mask=row_ok, other=0.0)
        else:
            scale = tl.load(scale_ptr)
        scale = tl.where(valid, scale, 0.0)
        coeff = 1.0 + 2.0 * z_loss * lse
        # second read of the row: recent enough to come from L2 when few rows are in flight
        for start in range(0, V, BLOCK):
            cols = start + offs
            mask = cols < v_row
            x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_SOFTCAP:
                t = _tanh(x / softcap)
                x = softcap * t
            p = tl.exp(x - lse) * coeff - smoothing / V
            p -= tl.where(cols == tgt, 1.0 - smoothing, 0.0)
            if HAS_SOFTCAP:
                p *= 1.0 - t * t
            tl.store(base + cols, round_to(p * scale, z_ptr.dtype.element_ty), mask=mask)


@triton.jit
def ce_rows_kernel(
    z_ptr,
    stride_z,
    tgt_ptr,
    stride_t,
    loss_ptr,
    lse_ptr,
    scale_ptr,
    stride_s,
    rows,
    V,
    ignore_index,
    smoothing,
    z_loss,
    softcap,
    rows_per_program,
    n_programs,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTH: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    SCALE_PER_ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Persistent: program p takes rows p, p + P, ... (P programs in all)."""
    pid = tl.program_id(0)
    for i in range(0, rows_per_program):
        row = pid + i * n_programs
        _ce_row(
            z_ptr,
            stride_z,
            tgt_ptr,
            stride_t,
            loss_ptr,
            lse_ptr,
            scale_ptr,
            stride_s,
            row,
            row < rows,
            V,
            ignore_index,
            smoothing,
            z_loss,
            softcap,
            HAS_SOFTCAP,
            SMOOTH,
            WRITE_GRAD,
            SCALE_PER_ROW,
            BLOCK,
        )


@triton.jit
def scale_kernel(src_ptr, dst_ptr, g_ptr, n, BLOCK: tl.constexpr):
    """dst = src * g, g a device scalar, rounded once to dst's dtype (src may be dst)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr).to(tl.float32)
    x = tl.load(src_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst_ptr + offs, round_to(x * g, dst_ptr.dtype.element_ty), mask=mask)
