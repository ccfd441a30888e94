"""The naive GPT training step of benchmarks/predict_pairs.py and its fixed twins: the same
weights and batch for every variant (seeded), one problem fixed per pair."""

from __future__ import annotations

import time

import torch
import torch.nn as nn

import fusewise
from fusewise.examples.gpt import GPT, GPTConfig


def _norm_cls(cuda: bool):
    if cuda:
        from fusewise.nn import LayerNorm

        return LayerNorm
    return nn.LayerNorm


def host_work(ms: float = 2.0):
    """A callable doing about `ms` of CPU work (sorting a CPU tensor sized for it here)."""
    n, x = 1 << 14, None
    while True:
        x = torch.rand(n)
        t0 = time.perf_counter()
        x.sort()
        took = (time.perf_counter() - t0) * 1e3
        if took >= ms or n >= 1 << 26:
            break
        n *= 2
    return lambda: x.sort()


def build(config: GPTConfig, fixes: set[str], *, sync: bool, device: str, dtype, work=None):
    """(step, model, optimizer) of the naive GPT with `fixes` applied; same weights and batch
    for every variant (seeded)."""
    cuda = device == "cuda"
    torch.manual_seed(0)
    model = GPT(config, "naive")
    if "clean" in fixes:
        fixes = fixes | {"norm", "attention", "loss", "optimizer"}
    if "norm" in fixes or "norm-torch" in fixes:
        norm = _norm_cls(cuda and "norm-torch" not in fixes)
        for blk in model.blocks:
            for name in ("ln1", "ln2"):
                old = getattr(blk, name)
                new = norm(config.d_model)
                new.load_state_dict(old.state_dict())
                setattr(blk, name, new)
    if "attention" in fixes:
        for blk in model.blocks:
            blk.naive = False  # scaled_dot_product_attention
    if "loss" in fixes:
        # linear_cross_entropy on the GPU; on the CPU logits in the model's dtype (no fp32 copy)
        model.variant, model.naive = ("fusewise", False) if cuda else ("clean", False)
    if "loss-compile" in fixes:
        _compile_loss(model)
    model = model.to(device=device, dtype=dtype)
    if "optimizer" in fixes:
        if cuda:
            opt = fusewise.optim.AdamW(model.parameters(), lr=1e-3)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator(device="cpu").manual_seed(1)
    idx = torch.randint(0, config.vocab, (config.batch, config.seq), generator=g).to(device)
    tgt = torch.randint(0, config.vocab, (config.batch, config.seq), generator=g).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(idx, tgt)
        loss.backward()
        opt.step()
        if sync:
            loss.item()  # the per-step host sync a logging line makes
        if work is not None:
            work()
        return loss

    return step, model, opt


def _compile_loss(model: GPT) -> None:
    """The model's forward with its loss (fp32 cast + cross-entropy) under torch.compile."""
    import torch.nn.functional as F

    vocab = model.c.vocab

    @torch.compile
    def loss(logits, targets):
        return F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1))

    def forward(idx, targets):
        x = model.embed(idx) + model.pos[: idx.shape[1]]
        for blk in model.blocks:
            x = blk(x)
        return loss(model.head(x), targets)

    model.forward = forward
