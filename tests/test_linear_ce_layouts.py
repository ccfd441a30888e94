"""Property test: linear_cross_entropy gives the float64 reference's loss and gradients for
inputs in any memory layout (tests/layouts.py: views inside poisoned buffers, so an element read
through a wrong stride shows up), over random shapes, dtypes, reductions and options.

Seeded cases, generated once at collection: every layout of every input appears (each input
cycles through its layouts), the rest is drawn at random. The row kernel's column block is
shrunk so every row spans several blocks with a partial last one, and chunks are a few tokens,
so several chunks run (weight-gradient accumulation across chunks is exercised).

bf16 cases take fp32_accumulate=True, where every output is held to eager's error + slack.
The default's bf16 weight-gradient accumulation has a statistical bound (sqrt(chunks + 1) x
eager's error, a random walk of roundings) that needs more elements than these shapes have:
at V x d = 64 it measured up to 7x the bound over 25 seeds, at 45 x 503 x 32 it holds, and
test_linear_ce.py tests it there. fp32 cases draw fp32_accumulate (both exact to the rule)."""

from __future__ import annotations

import random

import pytest
import torch
from layouts import KINDS, expanded, relayout
from lce_cases import check

import fusewise
from fusewise.ops.linear_ce import launch as lce_launch

# "tstrided": a 3-D [B, T, d] hidden seen through h[:, ::2] of a poisoned [B, 2T, d] buffer
H_LAYOUTS = (*KINDS, "tstrided")
T_LAYOUTS = (*KINDS, "expanded")  # expanded: stride 0 along the first dim
B_LAYOUTS = (*KINDS, "no-bias")
G_LAYOUTS = (*KINDS, "expanded")  # grad_output of reduction="none"; expanded as .sum() gives
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
OPTIONS = {"smooth": {"label_smoothing": 0.1}, "zloss": {"z_loss": 1e-2}, "cap": {"softcap": 3.0}}


def _cases(n=64, seed=9):
    rng = random.Random(seed)

    def draws(kinds):  # every kind once (shuffled), then at random
        yield from rng.sample(kinds, len(kinds))
        while True:
            yield rng.choice(kinds)

    layouts = {
        "h": draws(H_LAYOUTS),
        "w": draws(KINDS),
        "t": draws(T_LAYOUTS),
        "b": draws(B_LAYOUTS),
        "g": draws(G_LAYOUTS),
    }
    out = []
    for i in range(n):
        # the first cases hold every layout of every input (grad_output's too: reduction
        # "none"), each with several chunks of several tokens; the rest is drawn at random
        first = i < len(H_LAYOUTS)
        c = {k: next(layouts[k]) for k in "hwtb"}
        c["reduction"] = "none" if first else rng.choice(["mean", "sum", "none"])
        c["g"] = next(layouts["g"]) if c["reduction"] == "none" else "scalar"
        three_d = c["h"] == "tstrided" or rng.random() < 0.3
        if first:
            c["lead"] = (3, 4) if three_d else (13,)
        elif three_d:
            c["lead"] = (rng.choice([1, 2, 3]), rng.choice([1, 3, 4]))
        else:
            c["lead"] = (rng.choice([1, 2, 5, 7, 13]),)
        c["d"] = rng.choice([1, 4, 7, 16])
        c["v"] = rng.choice([33, 47, 64, 95])  # column blocks of 32: a partial last block
        c["dtype"] = rng.choice(list(DTYPES))
        # bf16 always accumulates dweight in fp32 here (see the module docstring)
        c["fp32_acc"] = c["dtype"] == "bf16" or rng.random() < 0.5
        c["opts"] = [k for k in OPTIONS if rng.random() < 0.4]
        c["ignore_index"] = rng.choice([-100, 3])  # 3: an ignored class inside [0, V)
        c["ignored"] = "some" if first else rng.choice(["some", "some", "none", "all"])
        c["chunk"] = rng.choice([2, 3]) if first else rng.choice([2, 3, 5])
        c["seed"] = rng.randrange(2**31)
        out.append(c)
    return out


def _id(c):
    lead = "x".join(map(str, c["lead"]))
    g = f"-g.{c['g']}" if c["reduction"] == "none" else ""
    opts = "".join(f"-{k}" for k in c["opts"]) + ("-fp32acc" if c["fp32_acc"] else "")
    return (
        f"N{lead}-d{c['d']}-V{c['v']}-{c['dtype']}-{c['reduction']}-h.{c['h']}-w.{c['w']}"
        f"-t.{c['t']}-b.{c['b']}{g}{opts}-ii{c['ignore_index']}.{c['ignored']}"
        f"-c{c['chunk']}"
    )


CASES = _cases()


def test_every_layout_is_drawn_with_several_multi_row_chunks():
    """A layout seen only with one token, or one row per chunk, could hide a stride bug."""
    several = [c for c in CASES if 2 <= c["chunk"] < _tokens(c)]
    for key, kinds in (("h", H_LAYOUTS), ("w", KINDS), ("t", T_LAYOUTS), ("b", B_LAYOUTS)):
        assert {c[key] for c in several} == set(kinds), key
    assert {c["g"] for c in several if c["reduction"] == "none"} == set(G_LAYOUTS)


def _tokens(c):
    return c["lead"][0] * (c["lead"][1] if len(c["lead"]) > 1 else 1)


def _hidden(h, kind):
    if kind != "tstrided":
        return relayout(h, kind)
    b, t, d = h.shape
    out = torch.full((b, 2 * t, d), float("nan"), dtype=h.dtype, device=h.device)[:, ::2]
    return out.copy_(h)


def _inputs(c, device):
    gen = torch.Generator().manual_seed(c["seed"])  # drawn on the CPU: the same on every device
    dtype, lead, d, v = DTYPES[c["dtype"]], c["lead"], c["d"], c["v"]
    rand = lambda *s: torch.randn(s, generator=gen)  # noqa: E731
    h = _hidden(rand(*lead, d).to(device, dtype), c["h"]).requires_grad_()
    w = relayout((rand(v, d) / d**0.5).to(device, dtype), c["w"]).requires_grad_()
    b = None
    if c["b"] != "no-bias":
        b = relayout((0.1 * rand(v)).to(device, dtype), c["b"]).requires_grad_()
    t = torch.randint(0, v, lead, generator=gen)
    if c["ignored"] == "some":
        t.view(-1)[1::3] = c["ignore_index"]
    elif c["ignored"] == "all":
        t.fill_(c["ignore_index"])
    t = t.to(device)
    t = expanded(t, 0) if c["t"] == "expanded" else relayout(t, c["t"])
    g = _pow2(lead if c["reduction"] == "none" else (), gen).to(device)
    if c["reduction"] == "none":
        g = expanded(g, 0) if c["g"] == "expanded" else relayout(g, c["g"])
    return h, w, t, b, g


def _pow2(shape, gen):
    """grad_output values ±2^k, k in [-2, 2], so that scaling by them is exact: the fused op
    scales by grad_output after rounding the logit gradient, eager before; with other values
    the two round different numbers and the comparison measures that noise (at these sizes it
    put bf16 errors up to 1.5x apart either way) instead of the kernels."""
    sign = 1 - 2 * torch.randint(0, 2, shape, generator=gen)
    return sign * torch.randint(-2, 3, shape, generator=gen).float().exp2()


@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_any_layout_matches_float64(c, device, monkeypatch):
    monkeypatch.setattr(lce_launch, "BLOCK_V", 32)
    h, w, t, b, g = _inputs(c, device)
    kw = {k: v for o in c["opts"] for k, v in OPTIONS[o].items()}
    kw.update(
        reduction=c["reduction"],
        ignore_index=c["ignore_index"],
        chunk_size=c["chunk"],
        fp32_accumulate=c["fp32_acc"],
    )
    check(h, w, t, b, DTYPES[c["dtype"]], g=g, **kw)
    assert fusewise.ops.paths()["linear_cross_entropy"] in ("triton", "triton-interpreter")


@pytest.mark.parametrize("kind", [*KINDS, "tstrided"])
def test_gemm_operands_are_copied_only_when_the_gemm_needs_it(kind, device):
    """Padded rows, h[:, ::2] and .T views go to the GEMMs as they are; only a layout without a
    unit stride (every other element of a row) is copied, once."""
    from fusewise.ops.linear_ce.op import _gemm_ready

    x = torch.randn(3, 4, 8, device=device)
    view = _hidden(x, kind) if kind == "tstrided" else relayout(x[0], kind)
    rows = view.reshape(-1, 8)
    ready = _gemm_ready(rows)
    assert torch.equal(ready, rows)
    assert (ready.data_ptr() == rows.data_ptr()) == (kind != "strided")


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("kind", ["2d-transposed", "3d-tstrided"])
def test_compiled_matches_eager_on_views(kind, reduction, device):
    """torch.compile(fullgraph=True) on views: hidden as a .T view (taken uncopied by the
    custom ops) or h[:, ::2] of a [B, T, d] with a transposed [B, T] target; weight a .T view."""
    if kind == "2d-transposed":
        h = relayout(torch.randn(13, 8, device=device), "transposed")
        t = torch.randint(0, 40, (13,), device=device)
    else:
        h = _hidden(torch.randn(3, 4, 8, device=device), "tstrided")
        t = relayout(torch.randint(0, 40, (3, 4), device=device), "transposed")
    h = h.requires_grad_()
    w = relayout(torch.randn(40, 8, device=device), "transposed").requires_grad_()
    fn = lambda h, w: fusewise.ops.linear_cross_entropy(h, w, t, reduction=reduction)  # noqa: E731
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    outs = [f(h, w) for f in (fn, torch.compile(fn, fullgraph=True, backend=backend))]
    grads = [torch.autograd.grad(o.sum(), [h, w]) for o in outs]
    torch.testing.assert_close(outs[1], outs[0])
    for a, e in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, e)
