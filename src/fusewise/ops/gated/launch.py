"""Host launchers of the gated-activation kernels: choose the view and tile, allocate, launch.

Inputs arrive as [M, N] with unit stride along N (op.py arranges it; rows may have any stride,
0 included). When every input's rows are back to back the launchers view them as a single row
[1, M·N]: a flat stream of full tiles, no row arithmetic. Outputs are contiguous [M, N].
No host-device synchronisation: only shapes and strides are read, so the launches capture in
CUDA graphs.
"""

from __future__ import annotations

import torch
import triton

from .._launch import next_power_of_2
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
    n_col = triton.cdiv(n, block_n)
    return block_m, block_n, n_col, triton.cdiv(m, block_m) * n_col


def gated_forward(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """gate, up: [M, N]. Returns y = act(gate) * up, contiguous [M, N] in gate's dtype."""
    m, n = gate.shape
    y = alloc((m, n), gate.dtype, gate.device)
    if m * n == 0:
        return y
    if _flat(gate, up):
        gate, up, m, n = gate.reshape(1, m * n), up.reshape(1, m * n), 1, m * n
    block_m, block_n, n_col, programs = _grid(m, n)
    K.gated_fwd_kernel[(programs,)](
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """dy, gate, up: [M, N]. Returns (dgate, dup), contiguous [M, N] in gate's dtype; one that
    is not needed comes back empty (0 elements) and is not computed."""
    m, n = gate.shape
    dev, dtype = gate.device, gate.dtype
    dg = alloc((m, n), dtype, dev) if need_dgate else torch.empty(0, dtype=dtype, device=dev)
    du = alloc((m, n), dtype, dev) if need_dup else torch.empty(0, dtype=dtype, device=dev)
    if m * n == 0 or not (need_dgate or need_dup):
        return dg, du
    if _flat(gate, up, dy):
        flat = (1, m * n)
        gate, up, dy, m, n = gate.reshape(flat), up.reshape(flat), dy.reshape(flat), 1, m * n
    block_m, block_n, n_col, programs = _grid(m, n)
    K.gated_bwd_kernel[(programs,)](
        gate,
        up,
        dy,
        dg if need_dgate else dy,
        du if need_dup else dy,
        m,
        n,
        gate.stride(0),
        up.stride(0),
        dy.stride(0),
        n_col,
        ACT=ACTIVATIONS[act],
        NEED_DG=need_dgate,
        NEED_DU=need_dup,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=BWD_WARPS,
    )
    return dg, du
