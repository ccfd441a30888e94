"""Host launcher of the rotary kernel: choose the tile, allocate, launch (q and k together).

q: [B, Hq, S, D], k: [B, Hkv, S, D], any strides; cos, sin: [Bc, S, Dr] with Bc 1 (broadcast over
B: stride 0) or B, any strides and float dtype (op.py arranges the shapes). Outputs take their
input's layout when that is dense and non-overlapping (HF's transposed q gives a transposed
q_out, as HF's own `q * cos + ...` does, so what reads them next sees the strides it would have
seen), else contiguous. No host-device synchronisation: only shapes and strides are read, so the
launch captures in CUDA graphs.
"""

from __future__ import annotations

import torch
import triton

from . import kernels as K

# Elements (both halves of the pairs) per tile and warps: an elementwise stream, 16 elements a
# thread at 4 warps; a [B, S] row of q and k is walked in tiles of BLOCK_H heads. Untuned: to be
# measured on the GPU (benchmarks/bench_rotary.py).
TILE_ELEMENTS = 2048
NUM_WARPS = 4


def alloc(shape, strides, dtype, device) -> torch.Tensor:
    """Every output buffer comes from here (tests replace it with a NaN-filled allocator, so an
    element the kernel fails to write shows up)."""
    return torch.empty_strided(shape, strides, dtype=dtype, device=device)


def output_strides(t: torch.Tensor) -> tuple[int, ...]:
    """t's strides if its elements are dense and non-overlapping (a permutation of a contiguous
    tensor, as torch.empty_like keeps them), else the contiguous strides of its shape."""
    expected = 1
    for d in sorted((d for d in range(t.dim()) if t.shape[d] != 1), key=t.stride):
        if t.stride(d) != expected:
            return _contiguous_strides(t.shape)
        expected *= t.shape[d]
    return t.stride()


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _output(like: torch.Tensor, needed: bool) -> torch.Tensor:
    if not needed:
        return torch.empty(0, dtype=like.dtype, device=like.device)
    return alloc(like.shape, output_strides(like), like.dtype, like.device)


def rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
    backward: bool = False,
    need_q: bool = True,
    need_k: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(R q, R k), or with `backward` (Rᵀ q, Rᵀ k) for q, k the output gradients. A result not
    needed comes back empty (0 elements) and is not computed."""
    batch, n_q, seq, dim = q.shape
    n_k = k.shape[1]
    half = cos.shape[-1] // 2
    q_out, k_out = _output(q, need_q), _output(k, need_k)
    n_q, n_k = (n_q if need_q else 0), (n_k if need_k else 0)
    if batch * seq == 0 or n_q + n_k == 0 or dim == 0:
        return q_out, k_out
    n_tail = dim - 2 * half
    block_half = triton.next_power_of_2(half)
    block_h = min(max(1, TILE_ELEMENTS // (2 * block_half)), triton.next_power_of_2(max(n_q, n_k)))
    # a tensor not needed is never touched (its head count is 0): the other stands in for it
    q_in, q_o = (q, q_out) if need_q else (k, k_out)
    k_in, k_o = (k, k_out) if need_k else (q_in, q_o)
    cos_b = cos.stride(0) if cos.shape[0] > 1 else 0
    sin_b = sin.stride(0) if sin.shape[0] > 1 else 0
    K.rotary_kernel[(batch * seq,)](
        q_in,
        k_in,
        cos,
        sin,
        q_o,
        k_o,
        seq,
        n_q,
        n_k,
        half,
        n_tail,
        *q_in.stride(),
        *k_in.stride(),
        *q_o.stride(),
        *k_o.stride(),
        cos_b,
        *cos.stride()[1:],
        sin_b,
        *sin.stride()[1:],
        INTERLEAVED=interleaved,
        BACKWARD=backward,
        HAS_TAIL=n_tail > 0,
        BLOCK_H=block_h,
        BLOCK_HALF=block_half,
        BLOCK_TAIL=triton.next_power_of_2(max(n_tail, 1)),
        num_warps=NUM_WARPS,
    )
    return q_out, k_out
