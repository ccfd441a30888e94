"""fusewise.patch(model): put the fused modules in place, in place, and say what changed.

torch.nn.LayerNorm and torch.nn.RMSNorm instances become fusewise.nn.LayerNorm / RMSNorm by
switching their class: the same object, the same Parameters (an optimizer built before the patch
keeps working), the same hooks and state_dict keys. A subclass with its own forward is left alone
and reported, since swapping it would drop the user's code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import nn as fnn

_SWAPS = {torch.nn.LayerNorm: fnn.LayerNorm, torch.nn.RMSNorm: fnn.RMSNorm}


@dataclass
class Patched:
    name: str  # module path in the model ("" for the model itself)
    was: str
    now: str | None  # None: left alone (see reason)
    reason: str = ""


def patch(model: torch.nn.Module) -> list[Patched]:
    """Swap the norms of `model` for fusewise's, in place. Returns one entry per norm found."""
    changes = []
    for name, module in model.named_modules():
        cls = type(module)
        if cls in _SWAPS:
            module.__class__ = _SWAPS[cls]
            changes.append(Patched(name, cls.__qualname__, _SWAPS[cls].__qualname__))
            continue
        base = next((b for b in _SWAPS if isinstance(module, b)), None)
        if base is not None and not isinstance(module, tuple(_SWAPS.values())):
            changes.append(Patched(name, f"{cls.__module__}.{cls.__qualname__}", None,
                                   f"a subclass of torch.nn.{base.__name__} with its own code"))  # fmt: skip
    return changes
