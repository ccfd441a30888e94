"""Helpers of the AdamW tests: parameters, runs of an optimizer class over given gradients, and
the relative error used to hold fusewise to torch."""

import torch

SIZES = [1, 7, 4096, 4097, 10_000, 3 * 5]  # one element, odd, exactly a chunk, a chunk + 1


def make_params(device, dtype=torch.float32, sizes=SIZES):
    shapes = [(n,) if i % 2 else (n, 1) for i, n in enumerate(sizes)]
    return [torch.randn(s, device=device, dtype=dtype) for s in shapes]


def clone(params, dtype=None):
    return [p.detach().clone().to(dtype or p.dtype).requires_grad_() for p in params]


def run(opt_cls, params, grads, steps, groups_fn, set_none=(), **kw):
    opt = opt_cls(groups_fn(params), **kw)
    for t in range(steps):
        for i, (p, g) in enumerate(zip(params, grads[t])):
            p.grad = None if (t, i) in set_none else g.to(p.dtype).clone()
        opt.step()
    return opt


def rel(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).norm() / b.norm()).item()


def resume_and_compare(opt, params, grads, ref):
    """Step opt over the remaining gradients, then params must match the uninterrupted run."""
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        opt.step()
    for p, r in zip(params, ref):
        assert rel(p, r) < 1e-5
