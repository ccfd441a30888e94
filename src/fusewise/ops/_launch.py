"""Helpers shared by every family's launchers and kernels (the families import nothing from
each other; what two of them need lives here or in _dispatch.py)."""

import functools

import torch
import triton
import triton.language as tl


@functools.cache
def sm_count(index: int) -> int:
    """Multiprocessors of CUDA device `index` (cached: launchers ask on every call)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def next_power_of_2(n: int) -> int:
    """triton.next_power_of_2(n) for n >= 1 without its host cost: Triton 3.6 wraps it as a
    constexpr function, ~8 us a call through its JIT's __call__ on every launch (three of them
    were a tenth of an eager rotary call's host time)."""
    return 1 << (n - 1).bit_length()


@triton.jit
def round_to(y, DTYPE: tl.constexpr):
    """fp32 -> DTYPE with round-to-nearest-even on every backend. Triton's interpreter truncates
    fp32 -> bf16 (3.6), which would make CPU tests disagree with the GPU; rounding the bits first
    leaves a value bf16 holds exactly, so the final cast is exact on both. NaN passes through."""
    if DTYPE == tl.bfloat16:
        bits = y.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        y = tl.where(y != y, y, bits.to(tl.float32, bitcast=True))
    return y.to(DTYPE)
