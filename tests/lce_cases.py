"""Shared by the linear-CE tests: fusewise against a float64 reference, each error held to the
same-dtype eager reference's error plus a small slack."""

from __future__ import annotations

import torch

import fusewise
from fusewise.ops import reference

# Slack added to eager PyTorch's own error (relative Frobenius norm, same dtype)
SLACK = {torch.float32: 1e-6, torch.bfloat16: 5e-4}


def rel(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    assert torch.isfinite(a).all()
    d = b.norm().item()
    return (a - b).norm().item() / d if d > 0 else (a - b).norm().item()


def run(fn, h, w, t, b, g, **kw):
    leaves = [x for x in (h, w, b) if x is not None]
    out = fn(h, w, t, b, **kw)
    return out, torch.autograd.grad(out, leaves, g)


def check(h, w, t, b, dtype, g=None, dw_rounds=0, **kw):
    """Loss and gradients of fusewise (grad_output g, random if None) against the reference on
    float64 copies; each error <= the same-dtype eager reference's + SLACK. dw_rounds = k > 0:
    the weight gradient was rounded to a low precision once per chunk (k chunks), so its error
    may reach sqrt(k + 1) times eager's (a random walk of k roundings) but no further."""
    if g is None:
        g = torch.randn_like(fusewise.ops.linear_cross_entropy(h, w, t, b, **kw))
    out, grads = run(fusewise.ops.linear_cross_entropy, h, w, t, b, g, **kw)
    kw = {k: v for k, v in kw.items() if k not in ("fp32_accumulate", "chunk_size")}
    t = t.long()  # F.cross_entropy takes int64 targets only; fusewise also takes int32
    dbl = [x.detach().double().requires_grad_() if x is not None else None for x in (h, w, b)]
    ref, ref_g = run(reference.linear_cross_entropy, dbl[0], dbl[1], t, dbl[2], g.double(), **kw)
    eag_in = [x.detach().clone().requires_grad_() if x is not None else None for x in (h, w, b)]
    eag, eag_g = run(reference.linear_cross_entropy, eag_in[0], eag_in[1], t, eag_in[2], g, **kw)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert rel(out, ref) <= rel(eag, ref) + SLACK[dtype]
    leaves = [x for x in (h, w, b) if x is not None]
    for i, (a, r, e, x) in enumerate(zip(grads, ref_g, eag_g, leaves)):
        assert a.shape == x.shape and a.dtype == x.dtype
        if i == 1 and dw_rounds:
            assert rel(a, r) <= (dw_rounds + 1) ** 0.5 * rel(e, r), (
                "dweight",
                rel(a, r),
                rel(e, r),
            )
        else:
            assert rel(a, r) <= rel(e, r) + SLACK[dtype], (i, rel(a, r), rel(e, r))
