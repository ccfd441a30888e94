"""A small GPT training step with the classic problems, and the same step fixed.

naive=True: LayerNorm written as mean / variance / normalise passes, attention written out
(scores = q @ k^T, masked_fill, softmax, @ v), fp32 logits over the vocabulary then
F.cross_entropy, and a per-parameter AdamW loop (torch.optim.AdamW(foreach=False)).
variant="clean": what torch already runs fused (nn.LayerNorm, scaled_dot_product_attention,
torch.optim.AdamW(fused=True)); variant="fusewise": the fixes from this package
(fusewise.nn.LayerNorm, SDPA, fusewise.ops.linear_cross_entropy, fusewise.optim.AdamW). The
diagnosis demo and its tests run them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab: int = 4096
    seq: int = 128
    d_model: int = 128
    heads: int = 4
    layers: int = 2
    batch: int = 4


class NaiveLayerNorm(nn.Module):
    """The seed's three-pass LayerNorm."""

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.bias, self.eps = (
            nn.Parameter(torch.ones(d)),
            nn.Parameter(torch.zeros(d)),
            eps,
        )

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class Block(nn.Module):
    def __init__(self, c: GPTConfig, variant: str):
        super().__init__()
        self.c, self.naive, self.variant = c, variant == "naive", variant
        if variant == "naive":
            norm = NaiveLayerNorm
        elif variant == "fusewise":
            from fusewise.nn import LayerNorm as norm
        else:
            norm = nn.LayerNorm
        self.ln1, self.ln2 = norm(c.d_model), norm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.fc1 = nn.Linear(c.d_model, 4 * c.d_model)
        self.fc2 = nn.Linear(4 * c.d_model, c.d_model)
        self.register_buffer("mask", torch.tril(torch.ones(c.seq, c.seq)).bool(), persistent=False)

    def attention(self, x):
        b, t, d = x.shape
        h = self.c.heads
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        if self.naive:
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)
            scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
            y = torch.softmax(scores, dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig, variant: str = "naive"):
        super().__init__()
        self.c, self.naive, self.variant = c, variant == "naive", variant
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.pos = nn.Parameter(torch.zeros(c.seq, c.d_model))
        self.blocks = nn.ModuleList(Block(c, variant) for _ in range(c.layers))
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)

    def forward(self, idx, targets):
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        if self.variant == "fusewise":  # the loss without the [B·T, V] logits
            from fusewise.ops import linear_cross_entropy

            return linear_cross_entropy(x, self.head.weight, targets)
        logits = self.head(x)
        if self.naive:
            logits = logits.float()  # the fp32 copy of the largest tensor in the step
        return F.cross_entropy(logits.reshape(-1, self.c.vocab), targets.reshape(-1))


VARIANTS = ("naive", "clean", "fusewise")


# tests/data's golden op graphs name lines of this file: an edit above a step line moves them
def make_step(c: GPTConfig | None = None, *, variant="naive", device="cpu", dtype=torch.float32):
    """(step, model, optimizer): step() runs forward, backward and the optimizer once."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    c = c or GPTConfig()
    torch.manual_seed(0)
    model = GPT(c, variant).to(device=device, dtype=dtype)
    if variant == "naive":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    elif variant == "clean":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    else:
        from fusewise.optim import AdamW

        opt = AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cpu").manual_seed(1)
    idx = torch.randint(0, c.vocab, (c.batch, c.seq), generator=g).to(device)
    targets = torch.randint(0, c.vocab, (c.batch, c.seq), generator=g).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        return loss

    return step, model, opt
