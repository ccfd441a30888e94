"""Host launcher of the rotary kernel: choose the chunks, allocate, launch (q and k together).

q: [B, Hq, S, D], k: [B, Hkv, S, D], any strides; cos, sin: [Bc, S, Dr] with Bc 1 (broadcast over
B: stride 0) or B, any strides and float dtype (op.py arranges the shapes). Outputs take their
input's layout when that is dense and non-overlapping with adjacent features (HF's transposed q
gives a transposed q_out, as HF's own `q * cos + ...` does, so what reads them next sees the
strides it would have seen), else contiguous, the input then copied once (the kernel writes each
output with its input's strides). No host-device synchronisation: only shapes and strides are
read, so the launch captures in CUDA graphs.

Host time matters here: at Llama's sizes (B 4 x S 2048 x 40 heads x 128, ~170 MB a pass, ~40 us
at the copy ceiling) the eager call's Python and Triton's launcher took longer than the kernel on
the H200, so the dense case costs one allocation per output (torch.empty_like), the kernel takes
17 runtime arguments, and what a call's shapes and strides decide (copies, chunks, masks, the
launch's integers) is worked out once per call signature and kept (_Plan).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._launch import cdiv, launch, next_power_of_2
from . import kernels as K

# Elements of q and k (both halves of the pairs) per chunk of a row's heads, at most, and warps.
# A chunk's loads are all issued before its stores (kernels.py); a Llama row (32 + 8 heads x 128
# = 5,120 elements) is one chunk. From
# benchmarks/sweep_rotary_tiles.py on the H200 (CUDA-graph replays, B 4 x S 2048 x 32/8 x 128,
# bf16, forward / forward+backward, % of the copy ceiling; h200_sweep_rotary_chunks_fda2b3e.csv):
# 8192 at 4 warps 86.5 / 89.7, 4096 at 4 87.4 / 89.4 (a tie), 8 warps 83.5-83.6 / 86.3-86.5,
# 1024 (the old tile) 76.6 / 80.2; Liger's kernel in the same process 87.1-87.7 / 89.5-89.8.
CHUNK_ELEMENTS = 8192
NUM_WARPS = 4


def head_chunks(n_q: int, n_k: int, block_half: int) -> tuple[int, int, int]:
    """(chunks, BLOCK_HQ, BLOCK_HK): the fewest chunks, halving the heads per chunk, whose q and
    k tiles together hold at most CHUNK_ELEMENTS elements (or one head each). A tensor of 0 heads
    (a gradient not needed) takes no room."""
    per_head = 2 * block_half
    split = 1
    while True:
        block_hq = next_power_of_2(max(1, cdiv(n_q, split)))
        block_hk = next_power_of_2(max(1, cdiv(n_k, split)))
        size = (block_hq * (n_q > 0) + block_hk * (n_k > 0)) * per_head
        if size <= CHUNK_ELEMENTS or (block_hq == 1 and block_hk == 1):
            return max(cdiv(n_q, block_hq), cdiv(n_k, block_hk)), block_hq, block_hk
        split *= 2


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


class _Plan(NamedTuple):
    """What a call's shapes and strides decide, worked out on the first call with them: which
    inputs are copied first, and the launch's grid (None: nothing to compute), integer arguments
    and constexprs."""

    copy_q: bool
    copy_k: bool
    copy_cos: bool
    copy_sin: bool
    grid: tuple | None
    ints: tuple
    meta: dict


# Plans by call signature; a model has a handful (forward and backward per layer shape). Cleared
# when it grows past _MAX_PLANS (sequence lengths that change every step).
_plans: dict = {}
_MAX_PLANS = 1024


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
    needed comes back empty (0 elements) and is not computed. The eager call's host time is the
    kernel's at Llama's sizes, so what shapes and strides decide is looked up, not recomputed."""
    key = (
        q.shape,
        q.stride(),
        k.shape,
        k.stride(),
        cos.shape,
        cos.stride(),
        sin.stride(),
        interleaved,
        backward,
        need_q,
        need_k,
        CHUNK_ELEMENTS,
        NUM_WARPS,
    )
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        plan = _plans[key] = _make_plan(q, k, cos, sin, interleaved, backward, need_q, need_k)
    if plan.copy_q:
        q = q.contiguous()
    if plan.copy_k:
        k = k.contiguous()
    q_out = alloc(q) if need_q else torch.empty(0, dtype=q.dtype, device=q.device)
    k_out = alloc(k) if need_k else torch.empty(0, dtype=k.dtype, device=k.device)
    if plan.grid is None:
        return q_out, k_out
    if plan.copy_cos:
        cos = cos.contiguous()
    if plan.copy_sin:
        sin = sin.contiguous()
    # a tensor not needed is never touched (its head count is 0): the other stands in for it
    q_in, q_o = (q, q_out) if need_q else (k, k_out)
    k_in, k_o = (k, k_out) if need_k else (q_in, q_o)
    launch(K.rotary_kernel, plan.grid, q_in, k_in, cos, sin, q_o, k_o, *plan.ints, **plan.meta)
    return q_out, k_out


def _make_plan(q, k, cos, sin, interleaved, backward, need_q, need_k) -> _Plan:
    batch, n_q, seq, dim = q.shape
    n_k = k.shape[1]
    half = cos.shape[-1] // 2
    q_in, k_in = in_and_out(q, need_q)[0], in_and_out(k, need_k)[0]
    cos_in, sin_in = _adjacent_features(cos), _adjacent_features(sin)
    copies = (q_in is not q, k_in is not k, cos_in is not cos, sin_in is not sin)
    n_q, n_k = (n_q if need_q else 0), (n_k if need_k else 0)
    if batch * seq == 0 or n_q + n_k == 0 or dim == 0:
        return _Plan(*copies, None, (), {})
    if not need_q:  # k stands in for q (see rotary)
        q_in = k_in
    if not need_k:
        k_in = q_in
    n_tail = dim - 2 * half
    block_half = next_power_of_2(half)
    n_chunks, block_hq, block_hk = head_chunks(n_q, n_k, block_half)
    q_b, q_h, q_s, _ = q_in.stride()
    k_b, k_h, k_s, _ = k_in.stride()
    # the largest offset within a (b, s) row: past int32, the kernel computes them in int64
    reach = (
        max((n_q - 1) * q_h if n_q else 0, (n_k - 1) * k_h if n_k else 0, cos_in.shape[-1]) + dim
    )
    ints = (
        seq,
        q_b,
        q_h,
        q_s,
        k_b,
        k_h,
        k_s,
        cos_in.stride(0) if cos.shape[0] > 1 else 0,
        cos_in.stride(1),
        sin_in.stride(0) if sin.shape[0] > 1 else 0,
        sin_in.stride(1),
    )
    meta = dict(
        N_Q=n_q,
        N_K=n_k,
        HALF=half,
        N_TAIL=n_tail,
        INTERLEAVED=interleaved,
        BACKWARD=backward,
        N_CHUNKS=n_chunks,
        BLOCK_HQ=block_hq,
        BLOCK_HK=block_hk,
        BLOCK_HALF=block_half,
        BLOCK_TAIL=next_power_of_2(max(n_tail, 1)),
        # masks only where the tiles overhang the heads or the pairs
        MASK_Q=n_q % block_hq != 0 or block_half != half,
        MASK_K=n_k % block_hk != 0 or block_half != half,
        HAS_TAIL=n_tail > 0,
        WIDE=reach >= 2**31,
        num_warps=NUM_WARPS,
    )
    return _Plan(*copies, (batch * seq,), ints, meta)
