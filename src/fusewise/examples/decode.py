"""A small GPT decoding greedily with a static KV cache: the launch-bound step a CUDA graph fixes.

The cache is preallocated ([B, H, max_len, D] per layer) and the position lives in a device
tensor, so one decode step has the same shapes, addresses and kernels at every position: each
step writes its k/v at `pos` (index_copy_), attends over the whole cache under a mask built on
the device (`arange(max_len) <= pos`), picks the next token (argmax) and advances `pos` in place.
Nothing in it waits for the host, so fusewise.graphs.capture can capture it once and replay it
for every token. At small batch each step is ~15 small kernels a layer: the host's launches take
longer than the GPU's work (examples/decode.py, benchmarks/bench_decode.py).

`Decoder.forward(idx)` is the plain full-sequence forward (causal attention), the reference the
cached decode must equal (tests/test_graphs.py, float64).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class DecodeConfig:
    vocab: int = 4096
    d_model: int = 256
    heads: int = 4
    layers: int = 4
    max_len: int = 512  # positions the cache holds (prompt + generated tokens)


class Block(nn.Module):
    def __init__(self, c: DecodeConfig):
        super().__init__()
        self.heads = c.heads
        self.ln1, self.ln2 = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.fc1 = nn.Linear(c.d_model, 4 * c.d_model)
        self.fc2 = nn.Linear(4 * c.d_model, c.d_model)

    def heads_of(self, x):
        """[B, T, 3·d] -> q, k, v as [B, H, T, d/H]."""
        b, t, _ = x.shape
        return (z.view(b, t, self.heads, -1).transpose(1, 2) for z in x.chunk(3, dim=-1))

    def mlp(self, x):
        return self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def forward(self, x):
        """Full sequence [B, T, d], causal."""
        q, k, v = self.heads_of(self.qkv(self.ln1(x)))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).flatten(2))
        return x + self.mlp(x)

    def decode(self, x, cache_k, cache_v, pos, mask):
        """One position [B, 1, d]; its k/v written into the cache [B, H, L, d/H] at pos."""
        q, k, v = self.heads_of(self.qkv(self.ln1(x)))
        cache_k.index_copy_(2, pos, k)
        cache_v.index_copy_(2, pos, v)
        y = F.scaled_dot_product_attention(q, cache_k, cache_v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).flatten(2))
        return x + self.mlp(x)


class Decoder(nn.Module):
    def __init__(self, c: DecodeConfig):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.pos_embed = nn.Embedding(c.max_len, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)

    def forward(self, idx):
        """idx [B, T] -> logits [B, T, V]."""
        t = idx.shape[1]
        x = self.embed(idx) + self.pos_embed(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class StaticKVCache:
    """k and v of every layer, [B, H, max_len, d/H] each, and the position as a device tensor
    (int64, shape [1]): fixed addresses, so a captured step serves every position."""

    def __init__(self, c: DecodeConfig, batch: int, *, device, dtype):
        shape = (batch, c.heads, c.max_len, c.d_model // c.heads)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(c.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(c.layers)]
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.slots = torch.arange(c.max_len, device=device)
        self.max_len = c.max_len

    def reset(self) -> None:
        """Back to position 0 (the old entries stay, masked out until overwritten)."""
        self.pos.zero_()


@torch.no_grad()
def decode_logits(model: Decoder, cache: StaticKVCache, token):
    """token [B] at cache.pos -> logits [B, V]; cache.pos advanced by one. No host sync."""
    pos = cache.pos
    x = model.embed(token)[:, None] + model.pos_embed(pos)  # [B, 1, d]
    mask = (cache.slots <= pos).view(1, 1, 1, -1)  # the positions written so far
    for blk, k, v in zip(model.blocks, cache.k, cache.v):
        x = blk.decode(x, k, v, pos, mask)
    pos.add_(1)
    return model.head(model.ln_f(x))[:, 0]


def make_decoder(c: DecodeConfig | None = None, batch: int = 1, *, device="cpu", dtype=None):
    """(model, cache, step): step(token [B]) -> next token [B] (greedy), one decode step."""
    c = c or DecodeConfig()
    if c.d_model % c.heads:
        raise ValueError(f"d_model ({c.d_model}) must be a multiple of heads ({c.heads})")
    torch.manual_seed(0)
    model = Decoder(c).to(device=device, dtype=dtype).eval()
    cache = StaticKVCache(c, batch, device=device, dtype=model.head.weight.dtype)
    return model, cache, make_step(model, cache)


def make_step(model: Decoder, cache: StaticKVCache):
    """step(token [B]) -> the greedy next token [B], decoding at cache.pos (advanced by one)."""

    def step(token):
        return decode_logits(model, cache, token).argmax(-1)

    return step


def looping(step, cache: StaticKVCache, token):
    """A zero-argument decode step for timing loops (returns None): it feeds each output back
    as the next input and goes back to position 0 before the cache is full (counted on the
    host: reading the position back would be a sync)."""
    state = {"token": token.clone(), "calls": 0}

    def one_step():
        if state["calls"] == cache.max_len - 1:
            cache.reset()
            state["calls"] = 0
        state["token"] = step(state["token"]).clone()
        state["calls"] += 1  # returns nothing: a timing loop would read a token back as a loss

    cache.reset()
    return one_step


def generate(step, cache: StaticKVCache, prompt, tokens: int, on_step=None):
    """Greedy decoding from cache position 0: the prompt [B, P] fed one position at a time
    through `step` (its outputs dropped until the last), then `tokens` new tokens. on_step() is
    called after each decode step (fusewise.step, to mark it). Returns [B, tokens] (a device
    tensor: nothing is read back while decoding)."""
    p = prompt.shape[1]
    if p < 1 or p + tokens > cache.max_len:
        raise ValueError(
            f"prompt ({p}) + tokens ({tokens}) must fit the cache's {cache.max_len} positions "
            "(and the prompt have at least one token)"
        )
    cache.reset()
    out = []
    nxt = None
    for i in range(p + tokens - 1):
        token = prompt[:, i] if i < p else nxt
        nxt = step(token).clone()  # a captured step's output is overwritten by the next replay
        if i >= p - 1:
            out.append(nxt)
        if on_step is not None:
            on_step()
    return torch.stack(out, 1) if out else prompt.new_empty(prompt.shape[0], 0)
