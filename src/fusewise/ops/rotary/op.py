"""The rotary position embedding: one forward and one backward implementation, reached two ways.

* eager: ``_RotaryFunction`` (torch.autograd.Function) calls them directly: torch.library's
  custom-op wrapper costs a fraction of a millisecond of host time per call (see
  ops/norms/op.py), more than the kernel takes at most sizes.
* compiled or recorded (_dispatch.through_custom_op): the custom ops fusewise::rotary_fwd /
  fusewise::rotary_bwd (fake + autograd registered) keep torch.compile(fullgraph=True) free of
  graph breaks and show one costed call to a TorchDispatchMode.
Each implementation runs the Triton kernel, or the eager reference with a warning naming the
reason (ops/_dispatch.py). No host sync, so both capture in CUDA graphs.

apply_rotary(q, k, cos, sin) equals HF's apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
on the first Dr = cos.shape[-1] features, the rest passed through (reference.py):
    q_out = q * cos + rotate_half(q) * sin        (GPT-J's rotate_every_two with interleaved)
fp32 math, one rounding to the input dtype (HF rounds each bf16 product). Memory: autograd keeps
cos and sin only, the backward being the transposed rotation of the output gradients; HF's
eager formula keeps nothing of [B, H, S, D] either (its products' gradients need only cos and
sin) but runs five kernels a tensor (products, neg, cat, sum). Traffic (cost.py): reads q, k,
cos, sin once, writes q_out and k_out; the backward the same with the gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _dispatch
from .._checks import check_floating
from . import launch, reference


def forward_impl(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool):
    """q [B, Hq, S, D], k [B, Hkv, S, D], cos, sin [B | 1, S, Dr]. Returns (R q, R k), each in its
    input's layout when dense, else contiguous (launch.in_and_out)."""
    path = _dispatch.choose_path("apply_rotary", q, k)
    if path == _dispatch.REFERENCE:
        q_out, k_out = reference.rotary_forward(q, k, cos, sin, interleaved)
        return _in_layout(q_out, q), _in_layout(k_out, k)
    return launch.rotary(q, k, cos, sin, interleaved)


def backward_impl(dq_out, dk_out, cos, sin, interleaved: bool, need_dq: bool, need_dk: bool):
    """Returns (dq, dk), each in its gradient's layout when dense, or empty when not needed."""
    path = _dispatch.choose_path("apply_rotary.backward", dq_out, dk_out)
    if path == _dispatch.REFERENCE:
        dq, dk = reference.rotary_backward(dq_out, dk_out, cos, sin, interleaved, need_dq, need_dk)
        return (_in_layout(dq, dq_out) if need_dq else dq), (
            _in_layout(dk, dk_out) if need_dk else dk
        )
    return launch.rotary(dq_out, dk_out, cos, sin, interleaved, True, need_dq, need_dk)


def _in_layout(out: Tensor, like: Tensor) -> Tensor:
    """out with the strides the kernel would have given it (the fake tensors promise them)."""
    target = launch.in_and_out(like, True)[1]
    return out if out.stride() == target.stride() else target.copy_(out)


def rotary(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool):
    """(q_out, k_out) with autograd, cos and sin [B | 1, S, Dr], through the custom op when
    compiling or recorded, else directly: without autograd.Function when no gradient is wanted
    (inference, a forward under no_grad)."""
    if _dispatch.through_custom_op():
        return rotary_fwd(q, k, cos, sin, interleaved)
    if not _dispatch.wants_grad(q, k):
        return forward_impl(q, k, cos, sin, interleaved)
    return _RotaryFunction.apply(q, k, cos, sin, interleaved)


class _RotaryFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, interleaved):
        out = forward_impl(q, k, cos, sin, interleaved)
        _save(ctx, cos, sin, interleaved)
        return out

    @staticmethod
    def backward(ctx, dq_out, dk_out):
        if torch.is_grad_enabled():  # create_graph=True: dq, dk must carry a graph
            return _backward(ctx, dq_out, dk_out, _differentiable_backward)
        return _backward(ctx, dq_out, dk_out, backward_impl)


class _TransposedRotary(torch.autograd.Function):
    """(Rᵀ dq_out, Rᵀ dk_out) as an op autograd differentiates again, for a second derivative
    (a gradient penalty, a Hessian-vector product). Rotary is linear: the derivative of Rᵀ g with
    respect to g is R, the forward itself (with its own autograd, so any order works), and there
    is no other term (cos and sin take no gradient)."""

    @staticmethod
    def forward(ctx, dq_out, dk_out, cos, sin, interleaved):
        _save(ctx, cos, sin, interleaved)
        return backward_impl(dq_out, dk_out, cos, sin, interleaved, True, True)

    @staticmethod
    def backward(ctx, ddq, ddk):
        cos, sin = ctx.saved_tensors
        return *rotary(ddq, ddk, cos, sin, ctx.interleaved), None, None, None


def _differentiable_backward(dq_out, dk_out, cos, sin, interleaved, need_dq, need_dk):
    return _TransposedRotary.apply(dq_out, dk_out, cos, sin, interleaved)


def _save(ctx, cos, sin, interleaved):
    ctx.interleaved = interleaved
    ctx.save_for_backward(cos, sin)  # nothing of [B, H, S, D]: the backward needs only these


def _backward(ctx, dq_out, dk_out, impl):
    cos, sin = ctx.saved_tensors
    need_dq, need_dk = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dq, dk = impl(dq_out, dk_out, cos, sin, ctx.interleaved, need_dq, need_dk)
    return (dq if need_dq else None), (dk if need_dk else None), None, None, None


def _check_layout(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> None:
    """What the kernel assumes; the custom ops check it, as they can be called directly."""
    ok = q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and cos.shape == sin.shape
    if ok:
        (b, _, s, d), (bc, sc, dr) = q.shape, cos.shape
        ok = k.shape[0] == b and k.shape[2:] == (s, d) and bc in (1, b) and sc == s
        ok = ok and dr % 2 == 0 and 2 <= dr <= d
    if not ok:
        raise ValueError(
            f"the rotary kernel takes q [B, Hq, S, D], k [B, Hkv, S, D] and cos, sin [B or 1, S, "
            f"Dr] (Dr even, 2 <= Dr <= D), got q {tuple(q.shape)}, k {tuple(k.shape)}, cos "
            f"{tuple(cos.shape)}, sin {tuple(sin.shape)}; call fusewise.ops.apply_rotary, which "
            f"arranges them"
        )


def _fake_output(like: Tensor, needed: bool = True) -> Tensor:
    return launch.in_and_out(like, needed)[1]


@torch.library.custom_op("fusewise::rotary_fwd", mutates_args=())
def rotary_fwd(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool
) -> tuple[Tensor, Tensor]:
    _check_layout(q, k, cos, sin)
    return forward_impl(q, k, cos, sin, interleaved)


@rotary_fwd.register_fake
def _(q, k, cos, sin, interleaved):
    return _fake_output(q), _fake_output(k)


@torch.library.custom_op("fusewise::rotary_bwd", mutates_args=())
def rotary_bwd(
    dq_out: Tensor,
    dk_out: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
    need_dq: bool,
    need_dk: bool,
) -> tuple[Tensor, Tensor]:
    _check_layout(dq_out, dk_out, cos, sin)
    return backward_impl(dq_out, dk_out, cos, sin, interleaved, need_dq, need_dk)


@rotary_bwd.register_fake
def _(dq_out, dk_out, cos, sin, interleaved, need_dq, need_dk):
    return _fake_output(dq_out, need_dq), _fake_output(dk_out, need_dk)


def _setup_context(ctx, inputs, output):
    q, k, cos, sin, interleaved = inputs
    _save(ctx, cos, sin, interleaved)


def _custom_op_backward(ctx, dq_out, dk_out):
    return _backward(ctx, dq_out, dk_out, rotary_bwd)


torch.library.register_autograd(
    "fusewise::rotary_fwd", _custom_op_backward, setup_context=_setup_context
)


# --- the public function ----------------------------------------------------------------------


_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _plainly_valid(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """The usual call, recognised in a few attribute reads (the eager call's host time is the
    kernel's at Llama's sizes): plain dense tensors of a float dtype on q's device, q and k 4-D
    of one dtype and matching B, S, D, cos and sin of one shape not requiring grad, an even Dr
    in [2, D]. Anything else gets _check's full checks and their messages. Tensor subclasses
    (FakeTensor under torch.compile) go the full way too."""
    if not (type(q) is type(k) is type(cos) is type(sin) is Tensor):
        return False
    dtype, device, shape = q.dtype, q.device, q.shape
    if len(shape) != 4 or cos.dim() < 2:
        return False
    dr = cos.shape[-1]
    return (
        dtype in _FLOATS
        and k.dtype is dtype
        and cos.dtype in _FLOATS
        and sin.dtype in _FLOATS
        and q.layout is k.layout is cos.layout is sin.layout is torch.strided
        and k.device == device
        and cos.device == device
        and sin.device == device
        and k.dim() == 4
        and k.shape[0] == shape[0]
        and k.shape[2:] == shape[2:]
        and sin.shape == cos.shape
        and not cos.requires_grad
        and not sin.requires_grad
        and dr % 2 == 0
        and 2 <= dr <= shape[3]
    )


def _check(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> None:
    if _plainly_valid(q, k, cos, sin):
        return
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_floating(name, t)
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D [B, H, S, D] (heads before the sequence, as HF passes it), "
                f"got shape {tuple(t.shape)}"
            )
    b, _, s, d = q.shape
    if k.shape[0] != b or k.shape[2:] != q.shape[2:]:
        raise ValueError(
            f"k [B, Hkv, S, D] must match q [B, Hq, S, D] in B, S and D, got q {tuple(q.shape)} "
            f"and k {tuple(k.shape)}"
        )
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype {q.dtype}, got {k.dtype}; cast one of them first")
    for name, t in (("k", k), ("cos", cos), ("sin", sin)):
        if t.device != q.device:
            raise ValueError(
                f"{name} is on {t.device} but q is on {q.device}; move them to the same device"
            )
    if sin.shape != cos.shape:
        raise ValueError(f"sin must have cos's shape {tuple(cos.shape)}, got {tuple(sin.shape)}")
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise RuntimeError(
            "apply_rotary does not differentiate with respect to cos and sin, which require grad "
            "here; pass cos.detach() and sin.detach() (they are a function of the positions)"
        )
    if cos.dim() < 2:
        raise ValueError(
            f"cos and sin must be [S, Dr], [B, S, Dr] or [B, 1, S, Dr], got {tuple(cos.shape)}"
        )
    dr = cos.shape[-1]
    if dr % 2 or not 2 <= dr <= d:
        raise ValueError(
            f"the rotated width Dr = cos.shape[-1] must be even and 2 <= Dr <= D = {d}, got {dr}"
        )


def _as_rows(t: Tensor, b: int, s: int) -> Tensor:
    """cos or sin [S, Dr], [B | 1, S, Dr] or [B | 1, 1, S, Dr] -> a view [B | 1, S, Dr]."""
    shape = tuple(t.shape)
    if t.dim() == 4 and shape[1] == 1:
        t = t[:, 0]
    elif t.dim() == 2:
        t = t[None]
    if t.dim() != 3 or t.shape[0] not in (1, b) or t.shape[1] != s:
        raise ValueError(
            f"cos and sin must be [S, Dr], [B, S, Dr] or [B, 1, S, Dr] (B may be 1) with B = {b} "
            f"and S = {s} of q, got {shape}"
        )
    return t


def apply_rotary(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False
) -> tuple[Tensor, Tensor]:
    """Rotary position embedding of q and k in one pass: HF's
    apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) on the first Dr features.

    q [B, Hq, S, D], k [B, Hkv, S, D] (Hq != Hkv allowed), same dtype (float32, bfloat16, float16),
    any strides (HF's transposed q is read in place). cos, sin [S, Dr], [B, S, Dr] or
    [B, 1, S, Dr] (B may be 1), any float dtype (used in fp32), Dr even, 2 <= Dr <= D; features
    Dr..D-1 pass through unchanged. interleaved: GPT-J pairs (2i, 2i+1) instead of rotate_half's
    (i, i + Dr/2). Returns new (q_out, k_out), each in its input's layout when that is dense,
    else contiguous. Differentiable in q and k; cos and sin must not require grad."""
    _check(q, k, cos, sin)
    b, s = q.shape[0], q.shape[2]
    return rotary(q, k, _as_rows(cos, b, s), _as_rows(sin, b, s), bool(interleaved))
