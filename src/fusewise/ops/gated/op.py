"""The gated activations: one forward and one backward implementation, reached two ways.

* eager: ``_GatedFunction`` (torch.autograd.Function) calls them directly: torch.library's
  custom-op wrapper costs a fraction of a millisecond of host time per call (see
  ops/norms/op.py), more than the kernel takes at most sizes.
* compiled or recorded (_dispatch.through_custom_op): the custom ops fusewise::gated_fwd /
  fusewise::gated_bwd (fake + autograd registered) keep torch.compile(fullgraph=True) free of
  graph breaks and show one costed call to a TorchDispatchMode.
Each implementation runs the Triton kernel, or the eager reference with a warning naming the
reason (ops/_dispatch.py). No host sync, so both capture in CUDA graphs.

swiglu(gate, up) = silu(gate) * up; geglu(gate, up, approximate) = gelu(gate, approximate) * up
(reference.py). fp32 math, one rounding to the input dtype. Memory: autograd keeps gate and up
(the inputs, which the projections produced anyway) and nothing else; the backward recomputes
act(gate). The unfused ``act(gate) * up`` keeps act(gate) too (and, under HF's MLP, the product
is kept by down_proj either way). Traffic for n elements of s bytes (cost.py): forward reads
gate and up and writes y, 3·n·s; backward reads gate, up and dy and writes dgate and dup, 5·n·s.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _dispatch
from .._checks import check_floating
from . import launch, reference

APPROXIMATE = {"none": "gelu", "tanh": "gelu_tanh"}  # geglu's approximate -> the kernel's act
_NAMES = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu"}


def forward_impl(gate: Tensor, up: Tensor, act: str) -> Tensor:
    """gate, up: [M, N], unit stride along N. Returns act(gate) * up, contiguous [M, N]."""
    path = _dispatch.choose_path(_NAMES[act], gate, up)
    if path == _dispatch.REFERENCE:
        return reference.gated_forward(gate, up, act)
    return launch.gated_forward(gate, up, act)


def backward_impl(dy, gate, up, act: str, need_dgate: bool, need_dup: bool, out=None):
    """Returns (dgate, dup), each contiguous [M, N] or empty when not needed. out (internal,
    down.py): (dgate, dup) buffers to write instead, gate and up themselves allowed (launch.py);
    the reference path computes new ones and copies them in."""
    path = _dispatch.choose_path(_NAMES[act] + ".backward", dy, gate, up)
    if path != _dispatch.REFERENCE:
        return launch.gated_backward(dy, gate, up, act, need_dgate, need_dup, out=out)
    dg, du = reference.gated_backward(dy, gate, up, act, need_dgate, need_dup)
    if out is None:
        return dg, du
    return tuple(o.copy_(t) if t.numel() else t for o, t in zip(out, (dg, du)))


def gated(gate: Tensor, up: Tensor, act: str) -> Tensor:
    """act(gate) * up on [M, N] rows with autograd, through the custom op when compiling or
    recorded, else directly: without autograd.Function when no gradient is wanted."""
    if _dispatch.through_custom_op():
        return gated_fwd(gate, up, act)
    if not _dispatch.wants_grad(gate, up):
        return forward_impl(gate, up, act)
    return _GatedFunction.apply(gate, up, act)


class _GatedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, act):
        y = forward_impl(gate, up, act)
        _save(ctx, gate, up, act)
        return y

    @staticmethod
    def backward(ctx, dy):
        return _backward(ctx, dy, backward_impl)


def _save(ctx, gate, up, act):
    ctx.act = act
    ctx.save_for_backward(gate, up)


def _backward(ctx, dy, impl):
    _dispatch.refuse_create_graph(_NAMES[ctx.act], "activations")
    gate, up = ctx.saved_tensors
    need_dgate, need_dup = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dg, du = impl(_rows(dy), gate, up, ctx.act, need_dgate, need_dup)
    return (dg if need_dgate else None), (du if need_dup else None), None


def _rows(t: Tensor) -> Tensor:
    """[...] -> [M, N] with unit stride along N: a view where possible, else one copy (an input
    expanded along its last dim, a transposed one)."""
    if t.dim() == 0:
        t = t.reshape(1, 1)
    elif t.dim() != 2:
        t = t.reshape(-1, t.shape[-1])
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        t = t.contiguous()
    return t


def _check_layout(**tensors: Tensor) -> None:
    """What the kernels assume; the custom ops check it, as they can be called directly."""
    for name, t in tensors.items():
        if t.dim() != 2 or (t.stride(-1) != 1 and t.shape[-1] > 1):
            raise ValueError(
                f"{name} must be 2-D [M, N] with unit stride along N for the gated kernels, got "
                f"shape {tuple(t.shape)} strides {t.stride()}; call fusewise.ops.swiglu / geglu, "
                f"which arrange it"
            )


@torch.library.custom_op("fusewise::gated_fwd", mutates_args=())
def gated_fwd(gate: Tensor, up: Tensor, act: str) -> Tensor:
    _check_layout(gate=gate, up=up)
    return forward_impl(gate, up, act)


@gated_fwd.register_fake
def _(gate, up, act):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("fusewise::gated_bwd", mutates_args=())
def gated_bwd(
    dy: Tensor, gate: Tensor, up: Tensor, act: str, need_dgate: bool, need_dup: bool
) -> tuple[Tensor, Tensor]:
    _check_layout(dy=dy, gate=gate, up=up)
    return backward_impl(dy, gate, up, act, need_dgate, need_dup)


@gated_bwd.register_fake
def _(dy, gate, up, act, need_dgate, need_dup):
    dg = gate.new_empty(gate.shape) if need_dgate else gate.new_empty(0)
    du = gate.new_empty(gate.shape) if need_dup else gate.new_empty(0)
    return dg, du


def _setup_context(ctx, inputs, output):
    gate, up, act = inputs
    _save(ctx, gate, up, act)


def _custom_op_backward(ctx, dy):
    return _backward(ctx, dy, gated_bwd)


torch.library.register_autograd(
    "fusewise::gated_fwd", _custom_op_backward, setup_context=_setup_context
)


# --- the public functions ---------------------------------------------------------------------


def _check(gate: Tensor, up: Tensor) -> None:
    check_floating("gate", gate)
    check_floating("up", up)
    if up.shape != gate.shape:
        raise ValueError(
            f"up must have gate's shape {tuple(gate.shape)}, got {tuple(up.shape)} (no "
            f"broadcasting: expand one of them first)"
        )
    if up.dtype != gate.dtype:
        raise TypeError(
            f"up must have gate's dtype {gate.dtype}, got {up.dtype}; cast one of them first"
        )
    if up.device != gate.device:
        raise ValueError(
            f"up is on {up.device} but gate is on {gate.device}; move them to the same device"
        )


def _apply(gate: Tensor, up: Tensor, act: str) -> Tensor:
    if gate.numel() == 0:
        return gate * up  # empty; keeps the autograd edges, so backward gives empty gradients
    return gated(_rows(gate), _rows(up), act).view(gate.shape)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up in one pass (SwiGLU, the Llama MLP's activation). gate, up: same shape and
    dtype (float32, bfloat16, float16), any layout. Returns gate's shape and dtype, contiguous.
    Differentiable in both; the backward recomputes silu(gate) rather than keeping it."""
    _check(gate, up)
    return _apply(gate, up, "silu")


def geglu(gate: Tensor, up: Tensor, approximate: str = "none") -> Tensor:
    """gelu(gate, approximate) * up in one pass (GeGLU, Gemma's MLP activation with "tanh").
    approximate: "none" (exact, erf) or "tanh", as in F.gelu. Otherwise as swiglu."""
    if approximate not in APPROXIMATE:
        raise ValueError(
            f"approximate must be 'none' or 'tanh' (as in F.gelu), got {approximate!r}"
        )
    _check(gate, up)
    return _apply(gate, up, APPROXIMATE[approximate])
