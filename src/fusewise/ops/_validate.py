"""Argument checks shared by the fused ops: every message names the argument and what to do."""

from __future__ import annotations

from torch import Tensor


def check_floating(name: str, t: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (float32, bfloat16 or float16), "
                        f"got {t.dtype}")  # fmt: skip


def check_same_device(x: Tensor, **others: Tensor | None) -> None:
    for name, t in others.items():
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; "
                             f"move them to the same device")  # fmt: skip


def check_param(name: str, t: Tensor | None, x: Tensor) -> None:
    """A per-feature parameter (weight, bias): floating, 1-D of x's last-dim size, same device."""
    if t is None:
        return
    check_floating(name, t)
    n = x.shape[-1]
    if t.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) to match the last dim of x "
                         f"{tuple(x.shape)}, got {tuple(t.shape)}")  # fmt: skip
    check_same_device(x, **{name: t})


def as_rows(x: Tensor) -> Tensor:
    """[..., N] -> [M, N] with unit stride along N (a view where possible, else a copy)."""
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if x2.stride(-1) != 1 and x2.shape[-1] > 1:
        x2 = x2.contiguous()
    return x2
