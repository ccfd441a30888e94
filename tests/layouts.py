"""The same values in other memory layouts, for property tests: a kernel that assumes contiguity
or ignores a stride is then caught by the suite, not by a user.

Every layout but "contiguous" lives inside a larger buffer whose unused elements are poison
(NaN for floats, the dtype's minimum for integers), so reading the wrong element shows up.
"""

from __future__ import annotations

import torch

# contiguous; offset: storage offset 3; strided: every other element of the last dim;
# padded: rows of the last dim padded by 5 (stride of dim -2 > size of dim -1);
# transposed: the last two dims stored swapped (stride 1 on dim -2)
KINDS = ("contiguous", "offset", "strided", "padded", "transposed")


def _poisoned(shape, like: torch.Tensor) -> torch.Tensor:
    fill = float("nan") if like.is_floating_point() else torch.iinfo(like.dtype).min
    return torch.full(shape, fill, dtype=like.dtype, device=like.device)


def relayout(t: torch.Tensor, kind: str) -> torch.Tensor:
    """A tensor equal to t (same shape, dtype, device, values) in the layout `kind`; it does not
    require grad (call .requires_grad_() on the result for a leaf)."""
    t = t.detach()
    if kind == "contiguous":
        return t.contiguous().clone()
    if kind == "offset":
        out = _poisoned((t.numel() + 3,), t)[3:].view(t.shape)
    elif kind == "strided" and t.dim() >= 1:
        out = _poisoned((*t.shape[:-1], 2 * t.shape[-1]), t)[..., ::2]
    elif kind == "padded" and t.dim() >= 1:
        out = _poisoned((*t.shape[:-1], t.shape[-1] + 5), t)[..., : t.shape[-1]]
    elif kind == "transposed" and t.dim() >= 2:
        out = _poisoned((*t.shape[:-2], t.shape[-1], t.shape[-2]), t).transpose(-1, -2)
    elif kind in KINDS:  # a 0-d tensor has no dims to stride or swap
        return relayout(t, "offset")
    else:
        raise ValueError(f"unknown layout {kind!r}; one of {KINDS}")
    out.copy_(t)
    return out


def expanded(t: torch.Tensor, dim: int) -> torch.Tensor:
    """t's first slice along `dim`, broadcast back to t's shape (stride 0 along dim): values
    change, so compute the reference from the returned tensor."""
    return t.detach().narrow(dim, 0, 1).expand(t.shape)


def describe(t: torch.Tensor) -> str:
    """A test id fragment: shape, strides and offset."""
    return f"{tuple(t.shape)}s{tuple(t.stride())}o{t.storage_offset()}"
