"""Host launchers of the gated-activation kernels: choose the view and tile, allocate, launch.

Inputs arrive as [M, N] with unit stride along N (op.py arranges it; rows may have any stride,
0 included). When every input's rows are back to back the launchers view them as a single row
[1, M·N]: a flat stream of full tiles, no row arithmetic. Outputs they allocate are contiguous
[M, N]; the backward's internal out= buffers (written over gate and up by ops/gated/down.py)
may have any row stride of at least N. No host-device synchronisation: only shapes and strides
are read, so the launches capture in CUDA graphs.
"""

from __future__ import annotations

import torch

from .._launch import cdiv, launch, next_power_of_2
from . import kernels as K

ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}
# Elements per tile and warps: an elementwise stream, 8 elements a thread at 4 warps for the
# forward (two loads, one store) and 8 warps for the backward (three loads, two stores).
TILE_ELEMENTS = 2048
MAX_BLOCK_N = 2048
FWD_WARPS = 4
BWD_WARPS = 8


def alloc(shape, dtype, device) -> torch.Tensor:
    """Every output buffer comes from here (tests replace it with a NaN-filled allocator, so an
    element a kernel fails to write shows up)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _flat(*ts: torch.Tensor) -> bool:
    """True if every [M, N] tensor's rows are back to back (one contiguous stream)."""
    return all(t.shape[0] <= 1 or t.stride(0) == t.shape[1] for t in ts)


def _grid(m: int, n: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, column blocks, programs) for [m, n]."""
    block_n = min(next_power_of_2(max(n, 1)), MAX_BLOCK_N)
    block_m = max(1, TILE_ELEMENTS // block_n)
    n_col = cdiv(n, block_n)
    return block_m, block_n, n_col, cdiv(m, block_m) * n_col


def gated_forward(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """gate, up: [M, N]. Returns y = act(gate) * up, contiguous [M, N] in gate's dtype."""
    m, n = gate.shape
    y = alloc((m, n), gate.dtype, gate.device)
    if m * n == 0:
        return y
    if _flat(gate, up):
        gate, up, m, n = gate.reshape(1, m * n), up.reshape(1, m * n), 1, m * n
    block_m, block_n, n_col, programs = _grid(m, n)
    launch(
        K.gated_fwd_kernel,
        (programs,),
        gate,
        up,
        y,
        m,
        n,
        gate.stride(0),
        up.stride(0),
        n_col,
        ACT=ACTIVATIONS[act],
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=FWD_WARPS,
    )
    return y


def gated_backward(
    dy: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    act: str,
    need_dgate: bool = True,
    need_dup: bool = True,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """dy, gate, up: [M, N]. Returns (dgate, dup), contiguous [M, N] in gate's dtype; one that
    is not needed comes back empty (0 elements) and is not computed.

    out (internal, ops/gated/down.py): (dgate, dup) buffers [M, N] in gate's dtype with unit
    stride along N and rows that do not overlap, written instead of new ones and returned: gate
    and up themselves may be given (each element is read before it is written), the caller then
    owns the fact that they are overwritten. Not for the public ops, which never write over a
    user's tensors."""
    m, n = gate.shape
    dev, dtype = gate.device, gate.dtype
    if out is not None:
        _check_out(out, m, n, dtype, dev)
        dg, du = out
    else:
        dg = alloc((m, n), dtype, dev) if need_dgate else None
        du = alloc((m, n), dtype, dev) if need_dup else None
    empty = torch.empty(0, dtype=dtype, device=dev)
    dg, du = (dg if need_dgate else empty), (du if need_dup else empty)
    if m * n == 0 or not (need_dgate or need_dup):
        return dg, du
    outs = [t for t in (dg, du) if t.numel()]
    if _flat(gate, up, dy, *outs):
        flat = (1, m * n)
        gate, up, dy, m, n = gate.reshape(flat), up.reshape(flat), dy.reshape(flat), 1, m * n
        # view, never reshape: a copy would take the writes meant for the caller's buffer
        dg_k, du_k = (t.view(flat) if t.numel() else t for t in (dg, du))
    else:
        dg_k, du_k = dg, du
    block_m, block_n, n_col, programs = _grid(m, n)
    launch(
        K.gated_bwd_kernel,
        (programs,),
        gate,
        up,
        dy,
        dg_k if need_dgate else dy,
        du_k if need_dup else dy,
        m,
        n,
        gate.stride(0),
        up.stride(0),
        dy.stride(0),
        dg_k.stride(0) if need_dgate else 0,
        du_k.stride(0) if need_dup else 0,
        n_col,
        ACT=ACTIVATIONS[act],
        NEED_DG=need_dgate,
        NEED_DU=need_dup,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=BWD_WARPS,
    )
    return dg, du


def _check_out(out, m: int, n: int, dtype, device) -> None:
    """What the kernel assumes of out= buffers: [M, N], gate's dtype and device, unit stride
    along N, rows apart (no stride-0 broadcast: two programs would write one element)."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"out must be a (dgate, dup) tuple of tensors, got {type(out).__name__}")
    for name, t in zip(("dgate", "dup"), out):
        bad = (
            t.shape != (m, n)
            or t.dtype != dtype
            or t.device != device
            or (n > 1 and t.stride(1) != 1)
            or (m > 1 and t.stride(0) < n)
        )
        if bad:
            raise ValueError(
                f"out {name} must be [{m}, {n}] {dtype} on {device} with unit stride along N "
                f"and non-overlapping rows, got {tuple(t.shape)} {t.dtype} on {t.device} "
                f"strides {t.stride()}"
            )
