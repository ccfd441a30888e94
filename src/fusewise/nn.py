"""Drop-in modules over the fused ops: same constructor arguments, parameters and state_dict keys
as torch.nn.LayerNorm / torch.nn.RMSNorm, so checkpoints load either way."""

from __future__ import annotations

import math

import torch

from . import ops


def _as_last_dim(module: str, x, normalized_shape) -> tuple[torch.Tensor, int]:
    """x [..., *normalized_shape] -> ([..., n], n): the normalised dims flattened into one."""
    shape = tuple(normalized_shape)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{module} expects a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape[-len(shape) :]) != shape:
        raise ValueError(
            f"{module} expects input ending in normalized_shape {shape}, got {tuple(x.shape)}"
        )
    n = math.prod(shape)
    return x.reshape(*x.shape[: x.dim() - len(shape)], n), n


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm computed by fusewise.ops.layer_norm (normalized_shape may have several
    dims; weight and bias may be views)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, n = _as_last_dim("LayerNorm", x, self.normalized_shape)
        flat = lambda p: p.reshape(n) if p is not None else None  # noqa: E731
        return ops.layer_norm(x2, flat(self.weight), flat(self.bias), self.eps).view(x.shape)


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm computed by fusewise.ops.rms_norm. eps=None means torch's default, the
    eps of the op-math dtype (float32's for bf16/fp16 input), as in torch.nn.RMSNorm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2, n = _as_last_dim("RMSNorm", x, self.normalized_shape)
        w = self.weight.reshape(n) if self.weight is not None else None
        return ops.rms_norm(x2, w, self.eps).view(x.shape)


class LinearCrossEntropyLoss(torch.nn.Module):
    """Module form of fusewise.ops.linear_cross_entropy:
    forward(hidden, weight, target, bias=None)."""

    def __init__(
        self,
        *,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        z_loss: float = 0.0,
        softcap: float | None = None,
        fp32_accumulate: bool = False,
        chunk_size: int | None = None,
    ):
        super().__init__()
        self.kw = dict(
            ignore_index=ignore_index,
            reduction=reduction,
            label_smoothing=label_smoothing,
            z_loss=z_loss,
            softcap=softcap,
            fp32_accumulate=fp32_accumulate,
            chunk_size=chunk_size,
        )

    def forward(self, hidden, weight, target, bias=None):
        return ops.linear_cross_entropy(hidden, weight, target, bias, **self.kw)
