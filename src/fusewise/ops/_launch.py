"""Helpers shared by every family's launchers and kernels (the families import nothing from
each other; what two of them need lives here or in _dispatch.py)."""

import functools
import inspect
import math

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.runtime.jit import JITFunction


@functools.cache
def sm_count(index: int) -> int:
    """Multiprocessors of CUDA device `index` (cached: launchers ask on every call)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def next_power_of_2(n: int) -> int:
    """triton.next_power_of_2(n) for n >= 1 without its host cost: Triton 3.6 wraps it as a
    constexpr function, ~8 us a call through its JIT's __call__ on every launch (three of them
    were a tenth of an eager rotary call's host time)."""
    return 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """triton.cdiv without its host cost (a constexpr function in Triton 3.6, ~1.6 us a call)."""
    return -(-a // b)


# Whether kernels are decorated for Triton's interpreter: it reads TRITON_INTERPRET when
# triton.jit runs, at import, and so does this.
INTERPRETED = tl.constexpr(bool(knobs.runtime.interpret))


@triton.jit
def round_to(y, DTYPE: tl.constexpr):
    """fp32 -> DTYPE with round-to-nearest-even on every backend. On a GPU that is the cast itself
    (cvt.rn, one instruction per two elements). Triton's interpreter truncates fp32 -> bf16
    (3.6), which would make CPU tests disagree with the GPU, so there the bits are rounded first,
    leaving a value bf16 holds exactly. Not on the GPU too: those ~6 integer instructions per
    element made the norms' forward issue-bound (nvdisasm: 25 instructions per element for
    LayerNorm, ~19 without them). NaN passes through either way."""
    if DTYPE == tl.bfloat16 and INTERPRETED:
        bits = y.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        y = tl.where(y != y, y, bits.to(tl.float32, bitcast=True))
    return y.to(DTYPE)


# --- launching without Triton's per-call Python ----------------------------------------------
#
# kernel[grid](*args, **meta) spends ~20-28 us of host time per launch on the H200 machine's
# host before the launch itself (~7 us): the binder, the cache key, device and stream lookups,
# hooks and launch metadata, all in Python (benchmarks/host_breakdown.py). An eager norm
# forward+backward makes three launches, and its backward runs on autograd's device thread,
# where every Python object touched is also touched by the main thread. `launch` makes the first
# call for a given specialization the normal way, keeps the compiled kernel Triton returns, and
# afterwards calls its launcher directly.

_compiled: dict = {}
# What Triton's driver asks torch for (absent from CPU builds, which never see a CUDA tensor).
_get_device = getattr(torch._C, "_cuda_getDevice", None)
_get_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_I32_MIN, _I32_MAX, _I64_MAX = -(2**31), 2**31 - 1, 2**63 - 1  # i32, i64, u64 beyond
# The launcher's arguments were read from Triton 3.6's and 3.9's NVIDIA driver (the same in
# both); ROCm's (torch.version.hip, where tensors also say is_cuda) was not checked.
_DIRECT = torch.version.hip is None


def _key(args: tuple) -> tuple:
    """What Triton specializes runtime arguments on, or finer: a tensor's dtype and 16-byte
    alignment; an int's equality to 1, divisibility by 16 and width; nothing of a float (always
    fp32, and a learning rate changes every step); None and bools as they are; anything else
    raises _Unkeyable. Two calls with equal keys and constexprs therefore run the kernel Triton's
    own dispatch would pick. One comprehension, not a call per argument: this runs on every
    launch."""
    return tuple(
        [
            (a.dtype, not a.data_ptr() & 15)
            if isinstance(a, torch.Tensor)
            else (a == 1, not a & 15, _I32_MIN <= a <= _I32_MAX, a > _I64_MAX)
            if type(a) is int
            else _FLOAT
            if type(a) is float
            else a
            if a is None or type(a) is bool
            else _refuse(a)
            for a in args
        ]
    )


_FLOAT = "fp32"  # not 0.0: a float's key must differ from False's (0.0 == False in a tuple)


class _Unkeyable(Exception):
    """An argument of a type _key does not know (a numpy scalar, an int subclass): launch()
    leaves that call to Triton's own path."""


def _refuse(a):
    raise _Unkeyable(type(a).__name__)


def _constexpr_tail(kernel, meta: dict) -> tuple:
    """The constexpr values in signature order, after the runtime arguments (as Triton's launcher
    takes them). Every fusewise kernel lists its constexprs last; one that does not is an error
    here, found by the first test that launches it."""
    params = kernel.params
    first = next((i for i, p in enumerate(params) if p.is_constexpr), len(params))
    if any(not p.is_constexpr for p in params[first:]):
        raise TypeError(f"launch: {kernel.__name__} has runtime parameters after constexprs")
    tail = []
    for p in params[first:]:
        if p.name in meta:
            tail.append(meta[p.name])
        elif p.default is not inspect.Parameter.empty:
            tail.append(p.default)
        else:
            raise TypeError(f"launch: {kernel.__name__} needs constexpr {p.name}")
    return tuple(tail)


def _hooked() -> bool:
    """A launch hook (Proton, a user's) needs Triton's own path, which calls it."""
    runtime = knobs.runtime
    return any(
        hook is not None and bool(getattr(hook, "calls", True))
        for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook)
    )


def launch(kernel, grid: tuple, *args, **meta):
    """kernel[grid](*args, **meta), with the same kernel and arguments, for a CUDA launch at a
    fraction of the host cost. It is exactly kernel[grid](*args, **meta) under the interpreter
    (CPU tensors, or a kernel decorated while TRITON_INTERPRET=1 was set), with launch hooks set,
    while torch.compile traces (compiled autograd tracing an eager backward: Dynamo knows
    kernel[grid], not this), and for an argument type _key does not know.
    What the direct path does not redo after a specialization's first launch: Triton's
    pre-run hooks (fusewise's kernels have none), its check that the kernel's globals have not
    changed (they are module constants), and its reading of runtime knobs (TRITON_DEBUG and the
    like, read when the kernel is compiled: set them before the first launch)."""
    first = args[0]
    if not isinstance(first, torch.Tensor):  # an optional buffer passed as None
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if (
        first is None
        or not first.is_cuda
        or not _DIRECT
        or not isinstance(kernel, JITFunction)
        or _hooked()
        or torch.compiler.is_compiling()
    ):
        return kernel[grid](*args, **meta)
    device = _get_device()  # Triton launches on the current device, not the tensors' one
    try:
        key = (kernel, device, tuple(meta.items()), _key(args))
    except _Unkeyable:
        return kernel[grid](*args, **meta)
    entry = _compiled.get(key)
    if entry is None:
        compiled = kernel[grid](*args, **meta)
        if hasattr(compiled, "result"):  # a future under asynchronous compilation
            compiled = compiled.result()
        if compiled is not None and hasattr(compiled, "run"):
            _compiled[key] = compiled, _constexpr_tail(kernel, meta)
        return compiled
    compiled, tail = entry
    n = len(grid)
    compiled.run(
        grid[0],
        grid[1] if n > 1 else 1,
        grid[2] if n > 2 else 1,
        _get_stream(device),
        compiled.function,
        compiled.packed_metadata,
        None,  # launch metadata: only launch hooks read it
        None,
        None,
        *args,
        *tail,
    )
    return compiled


def align_of(*ints: int) -> int:
    """The kernels' ALIGN (norms/kernels.py) for a width and row strides: the largest power of two
    below 16 that divides them all, or 1 where 16 does (Triton then knows it of each: the
    arguments go as they are, and the kernels compile as they did before ALIGN). 1 also where
    one is past int32: Triton passes it as int64, but divided it could fit int32, and the
    kernel's product would then overflow int32 (rows 2**31 + 8 elements apart read the wrong
    row)."""
    common = math.gcd(*ints)
    if common == 0 or common % 16 == 0 or max(ints) > _I32_MAX:
        return 1
    return common & -common


def _aligned(*ints: int) -> tuple[int, tuple[int, ...]]:
    """(ALIGN, the ints divided by it): what the kernels take, to multiply back."""
    align = align_of(*ints)
    return align, tuple(v // align for v in ints)
