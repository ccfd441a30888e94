"""What the Hugging Face swaps (hf_norms.py, hf_mlp.py) share: which method of a user's class
would be dropped by a swap, and the swap checked on a probe input before it is kept."""

from __future__ import annotations

import torch

from . import _swap

_PROBE_LEADING = (2, 3)  # the probe input is [2, 3, width]


def own_method(cls: type, base: type, methods) -> str | None:
    """'Owner.method' for the first of `methods` (those deciding what `base` computes) that
    `cls` defines differently from `base`, or None: swapping such a class would drop that code."""
    own = next((m for m in methods if getattr(cls, m) is not getattr(base, m)), None)
    if own is None:
        return None
    owner = next(c for c in cls.__mro__ if own in vars(c))
    return f"{_swap.qualname(owner)}.{own}"


def code_of_its_own(module, base: type, methods) -> str | None:
    """Why `module` (an instance of `base` or of a subclass) must keep its code, or None: its
    class redefines one of `methods`, or a forward was set on the instance (kernelize, a
    wrapper)."""
    own = own_method(type(module), base, methods)
    if own is not None:
        return f"its own {own.rsplit('.', 1)[1]} ({own}): swapping would drop that code"
    if "forward" in vars(module):
        return "its forward is set on the instance (kernelize, a wrapper): kept"
    return None


def unprobeable(weight, dims: int) -> str | None:
    """Why a module whose weight is `weight` (expected `dims`-D) cannot be probe-checked, or
    None: the HF swaps check each module on a probe input before keeping it."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != dims:
        return f"no {dims}-D weight tensor to size a probe with"
    if weight.is_meta:
        return (
            "its parameters are on the meta device (not loaded yet), so the swap cannot be "
            "checked: call fusewise.patch(model) again after the weights are loaded"
        )
    if not weight.is_floating_point():
        return f"its weight is {weight.dtype}, not floating point (quantized?)"
    return None


def swap_checked(module, mixin: type, weight, width: int, ulps: float, floor: float):
    """Switch module's class to _swap.subclass(mixin, its class) and keep it only if the fused
    forward matches the original on a probe input [2, 3, width] in weight's dtype and device
    (from a private generator: the global RNG is untouched). The check: |fused - original| <=
    rtol * (|original| + floor * max |original|), rtol 1e-5 in fp32/fp64 and `ulps` units of the
    dtype's epsilon in bf16/fp16. Returns None when kept, else what differed (the module is
    restored with _swap.restore, attributes set on it before included)."""
    cls = type(module)
    original = cls.forward
    _swap.swap_class(module, _swap.subclass(mixin, cls))
    try:
        mismatch = _compare(module, original, weight, width, ulps, floor)
    except Exception as e:  # anything the fused op (or the original) refuses on this module
        mismatch = f"could not be probed ({type(e).__name__}: {e})"
    if mismatch is not None:
        _swap.restore(module)
    return mismatch


def _compare(module, original, weight, width, ulps, floor) -> str | None:
    gen = torch.Generator().manual_seed(0x5EED)
    x = torch.randn(*_PROBE_LEADING, width, generator=gen)
    x = x.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        want = original(module, x)
        got = type(module).forward(module, x)
    return differs(got, want, ulps, floor)


def differs(got, want: torch.Tensor, ulps: float, floor: float) -> str | None:
    """What differs between a fused forward's output and the original's on a probe (None if
    they agree): |got - want| <= rtol * (|want| + floor * max |want|), rtol 1e-5 in fp32/fp64,
    `ulps` units of the dtype's epsilon in bf16/fp16."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
        return (
            f"the fused forward gives {_describe(got)} where the original gives "
            f"{_describe(want)} on a probe input"
        )
    exact = want.dtype in (torch.float32, torch.float64)
    rtol = 1e-5 if exact else ulps * torch.finfo(want.dtype).eps
    w = want.double()
    diff = (got.double() - w).abs()
    if not bool((diff <= rtol * (w.abs() + floor * w.abs().max())).all()):
        return (
            f"the fused forward differs from the original on a probe input: max |difference| "
            f"{diff.max().item():.3g} (relative tolerance {rtol:.3g} for {want.dtype})"
        )
    return None


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{tuple(t.shape)} {t.dtype}"
    return type(t).__name__
