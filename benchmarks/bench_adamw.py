"""AdamW step: fusewise against torch (foreach, fused, for-loop) on ~1e9 parameters.

Byte model (fusewise.ops.adamw.cost.bytes_per_param: 28 B/param, the floor at the copy ceiling):
  fp32 layout          reads param, grad, m, v (16 B); writes param, m, v (12 B)
  bf16 + fp32 master   reads grad 2, m 4, v 4, master 4; writes m, v, master 4 each, param 2
GB/s = those bytes · params / median step time; % is of the device-to-device copy ceiling
measured in the same run. Parameter sets: 96 equal tensors (1.0e9 in all), and a Llama-style mix
(vocab 128256, hidden 2048, 8 layers, MLP 8192, 8 KV heads of 64: two 263M matrices, many 4-50M
ones, tiny norms). In the bf16 layout no peer keeps master weights; the peer is what users write
by hand: grads copied to fp32, torch's fused AdamW on fp32 masters, masters copied back to the
bf16 model.

    python benchmarks/bench_adamw.py --csv out.csv
"""

from __future__ import annotations

import argparse

import _rows  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
import torch
import triton

import fusewise
from fusewise import hardware
from fusewise.ops.adamw import cost

LAYOUTS = {  # name -> (parameter dtype, fp32 master weights)
    "fp32": (torch.float32, False),
    "bf16+master": (torch.bfloat16, True),
}


def bytes_per_param(layout: str) -> int:
    dtype, master = LAYOUTS[layout]
    return cost.bytes_per_param(dtype, master=master)


def shapes(mix: str) -> list[tuple[int, ...]]:
    if mix == "uniform":
        return [(10_416_667,)] * 96  # 1.0e9 parameters
    hidden, inter, vocab, layers, kv = 2048, 8192, 128256, 8, 512
    out = [(vocab, hidden), (vocab, hidden), (hidden,)]  # embedding, lm_head, final norm
    for _ in range(layers):
        out += [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden)]  # q k v o
        out += [(inter, hidden), (inter, hidden), (hidden, inter), (hidden,), (hidden,)]
    return out


class ManualMaster:
    """The hand-written mixed-precision step: fp32 grads <- bf16 grads, torch fused AdamW on fp32
    master weights, bf16 model <- masters."""

    def __init__(self, params, **kw):
        self.params = params
        self.masters = [p.detach().float().requires_grad_() for p in params]
        for m in self.masters:
            m.grad = torch.empty_like(m)
        self.opt = torch.optim.AdamW(self.masters, fused=True, **kw)

    @torch.no_grad()
    def step(self):
        torch._foreach_copy_([m.grad for m in self.masters], [p.grad for p in self.params])
        self.opt.step()
        torch._foreach_copy_(self.params, self.masters)


def make_optimizer(provider, params, layout):
    kw = dict(lr=1e-3, weight_decay=0.01)
    if provider == "fusewise":
        return fusewise.optim.AdamW(params, master_weights=layout == "bf16+master", **kw)
    if layout == "bf16+master":
        return ManualMaster(params, **kw)
    flags = {
        "foreach": dict(foreach=True),
        "fused": dict(fused=True),
        "for-loop": dict(foreach=False),
    }[provider]
    return torch.optim.AdamW(params, **flags, **kw)


def bench(provider, layout, mix):
    dtype = LAYOUTS[layout][0]
    g = torch.Generator(device="cuda").manual_seed(0)
    params = []
    for s in shapes(mix):
        p = torch.randn(s, device="cuda", dtype=dtype, generator=g).requires_grad_()
        p.grad = torch.randn(s, device="cuda", dtype=dtype, generator=g) * 1e-2
        params.append(p)
    n = sum(p.numel() for p in params)
    opt = make_optimizer(provider, params, layout)
    opt.step()  # state allocation and compilation outside the timing
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(opt.step, warmup=50, rep=300, return_mode="median")
    del opt, params
    torch.cuda.empty_cache()
    return n, ms


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--csv", default=None)
    ap.add_argument("--mixes", default="uniform,llama")
    a = ap.parse_args(argv)
    gpu = torch.cuda.get_device_name()
    commit = _rows.commit()
    ceiling = hardware.measure_bandwidth(torch.device("cuda"))
    print(f"# {gpu}; torch {torch.__version__}; triton {triton.__version__}; commit {commit}")
    model = ", ".join(f"{k} {bytes_per_param(k)}" for k in LAYOUTS)
    print(f"# copy ceiling {ceiling:,.0f} GB/s (measured now); byte model B/param: {model}")
    rows = []
    plan = [
        ("fp32", ["fusewise", "fused", "foreach", "for-loop"]),
        ("bf16+master", ["fusewise", "manual-master"]),
    ]
    for mix in a.mixes.split(","):
        for layout, providers in plan:
            for prov in providers:
                n, ms = bench(prov, layout, mix)
                gbps = bytes_per_param(layout) * n / ms / 1e6
                pct = 100 * gbps / ceiling
                rows.append(
                    _rows.row(
                        "adamw", prov, "step", f"{mix}:{n}", layout, ms, gbps, pct, commit_id=commit
                    )
                )
                print(
                    f"adamw {mix:8s} {layout:12s} {prov:14s} {n / 1e9:.3f}e9 params "
                    f"{ms:8.3f} ms {gbps:7.0f} GB/s {pct:5.1f}%",
                    flush=True,
                )
    if a.csv:
        _rows.append_csv(a.csv, rows)


if __name__ == "__main__":
    main()
