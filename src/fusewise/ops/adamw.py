"""Fused multi-tensor AdamW: one pass over each parameter's state, one launch per dtype bucket.

Equals torch.optim.AdamW's update (ops/reference.py: adamw_update), per element, in fp32:

    g = grad / grad_scale (if scaled); g = -g if maximize
    p = p * (1 - lr * weight_decay)
    m = m + (1 - beta1) * (g - m);  v = beta2 * v + (1 - beta2) * g * g
    vmax = max(vmax, v) if amsgrad;  denom = sqrt(v or vmax) / sqrt(1 - beta2**step) + eps
    p = p - lr / (1 - beta1**step) * m / denom

with 1 - beta and the bias corrections 1 - beta**step (and their square root, and lr over it)
computed in double and rounded once, as torch does in Python (here on the device, in fp64 scalars).

Traffic per element: reads grad, m, v and p (or the fp32 master), writes m, v and p (and the
rounded model copy when master weights are kept): 28 bytes in fp32, and 28 in the bf16 +
fp32-master layout (grad 2, m 4, v 4, master 4 read; m, v, master 4 each and param 2 written).

The kernel walks a table of pointers ([numel, param, grad, m, v, vmax, master, step] per tensor)
and a chunk list ([tensor index, chunk index] per program), so every parameter of a bucket is
updated by one launch. The step count and bias corrections are read on the device (a step tensor
per parameter, as torch keeps), and lr may be a device tensor: no host sync, capturable.
A found_inf flag (GradScaler) turns every program's update off on the device.
"""

from __future__ import annotations

import contextlib
import math
import struct

import torch
import triton
import triton.language as tl

from . import _dispatch
from ._triton_utils import round_to as _round

BLOCK = 1024  # elements per inner step
CHUNK_BLOCKS = 4  # inner steps per program: a program owns BLOCK * CHUNK_BLOCKS elements
TABLE_COLS = 8  # numel, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, master, step


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


_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


class Bucket:
    """Parameters of one group that share dtypes: the device tables of one launch.

    The chunk list depends only on the sizes; the pointer table is rebuilt (on the host, copied
    from pinned memory without a sync) only when an address changes, e.g. a new grad tensor."""

    def __init__(self, numels: list[int]):
        chunk = BLOCK * CHUNK_BLOCKS
        self.chunks_host = [(i, c) for i, n in enumerate(numels) for c in range(-(-n // chunk))]
        self.chunks = None
        self.key = None
        self.table = None
        self.written = None

    def tables(self, device, rows: list[tuple[int, ...]], item_sizes: tuple[int, ...]):
        key = tuple(rows)
        if key != self.key:
            written = [row[:2] + row[3:7] for row in rows]  # numel and the written pointers
            if written != self.written:  # not each time a new gradient moves the table
                _check_disjoint(written, item_sizes)
                self.written = written
            self.table = _to_device(rows, device)
            self.key = key
        if self.chunks is None:
            self.chunks = _to_device(self.chunks_host, device)
        return self.table, self.chunks


def _check_disjoint(written, item_sizes) -> None:
    """Programs of one launch write their tensors concurrently: two rows whose written memory
    overlaps would race (a parameter that is a view of another, state shared between two).
    written: (numel, param, m, v, vmax, master) per row; item_sizes: their element sizes."""
    spans = sorted(
        (ptr, ptr + row[0] * size)
        for row in written
        for ptr, size in zip(row[1:], item_sizes)
        if ptr and row[0]  # absent (0), or empty
    )
    for (_, end), (start, _) in zip(spans, spans[1:]):
        if start < end:
            raise ValueError(
                "fusewise.optim.AdamW: two tensors one step writes overlap in memory (parameters "
                "that are views of one tensor, or state shared between parameters); their "
                "updates would race. Give each parameter its own memory and state."
            )


def _to_device(rows, device) -> torch.Tensor:
    host = torch.tensor(rows, dtype=torch.int64)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def launch(
    bucket: Bucket,
    rows,
    device,
    *,
    p_dtype,
    g_dtype,
    s_dtype,
    lr,
    beta1,
    beta2,
    eps,
    weight_decay,
    amsgrad,
    maximize,
    master,
    grad_scale,
    found_inf,
    aligned,
):
    """One launch over every tensor of the bucket (rows: one TABLE_COLS tuple per tensor)."""
    s_size = s_dtype.itemsize
    table, chunks = bucket.tables(device, rows, (p_dtype.itemsize, s_size, s_size, s_size, 4))
    n_chunks = len(bucket.chunks_host)
    if n_chunks == 0:
        return
    lr_is_tensor = isinstance(lr, torch.Tensor)
    if grad_scale is not None:  # GradScaler's tensors live on its device: the bucket's here
        grad_scale = grad_scale.to(device, non_blocking=True)  # (itself when the same)
    if found_inf is not None:
        found_inf = found_inf.to(device, non_blocking=True)
    beta1, beta2 = float(beta1), float(beta2)
    # Triton launches on the current device and stream: make them the tensors' device's
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with guard:
        # 1 - beta and log(beta) in double here: 1 - beta2 from beta2 rounded to fp32 is 1.3%
        # off at 0.999999 (torch computes both in Python double)
        adamw_kernel[(n_chunks,)](
            table,
            chunks,
            lr if lr_is_tensor else table,
            0.0 if lr_is_tensor else float(lr),
            1.0 - beta1,
            beta2,
            1.0 - beta2,
            *_log_hi_lo(beta1),
            *_log_hi_lo(beta2),
            float(eps),
            float(weight_decay),
            grad_scale if grad_scale is not None else table,
            found_inf if found_inf is not None else table,
            P_DTYPE=_TL_DTYPES[p_dtype],
            G_DTYPE=_TL_DTYPES[g_dtype],
            S_DTYPE=_TL_DTYPES[s_dtype],
            LR_IS_TENSOR=lr_is_tensor,
            AMSGRAD=amsgrad,
            MAXIMIZE=maximize,
            MASTER=master,
            HAS_SCALE=grad_scale is not None,
            HAS_INF=found_inf is not None,
            ALIGNED=aligned,
            BLOCK=BLOCK,
            CHUNK_BLOCKS=CHUNK_BLOCKS,
            num_warps=4,
        )


def _log_hi_lo(beta: float) -> tuple[float, float]:
    """log(beta) in double as an fp32 pair (the kernel's float arguments are fp32)."""
    if beta == 0.0:
        return -math.inf, 0.0  # beta**step = 0
    log = math.log(beta)
    hi = struct.unpack("f", struct.pack("f", log))[0]
    return hi, log - hi


def kernel_can_run(*tensors: torch.Tensor) -> bool:
    """True when the Triton kernel runs on these tensors; else the caller runs the reference
    (choose_path has warned once, or raised under FUSEWISE_STRICT=1)."""
    return _dispatch.choose_path("adamw", *tensors) != _dispatch.REFERENCE
