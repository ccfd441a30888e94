"""fusewise.ops._launch.launch: kernel[grid](...) with Triton's per-call Python skipped after the
first call of a specialization. On the CPU (the interpreter) it is kernel[grid](...) itself; on a
GPU its cached path must pick the kernel Triton would: the same results on aligned and
misaligned tensors, on ints that Triton specializes (1, multiples of 16) and others."""

import importlib
import pathlib

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from fusewise.ops import _launch

FAMILIES = ("norms", "adamw", "gated", "linear_ce", "rotary")


def _kernels():
    for family in FAMILIES:
        package = importlib.import_module(f"fusewise.ops.{family}")
        for path in sorted(pathlib.Path(package.__file__).parent.glob("kernels*.py")):
            module = importlib.import_module(f"fusewise.ops.{family}.{path.stem}")
            for name, obj in vars(module).items():
                if name.endswith("_kernel") and hasattr(obj, "fn"):
                    yield f"{family}.{name}", obj


@pytest.mark.parametrize(
    "name,kernel", list(_kernels()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_kernel_lists_its_constexprs_last(name, kernel):
    """The cached path passes runtime arguments then constexprs, as Triton's launcher takes them;
    a kernel with a runtime parameter after a constexpr would be refused at its first GPU launch."""
    jit = JITFunction(kernel.fn)  # the kernel as the GPU sees it, whatever TRITON_INTERPRET says
    meta = {p.name: 0 for p in jit.params if p.is_constexpr}
    assert len(_launch._constexpr_tail(jit, meta)) == len(meta)


def _mixed(a, b, out, n, stride, scale, FLAG: tl.constexpr, BLOCK: tl.constexpr):
    pass


def test_a_runtime_parameter_after_a_constexpr_is_refused():
    jit = JITFunction(_mixed)
    assert _launch._constexpr_tail(jit, {"FLAG": True, "BLOCK": 8}) == (True, 8)

    def bad(a, FLAG: tl.constexpr, n):
        pass

    with pytest.raises(TypeError, match="runtime parameters after constexprs"):
        _launch._constexpr_tail(JITFunction(bad), {"FLAG": True})
    with pytest.raises(TypeError, match="needs constexpr BLOCK"):
        _launch._constexpr_tail(jit, {"FLAG": True})


def test_the_key_holds_what_triton_specializes_on():
    """Finer than or equal to Triton's own specialization: every distinction Triton makes
    (tensor dtype and 16-byte alignment; int == 1, % 16, width) gives a different key."""

    def spec(a):
        return _launch._key((a,))

    base = torch.zeros(64, dtype=torch.float32)
    assert spec(base) != spec(base[1:])  # 4-byte offset: not 16-byte aligned
    assert spec(base) == spec(base[4:])  # 16 bytes on: aligned again
    assert spec(base) != spec(base.to(torch.bfloat16))
    assert len({spec(1), spec(2), spec(16), spec(2**40), spec(2**40 + 1)}) == 5
    assert spec(1.0) == spec(1e30) and spec(None) != spec(1.0)
    assert spec(True) != spec(False) != spec(0)
    assert spec(False) != spec(0.0) and spec(True) != spec(1)
    assert len({spec(2**31 - 16), spec(2**31), spec(2**63)}) == 3  # i32, i64, u64
    with pytest.raises(_launch._Unkeyable):
        spec(np.float64(1.0))


@triton.jit
def _copy_scaled_kernel(src, dst, n, stride, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(src + offs * stride, mask=mask)
    tl.store(dst + offs, x * scale, mask=mask)


def _check_copy(device, src, stride):
    n = (src.numel() + stride - 1) // stride
    dst = torch.full((n,), float("nan"), device=device)
    _launch.launch(_copy_scaled_kernel, (triton.cdiv(n, 64),), src, dst, n, stride, 0.5, BLOCK=64)
    torch.testing.assert_close(dst, src[::stride] * 0.5, rtol=0, atol=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's path (no GPU)")
def test_launch_on_the_cpu_is_the_interpreter_call():
    _check_copy("cpu", torch.randn(100), 1)
    assert not any(key[0] is _copy_scaled_kernel for key in _launch._compiled)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cached_launches_run_the_kernel_of_each_specialization():
    """Aligned then misaligned pointers, then ints specialized differently, each repeated so the
    second call takes the cached path: every result exact, one cache entry per specialization."""
    buf = torch.randn(4099, device="cuda")
    cases = [(buf, 1), (buf[1:], 1), (buf[4:], 1), (buf[3:], 1), (buf, 2), (buf, 16), (buf[:17], 1)]
    for src, stride in cases * 2:
        _check_copy("cuda", src, stride)
    keys = [key for key in _launch._compiled if key[0] is _copy_scaled_kernel]
    expected = {  # the distinct (src, n, stride) specializations among the cases
        _launch._key((src, (src.numel() + s - 1) // s, s)) for src, s in cases
    }
    assert len(keys) == len(expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("which", ["launch_enter_hook", "launch_exit_hook"])
def test_a_launch_hook_takes_tritons_own_path(which):
    """Proton or a user's hook must see every launch: launch() then calls kernel[grid](...)."""
    seen = []
    hook = getattr(triton.knobs.runtime, which)
    hook.add(seen.append)
    try:
        src = torch.randn(256, device="cuda")
        for _ in range(2):
            _check_copy("cuda", src, 1)
    finally:
        hook.remove(seen.append)
    assert len(seen) == 2


@triton.jit
def _round_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    tl.store(Y + offs, _launch.round_to(x, Y.dtype.element_ty), mask=offs < n)


def test_round_to_bf16_is_round_to_nearest_even():
    """round_to is the GPU's own cast on a GPU and integer rounding under the interpreter (which
    truncates): both must give torch's fp32 -> bf16 (round to nearest, ties to even) on ties,
    values just either side of them, carries into the exponent, infinities, overflow and NaN."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    base = torch.tensor(
        [1.0, -1.0, 3.0, 1.5, 1e-30, 3e38, -7.25, 65504.0, 0.0], dtype=torch.float64
    ).to(torch.float32)
    bits = base.view(torch.int32)
    # ties below a bf16 with an even then odd last bit, one ulp either side, and the all-ones
    # low half that carries into the exponent
    offsets = torch.tensor([0x8000, 0x18000, 0x7FFF, 0x8001, 0xFFFF, 0x17FFF], dtype=torch.int32)
    x = (bits[:, None] + offsets[None, :]).view(torch.float32).flatten()
    x = torch.cat([x, torch.tensor([float("inf"), float("-inf"), float("nan"), 3.4e38])])
    x = torch.cat([x, torch.randn(1000) * 10.0 ** torch.randint(-20, 20, (1000,))])
    y = torch.full(x.shape, 7.0, dtype=torch.bfloat16)  # poisoned
    xd, yd = x.to(dev), y.to(dev)
    _launch.launch(_round_kernel, (triton.cdiv(x.numel(), 256),), xd, yd, x.numel(), BLOCK=256)
    expected = x.to(torch.bfloat16)
    got = yd.cpu()
    assert torch.equal(got.isnan(), expected.isnan())
    ok = ~expected.isnan()
    if dev == "cpu":  # the interpreter's own bf16 cast flushes subnormal results (0x8001 -> 0)
        ok &= x.abs() >= torch.finfo(torch.float32).tiny
    assert int(ok.sum()) > 1000
    assert torch.equal(got[ok].view(torch.int16), expected[ok].view(torch.int16))
