"""Argument checks of linear_cross_entropy: every message names the argument and says what to do.

check_args looks at Python values and tensor metadata only, so torch.compile traces it without a
graph break and a GPU call never syncs. check_targets reads the target's values: the CPU path
only (on a GPU a bad target makes the loss NaN instead, see kernels.py).
"""

from __future__ import annotations

import math
import operator

import torch
from torch import Tensor

REDUCTIONS = ("mean", "sum", "none")


def check_args(
    hidden,
    weight,
    target,
    bias,
    ignore_index,
    reduction,
    label_smoothing,
    z_loss,
    softcap,
    fp32_accumulate,
    chunk_size,
):
    """Raise on a wrong argument; else return opts = (ignore_index, label_smoothing, z_loss,
    softcap) and cfg = (fp32_accumulate, chunk_size, 0 for the default) as Python numbers."""
    _check_tensors(hidden, weight, target, bias)
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    ignore_index = _integer("ignore_index", ignore_index)
    smoothing = _real("label_smoothing", label_smoothing, lambda x: 0 <= x <= 1, "in [0, 1]")
    z_loss = _real("z_loss", z_loss, lambda x: x >= 0, ">= 0 (0 turns it off)")
    if softcap is not None:
        softcap = _real("softcap", softcap, lambda x: x > 0, "> 0, or None for no cap")
    if not isinstance(fp32_accumulate, bool):
        raise TypeError(f"fp32_accumulate must be True or False, got {fp32_accumulate!r}")
    if chunk_size is not None:
        chunk_size = _integer("chunk_size", chunk_size)
        if chunk_size < 1:
            raise ValueError(
                f"chunk_size must be a positive int (tokens per chunk) or None for "
                f"the default, got {chunk_size}"
            )
    return (ignore_index, smoothing, z_loss, softcap), (fp32_accumulate, chunk_size or 0)


def check_targets(target: Tensor, ignore_index: int, v: int) -> None:
    """Every target in [0, V) or ignore_index (reads the values: a host sync on a GPU)."""
    bad = (target != ignore_index) & ((target < 0) | (target >= v))
    if bad.any():
        where = bad.nonzero()[0].tolist()  # [] for a 0-d target
        index = f"[{', '.join(map(str, where))}]" if where else ""
        raise ValueError(
            f"target{index} = {int(target[bad][0])} is outside [0, {v}) and is not "
            f"ignore_index ({ignore_index}): fix the label, or set it to "
            f"ignore_index to leave the token out"
        )


def _check_tensors(hidden, weight, target, bias):
    for name, t in (("hidden", hidden), ("weight", weight), ("target", target), ("bias", bias)):
        if not isinstance(t, Tensor) and (t is not None or name != "bias"):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("hidden", hidden), ("weight", weight)):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if hidden.dim() == 0:
        raise ValueError(
            "hidden must be [N, d] or [B, T, d] (any [..., d]; [d] for one token), got a 0-d tensor"
        )
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"weight must be [V, d] with d = hidden.shape[-1] = {hidden.shape[-1]}, "
            f"got {tuple(weight.shape)}"
        )
    if weight.shape[0] == 0:
        raise ValueError("weight must have at least one row (one per class), got 0 rows")
    if hidden.dtype != weight.dtype:
        raise TypeError(
            f"hidden and weight must share a dtype, got {hidden.dtype} and "
            f"{weight.dtype}: cast with hidden.to(weight.dtype)"
        )
    if target.dtype not in (torch.int64, torch.int32) or target.shape != hidden.shape[:-1]:
        raise ValueError(
            f"target must be an integer tensor (int64 or int32) of shape "
            f"hidden.shape[:-1] = {tuple(hidden.shape[:-1])}, one class per token, "
            f"got {target.dtype} {tuple(target.shape)}"
        )
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != weight.dtype):
        raise ValueError(
            f"bias must be [{weight.shape[0]}] in {weight.dtype} (one per row of "
            f"weight), got {bias.dtype} {tuple(bias.shape)}"
        )
    for name, t in (("weight", weight), ("target", target), ("bias", bias)):
        if t is not None and t.device != hidden.device:
            raise ValueError(
                f"{name} is on {t.device} but hidden is on {hidden.device}; move "
                f"them to the same device"
            )


def _is_bool(x) -> bool:
    # True would pass as 1: a flag given where a number belongs is a mistake, not a value
    return type(x).__name__ in ("bool", "bool_") or isinstance(x, Tensor) and x.dtype == torch.bool


def _integer(name: str, x) -> int:
    """Any integral value: int, numpy or torch integer (operator.index); not bool or float."""
    if not _is_bool(x):
        try:
            return operator.index(x)
        except TypeError:
            pass
    raise TypeError(f"{name} must be an integer, got {x!r}")


def _real(name: str, x, ok, need: str) -> float:
    """A finite real number satisfying ok; not bool, not a string."""
    value = None
    if not _is_bool(x) and not isinstance(x, (str, bytes)):
        try:
            value = float(x)
        except (TypeError, ValueError, RuntimeError):
            pass
    if value is None or not math.isfinite(value) or not ok(value):
        raise ValueError(f"{name} must be a finite number {need}, got {x!r}")
    return value
