"""The norm classes of Hugging Face transformers models -> fusewise.ops.rms_norm, per instance.

A module whose class is in hf_norm_specs.SPECS (or a subclass of one that computes nothing of its
own) switches to a class deriving from FusedHFRMSNorm and its own class: the same object, the same
Parameters and state_dict keys, still an instance of the HF class (its extra_repr, isinstance
checks), with the fused forward first. The transformers class itself is never changed, so other
models built in the process are untouched. The spec the forward follows is kept on the instance
(_swap.set_attr), so unpatch removes it and copies carry it.

Every swap is checked before it is kept: the original forward and the fused one run on a probe
input; if they differ (a transformers version whose forward no longer matches the table, a
subclass changing an attribute forward reads), the class is restored and the module reported as
left alone with the difference. A module whose parameters are on the meta device cannot be probed
and is left alone until the weights are loaded.

Any other module whose class name ends in "Norm" (or "Norm1d"...) is reported as not recognised.
"""

from __future__ import annotations

import re

import torch

from .. import ops
from . import _swap
from .hf_norm_specs import LLAMA_ORDER, SPECS, NormSpec
from .report import UNRECOGNISED, Change
from .torch_norms import COMPUTE

SPEC_ATTR = "_fusewise_hf_norm_spec"
NOW = "fusewise.ops.rms_norm"
_NORM_NAME = re.compile(r"norm(\d+d)?$", re.IGNORECASE)
_PROBE_SHAPE = (2, 3)  # leading dims of the probe input [2, 3, N]


class FusedHFRMSNorm:
    """The fused forward of a swapped HF norm; first base of the swapped class (_swap.subclass),
    so its forward wins over the HF class's. Reads the instance's NormSpec."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        spec: NormSpec = getattr(self, SPEC_ATTR)
        eps = getattr(self, spec.eps_attr)
        weight = self.weight
        if spec.offset:
            weight = spec.offset + weight.float()  # Gemma: 1 + weight, in fp32 (autograd too)
        if spec.order == LLAMA_ORDER and weight.dtype != hidden_states.dtype:
            # HF rounds x_hat to x's dtype, then multiplies by a weight of another dtype (an fp32
            # weight with bf16 activations gives fp32): that computation exactly, x_hat fused.
            return weight * ops.rms_norm(hidden_states, None, eps)
        # One rounding to x's dtype. For LLAMA's order with weight in x's dtype HF rounds twice
        # (x_hat, then the product): the results differ by at most about one ulp.
        return ops.rms_norm(hidden_states, weight, eps)


def table_class(cls: type) -> tuple[type, NormSpec] | tuple[None, None]:
    """The first class in cls's MRO that the table knows, with its spec."""
    for c in cls.__mro__:
        spec = SPECS.get((c.__module__, c.__qualname__))
        if spec is not None:
            return c, spec
    return None, None


def own_compute(cls: type, base: type, spec: NormSpec) -> str | None:
    """'Owner.method' for the first method deciding what base computes that cls redefines."""
    own = next((m for m in COMPUTE + spec.calls if getattr(cls, m) is not getattr(base, m)), None)
    if own is None:
        return None
    owner = next(c for c in cls.__mro__ if own in vars(c))
    return f"{_swap.qualname(owner)}.{own}"


def patch_module(name: str, module: torch.nn.Module) -> Change | None:
    """The Change for one module: swapped or left alone if its class (or a base) is in the table,
    not recognised if its class name looks like a norm's, else None."""
    cls = type(module)
    base, spec = table_class(cls)
    if base is None:
        return _unrecognised(name, module)
    was = _swap.qualname(cls)
    own = own_compute(cls, base, spec)
    if own is not None:
        method = own.rsplit(".", 1)[1]
        return Change(name, was, None, f"its own {method} ({own}): swapping would drop that code")
    if "forward" in vars(module):
        return Change(
            name, was, None, "its forward is set on the instance (kernelize, a wrapper): kept"
        )
    unprobeable = _cannot_probe(module, spec)
    if unprobeable is not None:
        return Change(name, was, None, unprobeable)

    original = cls.forward
    _swap.set_attr(module, SPEC_ATTR, spec)
    _swap.swap_class(module, _swap.subclass(FusedHFRMSNorm, cls))
    try:
        mismatch = _probe(module, original)
    except Exception as e:  # anything the fused op (or the original) refuses on this module
        mismatch = f"could not be probed ({type(e).__name__}: {e})"
    if mismatch is not None:
        _swap.restore(module)
        return Change(name, was, None, f"{mismatch}; left as it is")
    reason = spec.describe()
    if cls is not base:
        reason = f"defines no forward of its own: still a {was}; {reason}"
    return Change(name, was, NOW, reason)


def _cannot_probe(module: torch.nn.Module, spec: NormSpec) -> str | None:
    problem = _swap.unprobeable(getattr(module, "weight", None), 1)
    if problem is not None:
        return problem
    if not hasattr(module, spec.eps_attr):
        return f"no attribute {spec.eps_attr!r} to read eps from"
    return None


def _tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance of the probe. fp32 (and fp64): 1e-5, room for a different summation
    order of the mean and rsqrt's rounding. bf16/fp16: two ulps (2 * eps relative): LLAMA's
    order rounds twice where the fused op rounds once (at most about one ulp apart)."""
    if dtype in (torch.float32, torch.float64):
        return 1e-5
    return 2 * torch.finfo(dtype).eps


def _probe(module: torch.nn.Module, original) -> str | None:
    """None if the fused forward matches `original` on a probe input, else what differs. The
    input comes from a private generator (the global RNG is untouched): [2, 3, N] in the weight's
    dtype, on its device."""
    weight = module.weight
    gen = torch.Generator().manual_seed(0x5EED)
    x = torch.randn(*_PROBE_SHAPE, weight.shape[0], generator=gen)
    x = x.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        want = original(module, x)
        got = type(module).forward(module, x)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
        return (
            f"the fused forward gives {_describe(got)} where the original gives "
            f"{_describe(want)} on a probe input"
        )
    rtol = _tolerance(want.dtype)
    diff = (got.double() - want.double()).abs()
    bound = rtol * want.double().abs() + rtol * 1e-3 * want.double().abs().max()
    if not bool((diff <= bound).all()):
        return (
            f"the fused forward differs from the original on a probe input: max |difference| "
            f"{diff.max().item():.3g} (relative tolerance {rtol:.3g} for {want.dtype})"
        )
    return None


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{tuple(t.shape)} {t.dtype}"
    return type(t).__name__


def _unrecognised(name: str, module: torch.nn.Module) -> Change | None:
    cls = type(module)
    if not _NORM_NAME.search(cls.__name__):
        return None
    if any(c.__module__.startswith("fusewise") for c in cls.__mro__):
        return None  # fusewise's own modules (fusewise.nn.LayerNorm built directly...)
    if isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
        return None  # torch_norms.py's
    return Change(
        name, _swap.qualname(cls), None, "no rule for this class; left as it is", UNRECOGNISED
    )
