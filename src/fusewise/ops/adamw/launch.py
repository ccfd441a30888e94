"""Host launcher of the fused AdamW kernel: dtype buckets, their device tables, one launch each.

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
import triton.language as tl

from .._launch import launch as launch_kernel
from .kernels import adamw_kernel

BLOCK = 1024  # elements per inner step
CHUNK_BLOCKS = 4  # inner steps per program: a program owns BLOCK * CHUNK_BLOCKS elements
TABLE_COLS = 8  # numel, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, master, step

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
        launch_kernel(
            adamw_kernel,
            (n_chunks,),
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
