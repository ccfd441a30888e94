"""Host launcher of the rotary kernel: choose the tile, allocate, launch (q and k together).

q: [B, Hq, S, D], k: [B, Hkv, S, D], any strides; cos, sin: [Bc, S, Dr] with Bc 1 (broadcast over
B: stride 0) or B, any strides and float dtype (op.py arranges the shapes). Outputs take their
input's layout when that is dense and non-overlapping with adjacent features (HF's transposed q
gives a transposed q_out, as HF's own `q * cos + ...` does, so what reads them next sees the
strides it would have seen), else contiguous, the input then copied once (the kernel writes each
output with its input's strides). No host-device synchronisation: only shapes and strides are
read, so the launch captures in CUDA graphs.

Host time matters here: at Llama's sizes (B 4 x S 2048 x 40 heads x 128, ~170 MB a pass, ~40 us
at the copy ceiling) the eager call's Python and Triton's launcher took longer than the kernel on
the H200, so the dense case costs one allocation per output (torch.empty_like) and the kernel
takes 21 arguments.
"""

from __future__ import annotations

import torch

from .._launch import launch, next_power_of_2
from . import kernels as K

# Elements (both halves of the pairs) per tile and warps; a [B, S] row of q and k is walked in
# tiles of BLOCK_H heads. From benchmarks/sweep_rotary_tiles.py on the H200 (CUDA-graph replays,
# B 4 x S 2048 x 32/8 heads x 128, bf16): 1024 elements at 4 warps led (81% of the copy ceiling
# forward, 84% forward+backward; 2048: 79/82; 4096 and 8192: 71/74).
TILE_ELEMENTS = 1024
NUM_WARPS = 4


def alloc(like: torch.Tensor) -> torch.Tensor:
    """Every output buffer comes from here, with like's strides when like is dense (torch's
    preserve_format rule), else contiguous (tests replace it with a NaN-filled allocator, so an
    element the kernel fails to write shows up)."""
    return torch.empty_like(like)


def in_and_out(t: torch.Tensor, needed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(t as the kernel reads it, its output): the output shares t's strides, so t is copied
    once when it is not dense (expanded, sliced) or its features are not adjacent; the output
    then is contiguous. The custom ops' fakes and the reference path take their outputs' layout
    from here too, so every path gives the same strides."""
    if not needed:
        return t, torch.empty(0, dtype=t.dtype, device=t.device)
    out = alloc(t)
    if out.stride() != t.stride() or (t.stride(-1) != 1 and t.shape[-1] > 1):
        t = t.contiguous()
        if out.stride() != t.stride():
            out = alloc(t)
    return t, out


def _adjacent_features(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


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
    q, q_out = in_and_out(q, need_q)
    k, k_out = in_and_out(k, need_k)
    n_q, n_k = (n_q if need_q else 0), (n_k if need_k else 0)
    if batch * seq == 0 or n_q + n_k == 0 or dim == 0:
        return q_out, k_out
    cos, sin = _adjacent_features(cos), _adjacent_features(sin)
    n_tail = dim - 2 * half
    block_half = next_power_of_2(half)
    tile_heads = max(1, TILE_ELEMENTS // (2 * block_half))
    # a tensor not needed is never touched (its head count is 0): the other stands in for it
    q_in, q_o = (q, q_out) if need_q else (k, k_out)
    k_in, k_o = (k, k_out) if need_k else (q_in, q_o)
    block_hq = min(tile_heads, next_power_of_2(max(n_q, 1)))
    block_hk = min(tile_heads, next_power_of_2(max(n_k, 1)))
    q_b, q_h, q_s, _ = q_in.stride()
    k_b, k_h, k_s, _ = k_in.stride()
    launch(
        K.rotary_kernel,
        (batch * seq,),
        q_in,
        k_in,
        cos,
        sin,
        q_o,
        k_o,
        seq,
        q_b,
        q_h,
        q_s,
        k_b,
        k_h,
        k_s,
        cos.stride(0) if cos.shape[0] > 1 else 0,
        cos.stride(1),
        sin.stride(0) if sin.shape[0] > 1 else 0,
        sin.stride(1),
        N_Q=n_q,
        N_K=n_k,
        HALF=half,
        N_TAIL=n_tail,
        INTERLEAVED=interleaved,
        BACKWARD=backward,
        BLOCK_HQ=block_hq,
        BLOCK_HK=block_hk,
        BLOCK_HALF=block_half,
        BLOCK_TAIL=next_power_of_2(max(n_tail, 1)),
        # masks only where the tiles overhang the heads or the pairs
        MASK_Q=n_q % block_hq != 0 or block_half != half,
        MASK_K=n_k % block_hk != 0 or block_half != half,
        HAS_TAIL=n_tail > 0,
        num_warps=NUM_WARPS,
    )
    return q_out, k_out
