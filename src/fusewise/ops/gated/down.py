"""An MLP's gated product and its down projection as one autograd node, for fusewise.patch.

    y = F.linear(act(gate) * up, weight, bias)      # gate, up: [..., I]; weight: [H, I]

Memory: autograd keeps gate, up, weight and bias, not the product h = act(gate) * up (an
nn.Linear down projection would keep it): the backward recomputes h with the forward kernel,
takes dweight = dy^T @ h and dbias = sum of dy over tokens, then dh = dy @ weight, frees h and
runs the gated backward on dh. One [tokens, I] tensor less per MLP in the saved activations;
the backward's peak is gate, up, h and dh (4 [tokens, I] tensors) while dweight is computed.

overwrite_inputs=True also writes dgate and dup over gate and up (launch.gated_backward's out=),
so the gated backward allocates nothing of their size. Only for a caller that owns gate and up:
fresh outputs of the input projections that nothing else holds (hf_mlp.py decides). A second
backward through the same graph (retain_graph=True) then raises a RuntimeError that says so
instead of reading gradients as activations; the version counters of gate and up are bumped
too, for anything else that kept them. The public ops (swiglu, geglu) never overwrite their
inputs. Neither has a second derivative (create_graph=True raises: _dispatch.refuse_create_graph).

Eager only: under torch.compile or a dispatch mode (_dispatch.through_custom_op) the caller keeps
the custom op followed by its own down projection. Same kernels and reference fallback as op.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _dispatch
from .op import _NAMES, _rows, backward_impl, forward_impl

_SECOND_BACKWARD = (
    "fusewise.patch's fused MLP has run its backward once on this graph and written the "
    "gradients of gate and up over them (one [tokens, intermediate] buffer fewer each), so a "
    "second backward through it (retain_graph=True, two losses sharing one forward) cannot run. "
    "Sum the losses and call backward once, or use fusewise.unpatch(model) / patch with "
    "activations=False for this model."
)


def gated_down(
    gate: Tensor,
    up: Tensor,
    act: str,
    weight: Tensor,
    bias: Tensor | None,
    *,
    overwrite_inputs: bool = False,
) -> Tensor:
    """F.linear(act(gate) * up, weight, bias) with the product recomputed in the backward.
    gate, up: [..., I], same shape, dtype and device, unit stride along I (the projections'
    outputs, or the two halves of a fused one); weight: [H, I] and bias: [H] or None in gate's
    dtype. act: the kernel's ("silu", "gelu", "gelu_tanh"). Returns [..., H]."""
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.dim() < 1:
        raise ValueError(
            f"gate and up must have one shape and dtype, got {tuple(gate.shape)} {gate.dtype} "
            f"and {tuple(up.shape)} {up.dtype}"
        )
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != gate.dtype:
            raise TypeError(f"{name} must be {gate.dtype} (gate's dtype), got {t.dtype}")
    return _GatedDownFunction.apply(gate, up, weight, bias, act, overwrite_inputs)


class _GatedDownFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, weight, bias, act, overwrite_inputs):
        h = forward_impl(_rows(gate), _rows(up), act)  # [M, I]
        y = F.linear(h, weight, bias)
        ctx.act, ctx.overwrite_inputs = act, overwrite_inputs
        ctx.save_for_backward(gate, up, weight, bias)
        return y.view(*gate.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        _dispatch.refuse_create_graph(_NAMES[ctx.act], "activations")
        # Said here, before the unpack: a saved-tensor hook that packs by reference skips the
        # version check, and a second backward would read gradients as activations.
        if getattr(ctx, "overwritten", False):
            raise RuntimeError(_SECOND_BACKWARD)
        gate, up, weight, bias = ctx.saved_tensors
        need_dgate, need_dup, need_dw, need_db = ctx.needs_input_grad[:4]
        g2, u2 = _rows(gate), _rows(up)
        dy2 = dy.reshape(-1, dy.shape[-1])  # [M, H], any strides (mm takes them)
        dw = db = dgate = dup = None
        if need_db:
            db = dy2.sum(0)
        if need_dw:
            h = forward_impl(g2, u2, ctx.act)
            dw = dy2.t().mm(h)
            del h  # before dh: the two are never alive with dgate and dup
        if need_dgate or need_dup:
            dh = dy2.mm(weight)
            out = _outputs(gate, up, g2, u2) if ctx.overwrite_inputs else None
            dg2, du2 = backward_impl(dh, g2, u2, ctx.act, need_dgate, need_dup, out=out)
            del dh
            if out is not None:
                # gate and up now hold their gradients: a later backward, or unpack, must fail
                ctx.overwritten = True
                torch.autograd.graph.increment_version(gate)
                torch.autograd.graph.increment_version(up)
            dgate = dg2.view(gate.shape) if need_dgate else None
            dup = du2.view(up.shape) if need_dup else None
        return dgate, dup, dw, db, None, None


def _outputs(gate: Tensor, up: Tensor, g2: Tensor, u2: Tensor):
    """(g2, u2) as the gated backward's out= buffers when they are views of gate and up (the
    kernels write over them), else None: _rows copied one (not the layout of a projection's
    output), and a write into the copy would save nothing."""
    if g2.data_ptr() == gate.data_ptr() and u2.data_ptr() == up.data_ptr():
        return g2.detach(), u2.detach()
    return None
