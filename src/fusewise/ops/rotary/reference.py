"""Eager PyTorch oracles of the rotary position embedding: what fusewise.ops.apply_rotary
computes, the comparison of the tests and benchmarks, and (rotary_forward, rotary_backward) the
path the op takes, with a warning, when the Triton kernel cannot run. torch only.

HF's apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) on the first Dr features, the rest
passed through: x·cos + rotate_half(x)·sin, rotate_half(x) = cat(-x[h:], x[:h]) (h = Dr / 2), or
with `interleaved` x·cos + rotate_every_two(x)·sin, rotate_every_two(x)[2i] = -x[2i+1],
[2i+1] = x[2i] (GPT-J). The backward is the transpose of that rotation:
dx = dy·cos - rotate(dy·sin).
"""

from __future__ import annotations

import torch
from torch import Tensor


def rotate_half(x: Tensor) -> Tensor:
    """cat(-x[..., h:], x[..., :h]), h half the last dim (HF's rotate_half)."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotate_every_two(x: Tensor) -> Tensor:
    """[-x1, x0, -x3, x2, ...] along the last dim (GPT-J's pairing)."""
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, transpose: bool) -> Tensor:
    """R x (or Rᵀ x) on the first Dr = cos.shape[-1] features of x, the rest unchanged; cos, sin
    broadcast against x[..., :Dr]."""
    dr = cos.shape[-1]
    rot, tail = x[..., :dr], x[..., dr:]
    turn = rotate_every_two if interleaved else rotate_half
    out = rot * cos - turn(rot * sin) if transpose else rot * cos + turn(rot) * sin
    return torch.cat((out, tail), dim=-1)


def apply_rotary(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False
) -> tuple[Tensor, Tensor]:
    """(q_out, k_out) as fusewise.ops.apply_rotary: q [B, Hq, S, D], k [B, Hkv, S, D]; cos, sin
    [S, Dr], [B, S, Dr] or [B | 1, 1, S, Dr]. fp32 math (float64 stays), q's dtype out."""
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    acc = torch.promote_types(q.dtype, torch.float32)
    cos, sin = cos.to(acc), sin.to(acc)
    return tuple(_rotate(x.to(acc), cos, sin, interleaved, False).to(x.dtype) for x in (q, k))


def rotary_forward(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool
) -> tuple[Tensor, Tensor]:
    """q [B, Hq, S, D], k [B, Hkv, S, D]; cos, sin [B | 1, S, Dr]. (R q, R k), fp32 math."""
    return apply_rotary(q, k, cos, sin, interleaved)


def rotary_backward(
    dq_out: Tensor,
    dk_out: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
    need_dq: bool = True,
    need_dk: bool = True,
) -> tuple[Tensor, Tensor]:
    """(Rᵀ dq_out, Rᵀ dk_out) with cos, sin [B | 1, S, Dr]; one not needed comes back empty."""
    acc = torch.promote_types(dq_out.dtype, torch.float32)
    cos, sin = cos[:, None].to(acc), sin[:, None].to(acc)
    out = []
    for dy, needed in ((dq_out, need_dq), (dk_out, need_dk)):
        dx = _rotate(dy.to(acc), cos, sin, interleaved, True).to(dy.dtype) if needed else None
        out.append(dx if needed else dy.new_empty(0))
    return out[0], out[1]
