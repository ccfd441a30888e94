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
from . import _probe, _swap
from .hf_norm_specs import LLAMA_ORDER, SPECS, NormSpec
from .report import UNRECOGNISED, Change
from .torch_norms import COMPUTE

SPEC_ATTR = "_fusewise_hf_norm_spec"
NOW = "fusewise.ops.rms_norm"
_NORM_NAME = re.compile(r"norm(\d+d)?$", re.IGNORECASE)


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


def patch_module(name: str, module: torch.nn.Module) -> Change | None:
    """The Change for one module: swapped or left alone if its class (or a base) is in the table,
    not recognised if its class name looks like a norm's, else None."""
    cls = type(module)
    base, spec = table_class(cls)
    if base is None:
        return _unrecognised(name, module)
    was = _swap.qualname(cls)
    kept = _probe.code_of_its_own(module, base, COMPUTE + spec.calls)
    kept = kept or _cannot_probe(module, spec)
    if kept is not None:
        return Change(name, was, None, kept)

    _swap.set_attr(module, SPEC_ATTR, spec)
    # bf16/fp16: two ulps, LLAMA's order rounding twice where the fused op rounds once (at most
    # about one ulp apart); the floor of 1e-3 of the largest value covers fp32's summation order
    mismatch = _probe.swap_checked(
        module, FusedHFRMSNorm, module.weight, module.weight.shape[0], ulps=2, floor=1e-3
    )
    if mismatch is not None:
        return Change(name, was, None, f"{mismatch}; left as it is")
    reason = spec.describe()
    if cls is not base:
        reason = f"defines no forward of its own: still a {was}; {reason}"
    return Change(name, was, NOW, reason)


def _cannot_probe(module: torch.nn.Module, spec: NormSpec) -> str | None:
    problem = _probe.unprobeable(getattr(module, "weight", None), 1)
    if problem is not None:
        return problem
    if not hasattr(module, spec.eps_attr):
        return f"no attribute {spec.eps_attr!r} to read eps from"
    return None


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
