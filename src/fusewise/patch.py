"""fusewise.patch(model): put the fused modules in place, in place, and say what changed.

torch.nn.LayerNorm and torch.nn.RMSNorm instances become fusewise.nn.LayerNorm / RMSNorm by
switching their class: the same object, the same Parameters (an optimizer built before the patch
keeps working), the same hooks and state_dict keys. A user's subclass that computes what torch's
class computes (it overrides only, say, extra_repr or _load_from_state_dict) switches to a class
deriving from both the user's class and fusewise's, so isinstance checks on the user's class
still hold. A subclass with its own forward or __call__ is left alone and reported, since
swapping it would drop the user's code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from . import nn as fnn

_SWAPS = {torch.nn.LayerNorm: fnn.LayerNorm, torch.nn.RMSNorm: fnn.RMSNorm}
# The methods that decide what a module computes when called. Any other override keeps torch's
# computation, which the fused module reproduces.
_COMPUTE = ("forward", "__call__", "_call_impl", "_wrapped_call_impl")


@dataclass
class Patched:
    name: str  # module path in the model ("" for the model itself)
    was: str  # the module's class, with its module: "torch.nn.modules.normalization.LayerNorm"
    now: str | None  # the fusewise class that now computes it; None: left alone (see reason)
    reason: str = ""


def patch(model: torch.nn.Module) -> list[Patched]:
    """Swap the norms of `model` for fusewise's, in place. Returns one entry per norm found
    (norms already fused are not listed, so a second call lists only those left alone)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    changes = []
    for name, module in model.named_modules():
        base = next((b for b in _SWAPS if isinstance(module, b)), None)
        if base is None or isinstance(module, tuple(_SWAPS.values())):
            continue
        cls, fused = type(module), _SWAPS[base]
        was, now = _qualname(cls), _qualname(fused)
        if cls is base:
            module.__class__ = fused
            changes.append(Patched(name, was, now))
            continue
        own = next((m for m in _COMPUTE if getattr(cls, m) is not getattr(base, m)), None)
        if own is not None:
            owner = next(c for c in cls.__mro__ if own in vars(c))
            reason = f"its own {own} ({_qualname(owner)}.{own}): swapping would drop that code"
            changes.append(Patched(name, was, None, reason))
            continue
        module.__class__ = _fused_subclass(cls, fused)
        reason = f"defines no forward of its own: still a {was}, computed by {now}"
        changes.append(Patched(name, was, now, reason))
    return changes


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@functools.cache
def _fused_subclass(user: type, fused: type) -> type:
    """The user's class with fusewise's forward (MRO: user's class, then fusewise's, then
    torch's), one class per pair. It has no importable name, so it pickles as the pair and is
    rebuilt on load."""

    def __reduce_ex__(self, protocol):
        _, _, *state = super(cls, self).__reduce_ex__(protocol)
        return (_new_fused, (user, fused), *state)

    namespace = {"__module__": __name__, "__qualname__": user.__qualname__}
    cls = type(user.__name__, (user, fused), {**namespace, "__reduce_ex__": __reduce_ex__})
    return cls


def _new_fused(user: type, fused: type):
    cls = _fused_subclass(user, fused)
    return cls.__new__(cls)
