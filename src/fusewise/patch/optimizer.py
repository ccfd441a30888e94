"""torch.optim.AdamW -> fusewise.optim.AdamW in place (placeholder: being written)."""

from __future__ import annotations

import torch

from .report import Change


def patch_optimizer(optimizer: torch.optim.Optimizer) -> Change:
    raise NotImplementedError


def unpatch_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    raise NotImplementedError
