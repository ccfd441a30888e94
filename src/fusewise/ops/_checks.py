"""Argument checks every op family makes the same way: each message names the argument and says
what to do."""

from __future__ import annotations

import torch
from torch import Tensor


def check_floating(name: str, t: Tensor) -> None:
    """A dense floating-point torch.Tensor."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense tensor, got {t.layout}; use {name}.to_dense()")
    if not t.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (float32, bfloat16 or float16), got {t.dtype}"
        )
