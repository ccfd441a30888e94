"""Argument checks of the normalisation ops: every message names the argument and what to do."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import check_floating  # shared by the families; op.py takes it from here


def check_input(name: str, t: Tensor) -> None:
    """An activation [..., N]: floating, with a last dim to normalise."""
    check_floating(name, t)
    if t.dim() == 0:
        raise ValueError(
            f"{name} must have at least one dimension ([..., N], the last one is normalised), "
            f"got a 0-d tensor; for a single value use {name}.reshape(1)"
        )


def check_same_device(x: Tensor, **others: Tensor | None) -> None:
    for name, t in others.items():
        if t is not None and t.device != x.device:
            raise ValueError(
                f"{name} is on {t.device} but x is on {x.device}; move them to the same device"
            )


def check_param(name: str, t: Tensor | None, x: Tensor) -> None:
    """A per-feature parameter (weight, bias): floating, 1-D of x's last-dim size, same device."""
    if t is None:
        return
    if not isinstance(t, Tensor):
        hint = ""
        if isinstance(t, (tuple, list)):  # F.layer_norm(x, normalized_shape, weight) habits
            hint = "; fusewise's ops take no normalized_shape, they normalise the last dim of x"
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}{hint}")
    check_floating(name, t)
    n = x.shape[-1]
    if t.shape != (n,):
        raise ValueError(
            f"{name} must have shape ({n},) to match the last dim of x "
            f"{tuple(x.shape)}, got {tuple(t.shape)}"
        )
    check_same_device(x, **{name: t})


_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_PARAM_TYPES = (Tensor, torch.nn.Parameter)


def plainly_valid(x: Tensor, *params: Tensor | None) -> bool:
    """The usual call, recognised in a few attribute reads (an eager call's host time is more than
    its kernel's at small sizes): x a plain dense tensor of a float dtype with a last dim, each
    param None or a plain tensor or Parameter, dense, floating, of shape (N,) on x's device.
    True only where check_input and check_param would pass; anything else (subclasses such as
    FakeTensor too) gets their full checks and messages."""
    if type(x) is not Tensor or x.layout is not torch.strided or x.dtype not in _FLOATS:
        return False
    if x.is_nested:  # strided layout too, but no sizes to read: the full checks say what is wrong
        return False
    shape = x.shape
    if not shape:
        return False
    n, device = shape[-1], x.device
    for p in params:
        if p is not None and not (
            type(p) in _PARAM_TYPES
            and p.layout is torch.strided
            and p.dtype in _FLOATS
            and len(p.shape) == 1
            and p.shape[0] == n
            and p.device == device
        ):
            return False
    return True


def check_eps(eps) -> float:
    """eps as a Python float: a real number (numpy scalars too), finite and >= 0. A tensor is
    refused rather than read: on a GPU reading it is a host sync on every call. float() rather
    than isinstance(numbers.Real): under torch.compile a numpy scalar is not a numbers.Real."""
    if type(eps) is float and 0.0 <= eps < math.inf:  # the usual call, in one comparison
        return eps
    value = None
    if eps is not None and not isinstance(eps, (bool, str, bytes, Tensor)):
        try:
            value = float(eps)
        except (TypeError, ValueError):  # complex, or anything else float() cannot read
            pass
    if value is None:
        if isinstance(eps, Tensor):
            got = "a Tensor; pass float(eps)"
        else:
            got = "None" if eps is None else type(eps).__name__
        raise TypeError(f"eps must be a number (a float such as 1e-5), got {got}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(
            f"eps must be a finite number >= 0, got {value} (it is added to the variance before "
            f"the square root)"
        )
    return value


def as_rows(x: Tensor) -> Tensor:
    """[..., N] -> [M, N] with unit stride along N (a view where possible, else a copy)."""
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if x2.stride(-1) != 1 and x2.shape[-1] > 1:
        x2 = x2.contiguous()
    return x2
