"""The fused AdamW kernel: one program per chunk of one tensor, every tensor of a dtype bucket
in one launch (launch.py builds the pointer table and the chunk list).

Per element, in fp32 (reference.py: adamw_update, torch.optim.AdamW's update)::

    g = grad / grad_scale (if scaled); g = -g if maximize
    p = p * (1 - lr * weight_decay)
    m = m + (1 - beta1) * (g - m);  v = beta2 * v + (1 - beta2) * g * g
    vmax = max(vmax, v) if amsgrad;  denom = sqrt(v or vmax) / sqrt(1 - beta2**step) + eps
    p = p - lr / (1 - beta1**step) * m / denom

with 1 - beta and the bias corrections 1 - beta**step (and their square root, and lr over it)
computed in double and rounded once, as torch does in Python (here on the device, in fp64
scalars). A table row is [numel, param, grad, m, v, vmax, master, step] (launch.TABLE_COLS).
"""

import triton
import triton.language as tl

from .._launch import round_to as _round


@triton.jit
def _ptr(row, col: tl.constexpr, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    addr = tl.load(row + col)
    if ALIGNED:
        addr = (addr // 16) * 16  # tells the compiler the address is 16-byte aligned
    return addr.to(tl.pointer_type(DTYPE))


@triton.jit
def _load(ptr, offs, mask, MASKED: tl.constexpr):
    if MASKED:
        return tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return tl.load(ptr + offs).to(tl.float32)


@triton.jit
def _one_minus_pow(step, log_beta_hi, log_beta_lo):
    """1 - beta**step as torch computes it: in double (fp64 exp is libdevice's __nv_exp; the
    fp32 tl.exp is ex2.approx, and 1 - exp(x) in fp32 was 1e-3 off at beta2 = 0.999999).
    log(beta) comes from the host in double, as two fp32 halves (hi + lo). Scalar work, once per
    program. (tl.cast, not .to: the interpreter passes float arguments as Python floats.)"""
    log_beta = tl.cast(log_beta_hi, tl.float64) + tl.cast(log_beta_lo, tl.float64)
    x = tl.cast(step, tl.float64) * log_beta
    return 1.0 - tl.exp(x)


@triton.jit
def _update_block(
    offs,
    n,
    p_ptr,
    g_ptr,
    m_ptr,
    v_ptr,
    vmax_ptr,
    w_ptr,
    inv_scale,
    decay,
    step_size,
    bc2_sqrt,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    eps,
    MASKED: tl.constexpr,
    AMSGRAD: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    MASTER: tl.constexpr,
    HAS_SCALE: tl.constexpr,
):
    """One BLOCK of one tensor: load, update in fp32 registers, store. w_ptr is the fp32 master
    when MASTER (p_ptr then only receives the rounded copy), else the parameter itself."""
    mask = offs < n if MASKED else None
    g = _load(g_ptr, offs, mask, MASKED)
    if HAS_SCALE:
        g = g * inv_scale
    if MAXIMIZE:
        g = -g
    w = _load(w_ptr, offs, mask, MASKED)
    m = _load(m_ptr, offs, mask, MASKED)
    v = _load(v_ptr, offs, mask, MASKED)
    w = w * decay
    m = m + one_minus_beta1 * (g - m)
    v = v * beta2 + one_minus_beta2 * g * g
    if AMSGRAD:
        vmax = tl.maximum(_load(vmax_ptr, offs, mask, MASKED), v)
        tl.store(vmax_ptr + offs, _round(vmax, vmax_ptr.dtype.element_ty), mask=mask)
        denom = tl.sqrt(vmax) / bc2_sqrt + eps
    else:
        denom = tl.sqrt(v) / bc2_sqrt + eps
    w = w - step_size * (m / denom)
    tl.store(m_ptr + offs, _round(m, m_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr + offs, _round(v, v_ptr.dtype.element_ty), mask=mask)
    tl.store(w_ptr + offs, _round(w, w_ptr.dtype.element_ty), mask=mask)
    if MASTER:
        tl.store(p_ptr + offs, _round(w, p_ptr.dtype.element_ty), mask=mask)


@triton.jit
def adamw_kernel(
    TABLE,
    CHUNKS,
    LR,
    lr,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    log_beta1_hi,
    log_beta1_lo,
    log_beta2_hi,
    log_beta2_lo,
    eps,
    weight_decay,
    GRAD_SCALE,
    FOUND_INF,
    P_DTYPE: tl.constexpr,
    G_DTYPE: tl.constexpr,
    S_DTYPE: tl.constexpr,
    LR_IS_TENSOR: tl.constexpr,
    AMSGRAD: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    MASTER: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_INF: tl.constexpr,
    ALIGNED: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK_BLOCKS: tl.constexpr,
):
    pid = tl.program_id(0)
    t = tl.load(CHUNKS + 2 * pid)
    # the chunk list holds chunk indices: start is then a known multiple of the chunk size,
    # which (with 16-byte aligned base pointers) lets the loads vectorise
    start = tl.load(CHUNKS + 2 * pid + 1) * (BLOCK * CHUNK_BLOCKS)
    row = TABLE + t * 8
    n = tl.load(row)
    if HAS_INF:
        n = tl.where(tl.load(FOUND_INF) != 0, 0, n)  # an inf/nan gradient: update nothing
    p_ptr = _ptr(row, 1, P_DTYPE, ALIGNED)
    g_ptr = _ptr(row, 2, G_DTYPE, ALIGNED)
    m_ptr = _ptr(row, 3, S_DTYPE, ALIGNED)
    v_ptr = _ptr(row, 4, S_DTYPE, ALIGNED)
    vmax_ptr = _ptr(row, 5, S_DTYPE, ALIGNED) if AMSGRAD else m_ptr
    w_ptr = _ptr(row, 6, tl.float32, ALIGNED) if MASTER else p_ptr
    step = tl.load(_ptr(row, 7, tl.float32, False))
    if LR_IS_TENSOR:
        lr = tl.load(LR).to(tl.float32)
    # bias corrections from the step on the device, in double and rounded once, as torch's
    bc1 = _one_minus_pow(step, log_beta1_hi, log_beta1_lo)
    bc2 = _one_minus_pow(step, log_beta2_hi, log_beta2_lo)
    step_size = (tl.cast(lr, tl.float64) / bc1).to(tl.float32)
    bc2_sqrt = tl.sqrt(bc2).to(tl.float32)
    decay = 1.0 - lr * weight_decay
    inv_scale = 1.0 / tl.load(GRAD_SCALE).to(tl.float32) if HAS_SCALE else 1.0
    offs0 = start + tl.arange(0, BLOCK).to(tl.int64)
    if start + BLOCK * CHUNK_BLOCKS <= n:  # whole chunk in range: unmasked, vectorised
        for i in tl.static_range(CHUNK_BLOCKS):
            _update_block(
                offs0 + i * BLOCK,
                n,
                p_ptr,
                g_ptr,
                m_ptr,
                v_ptr,
                vmax_ptr,
                w_ptr,
                inv_scale,
                decay,
                step_size,
                bc2_sqrt,
                one_minus_beta1,
                beta2,
                one_minus_beta2,
                eps,
                False,
                AMSGRAD,
                MAXIMIZE,
                MASTER,
                HAS_SCALE,
            )
    else:
        for i in tl.static_range(CHUNK_BLOCKS):
            _update_block(
                offs0 + i * BLOCK,
                n,
                p_ptr,
                g_ptr,
                m_ptr,
                v_ptr,
                vmax_ptr,
                w_ptr,
                inv_scale,
                decay,
                step_size,
                bc2_sqrt,
                one_minus_beta1,
                beta2,
                one_minus_beta2,
                eps,
                True,
                AMSGRAD,
                MAXIMIZE,
                MASTER,
                HAS_SCALE,
            )
