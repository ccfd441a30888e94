"""torch.nn.LayerNorm and torch.nn.RMSNorm instances -> fusewise.nn.LayerNorm / RMSNorm.

The class is switched: the same object, the same Parameters (an optimizer built before the patch
keeps working), the same hooks and state_dict keys. A user's subclass that computes what torch's
class computes (it overrides only, say, extra_repr or _load_from_state_dict) switches to a class
deriving from both the user's class and fusewise's, so isinstance checks on the user's class
still hold. A subclass with its own forward or __call__ is left alone and reported, since
swapping it would drop the user's code.
"""

from __future__ import annotations

import torch

from .. import nn as fnn
from . import _probe, _swap
from .report import Change

SWAPS = {torch.nn.LayerNorm: fnn.LayerNorm, torch.nn.RMSNorm: fnn.RMSNorm}
# The methods that decide what a module computes when called. Any other override keeps torch's
# computation, which the fused module reproduces.
COMPUTE = ("forward", "__call__", "_call_impl", "_wrapped_call_impl")


def patch_module(name: str, module: torch.nn.Module) -> Change | None:
    """The Change for one module if it is a torch norm, else None (fused ones are skipped)."""
    base = next((b for b in SWAPS if isinstance(module, b)), None)
    if base is None or isinstance(module, tuple(SWAPS.values())):
        return None
    cls, fused = type(module), SWAPS[base]
    was, now = _swap.qualname(cls), _swap.qualname(fused)
    kept = _probe.code_of_its_own(module, base, COMPUTE)
    if kept is not None:
        return Change(name, was, None, kept)
    if cls is base:
        _swap.swap_class(module, fused)
        return Change(name, was, now)
    _swap.swap_class(module, _swap.subclass(cls, fused))
    return Change(
        name, was, now, f"defines no forward of its own: still a {was}, computed by {now}"
    )
