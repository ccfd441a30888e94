"""Eager PyTorch oracles of the gated activations: what the fused ops compute, the float64
comparison of the tests, and (gated_forward, gated_backward) the path the ops take, with a
warning, when the Triton kernel cannot run. torch only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up, computed in float32 (float64 stays float64), gate's dtype out."""
    acc = torch.promote_types(gate.dtype, torch.float32)
    return (F.silu(gate.to(acc)) * up.to(acc)).to(gate.dtype)


def geglu(gate: Tensor, up: Tensor, approximate: str = "none") -> Tensor:
    """gelu(gate, approximate) * up, computed in float32 (float64 stays), gate's dtype out."""
    acc = torch.promote_types(gate.dtype, torch.float32)
    return (F.gelu(gate.to(acc), approximate=approximate) * up.to(acc)).to(gate.dtype)


def _act_and_grad(g: Tensor, act: str) -> tuple[Tensor, Tensor]:
    """(act(g), act'(g)) in g's dtype."""
    if act == "silu":
        s = torch.sigmoid(g)
        return g * s, s * (1 + g * (1 - s))
    if act == "gelu":
        cdf = 0.5 * (1 + torch.erf(g * 0.7071067811865476))
        return g * cdf, cdf + g * 0.3989422804014327 * torch.exp(-0.5 * g * g)
    if act == "gelu_tanh":
        k = 0.7978845608028654
        t = torch.tanh(k * (g + 0.044715 * g**3))
        da = 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * k * (1 + 3 * 0.044715 * g * g)
        return 0.5 * g * (1 + t), da
    raise ValueError(f"act must be 'silu', 'gelu' or 'gelu_tanh', got {act!r}")


def gated_forward(gate: Tensor, up: Tensor, act: str) -> Tensor:
    """act(gate) * up, fp32 math (float64 stays float64), gate's dtype out."""
    acc = torch.promote_types(gate.dtype, torch.float32)
    a, _ = _act_and_grad(gate.to(acc), act)
    return (a * up.to(acc)).to(gate.dtype)


def gated_backward(
    dy: Tensor, gate: Tensor, up: Tensor, act: str, need_dgate: bool = True, need_dup: bool = True
) -> tuple[Tensor, Tensor]:
    """(dgate, dup) of y = act(gate) * up, the activation recomputed; one not needed is empty."""
    acc = torch.promote_types(gate.dtype, torch.float32)
    g, dyf = gate.to(acc), dy.to(acc)
    a, da = _act_and_grad(g, act)
    empty = gate.new_empty(0)
    dg = (dyf * up.to(acc) * da).to(gate.dtype) if need_dgate else empty
    du = (dyf * a).to(gate.dtype) if need_dup else empty
    return dg, du
