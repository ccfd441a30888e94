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

import os
from dataclasses import dataclass

import torch

from .._launch import next_power_of_2
from . import kernels as K

# Elements (both halves of the pairs) per tile and warps; a [B, S] row of q and k is walked in
# tiles of BLOCK_H heads. From benchmarks/sweep_rotary_tiles.py on the H200 (CUDA-graph replays,
# B 4 x S 2048 x 32/8 heads x 128, bf16): 1024 elements at 4 warps led (81% of the copy ceiling
# forward, 84% forward+backward; 2048: 79/82; 4096 and 8192: 71/74).
TILE_ELEMENTS = 1024
NUM_WARPS = 4


@dataclass(frozen=True)
class Variant:
    """How a pass is cut into programs (benchmarks/sweep_rotary_variants.py compares them; every
    variant computes the same values, fp32 math and one rounding to nearest even).

    kernel "row": kernels.rotary_kernel, one program per (b, s) row walking its heads in tiles of
    TILE_ELEMENTS elements, a tile's stores before the next tile's loads. kernel "tiles":
    kernels.rotary_tiles_kernel, `rows` rows a program with all heads of q and k, every load before
    the first store (Liger's order). (Programs of one head block each, q's then k's, were tried
    and dropped: their if/else over q and k did not compile on the GPU.) native_round: the GPU's
    round-to-nearest-even cast instead of round_to's integer rounding (the same values, fewer
    instructions; the interpreter, on the CPU, always takes round_to)."""

    kernel: str = "row"
    rows: int = 1
    num_warps: int | None = None  # None: NUM_WARPS
    native_round: bool = False
    tile_elements: int | None = None  # kernel "row": None: TILE_ELEMENTS


VARIANTS = {
    "row": Variant(),
    "row-native": Variant(native_round=True),
    "row-native-t2048": Variant(native_round=True, tile_elements=2048),
    "whole": Variant("tiles", native_round=True),
    "whole-w8": Variant("tiles", num_warps=8, native_round=True),
    "whole-rows2-w8": Variant("tiles", rows=2, num_warps=8, native_round=True),
}
# The variant every call takes (a module attribute, read at each call: the sweep sets it);
# FUSEWISE_ROTARY_VARIANT names another at import.
VARIANT = os.environ.get("FUSEWISE_ROTARY_VARIANT", "row")
if VARIANT not in VARIANTS:
    raise ValueError(f"FUSEWISE_ROTARY_VARIANT={VARIANT!r} is not one of {', '.join(VARIANTS)}")


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
    in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(R q, R k), or with `backward` (Rᵀ q, Rᵀ k) for q, k the output gradients. A result not
    needed comes back empty (0 elements) and is not computed. in_place (q and k with adjacent
    features; each element is loaded before the same program stores it): the results written
    over q and k, as Liger does; only benchmarks/sweep_rotary_variants.py asks for it, to tell
    how much of Liger's lead its in-place writes make (the byte count is the same)."""
    batch, n_q, seq, dim = q.shape
    n_k = k.shape[1]
    half = cos.shape[-1] // 2
    if in_place:
        if not (need_q and need_k) or q.stride(-1) != 1 or k.stride(-1) != 1:
            raise ValueError("in_place rotates both q and k, each with adjacent features")
        q_out, k_out = q, k
    else:
        q, q_out = in_and_out(q, need_q)
        k, k_out = in_and_out(k, need_k)
    n_q, n_k = (n_q if need_q else 0), (n_k if need_k else 0)
    if batch * seq == 0 or n_q + n_k == 0 or dim == 0:
        return q_out, k_out
    cos, sin = _adjacent_features(cos), _adjacent_features(sin)
    n_tail = dim - 2 * half
    block_half = next_power_of_2(half)
    # a tensor not needed is never touched (its head count is 0): the other stands in for it
    q_in, q_o = (q, q_out) if need_q else (k, k_out)
    k_in, k_o = (k, k_out) if need_k else (q_in, q_o)
    variant = VARIANTS[VARIANT]
    args = (
        q_in,
        k_in,
        cos,
        sin,
        q_o,
        k_o,
        *q_in.stride()[:3],
        *k_in.stride()[:3],
        cos.stride(0) if cos.shape[0] > 1 else 0,
        cos.stride(1),
        sin.stride(0) if sin.shape[0] > 1 else 0,
        sin.stride(1),
    )
    shapes = dict(
        N_Q=n_q,
        N_K=n_k,
        HALF=half,
        N_TAIL=n_tail,
        INTERLEAVED=interleaved,
        BACKWARD=backward,
        BLOCK_HALF=block_half,
        BLOCK_TAIL=next_power_of_2(max(n_tail, 1)),
        HAS_TAIL=n_tail > 0,
        NATIVE_ROUND=variant.native_round and q_in.device.type == "cuda",
        num_warps=variant.num_warps or NUM_WARPS,
    )
    if variant.kernel == "tiles":
        _launch_tiles(variant, batch * seq, seq, args, shapes)
        return q_out, k_out
    tile_heads = max(1, (variant.tile_elements or TILE_ELEMENTS) // (2 * block_half))
    block_hq = min(tile_heads, next_power_of_2(max(n_q, 1)))
    block_hk = min(tile_heads, next_power_of_2(max(n_k, 1)))
    K.rotary_kernel[(batch * seq,)](
        *args[:6],
        seq,
        *args[6:],
        BLOCK_HQ=block_hq,
        BLOCK_HK=block_hk,
        # masks only where the tiles overhang the heads or the pairs
        MASK_Q=n_q % block_hq != 0 or block_half != half,
        MASK_K=n_k % block_hk != 0 or block_half != half,
        **shapes,
    )
    return q_out, k_out


def _launch_tiles(variant: Variant, n_rows: int, seq: int, args: tuple, shapes: dict) -> None:
    """kernels.rotary_tiles_kernel over [n_rows / rows] programs, all heads in each."""
    n_q, n_k, rows = shapes["N_Q"], shapes["N_K"], variant.rows
    block_hq, block_hk = next_power_of_2(max(n_q, 1)), next_power_of_2(max(n_k, 1))
    grid = (-(-n_rows // rows),)
    pairs_overhang = shapes["BLOCK_HALF"] != shapes["HALF"] or n_rows % rows != 0
    K.rotary_tiles_kernel[grid](
        *args[:6],
        n_rows,
        seq,
        *args[6:],
        ROWS=rows,
        BLOCK_HQ=block_hq,
        BLOCK_HK=block_hk,
        MASK_Q=n_q % block_hq != 0 or pairs_overhang,
        MASK_K=n_k % block_hk != 0 or pairs_overhang,
        **shapes,
    )
