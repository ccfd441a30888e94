"""Per-instance changes that `unpatch` can undo: a module's class switched, an attribute set.

Everything fusewise.patch does to a model goes through here, on the instance only (never on a
library's class: a class-level patch changes every other model built in the process). What was
there before is kept in the instance's own __dict__, so unpatch puts it back exactly, and copies
(pickle, deepcopy) carry it with them.
"""

from __future__ import annotations

import functools

import torch

ORIGINAL_CLASS = "_fusewise_original_class"
SAVED_ATTRS = "_fusewise_saved_attrs"
_MISSING = object()


def swap_class(module: torch.nn.Module, cls: type) -> None:
    """Switch module's class to cls (a subclass of its own, or a drop-in with the same state)."""
    module.__dict__.setdefault(ORIGINAL_CLASS, type(module))
    module.__class__ = cls


def set_attr(module: torch.nn.Module, name: str, value) -> None:
    """Set a plain (non-parameter, non-module) attribute on the instance, keeping what it was."""
    saved = module.__dict__.setdefault(SAVED_ATTRS, {})
    saved.setdefault(name, module.__dict__.get(name, _MISSING))
    module.__dict__[name] = value


def is_patched(module: torch.nn.Module) -> bool:
    return ORIGINAL_CLASS in module.__dict__ or SAVED_ATTRS in module.__dict__


def original_class(module: torch.nn.Module) -> type:
    return module.__dict__.get(ORIGINAL_CLASS, type(module))


def restore(module: torch.nn.Module) -> bool:
    """Undo swap_class and set_attr on this module; True if there was anything to undo."""
    undone = False
    saved = module.__dict__.pop(SAVED_ATTRS, None)
    if saved is not None:
        for name, value in saved.items():
            if value is _MISSING:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = value
        undone = True
    cls = module.__dict__.pop(ORIGINAL_CLASS, None)
    if cls is not None:
        module.__class__ = cls
        undone = True
    return undone


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@functools.cache
def subclass(*bases: type) -> type:
    """One class deriving from `bases` (in that order: the first one's forward wins), named as
    the first base that is not fusewise's (the user's or the library's class), so reprs,
    isinstance checks and HF's config.architectures see the class they know. One class per
    tuple of bases. It has no importable name, so it pickles as its bases and is rebuilt on
    load."""
    user = next((b for b in bases if not b.__module__.startswith("fusewise")), bases[0])

    def __reduce_ex__(self, protocol):
        _, _, *state = super(cls, self).__reduce_ex__(protocol)
        return (_new, bases, *state)

    namespace = {"__module__": user.__module__, "__qualname__": user.__qualname__}
    cls = type(user.__name__, bases, {**namespace, "__reduce_ex__": __reduce_ex__})
    return cls


def _new(*bases: type):
    cls = subclass(*bases)
    return cls.__new__(cls)
