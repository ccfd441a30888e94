"""Linear + cross-entropy, forward + backward: fusewise (default and fp32_accumulate=True, at
several chunk sizes) against three bare cuBLAS matmuls of the same shapes (PERF.md's floor),
eager (fp32 and bf16 CE), torch.compile, Liger's fused linear CE and Apple's CCE, at hidden
[N, 4096], weight [128256, 4096], bf16, N in 8192, 16384 (PERF.md's shape), 32768.

Reported: ms (median of do_bench), TFLOP/s against 6·N·d·V (three matmuls: logits, dhidden,
dweight), and peak extra memory: the most allocated during the step above what the inputs and
the weight took before it (gradients included, as PERF.md counts them). Then, at a smaller shape
with a float64 reference, the relative error of the loss and both gradients per provider.

    python benchmarks/bench_linear_ce.py --csv out.csv
"""

from __future__ import annotations

import argparse

import _rows  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
import torch
import torch.nn.functional as F
import triton

import fusewise
from fusewise.ops import reference
from fusewise.ops.linear_ce import cost

V, D = 128256, 4096


def _fusewise(**kw):
    return lambda h, w, t: fusewise.ops.linear_cross_entropy(h, w, t, **kw)


def providers(chunks):
    def eager(dtype):
        def fn(h, w, t):
            return F.cross_entropy((h @ w.T).to(dtype), t)

        return fn

    table = {"fusewise": _fusewise(), "fusewise-fp32acc": _fusewise(fp32_accumulate=True)}
    for c in chunks:
        table[f"fusewise-chunk{c}"] = _fusewise(chunk_size=c)
        table[f"fusewise-fp32acc-chunk{c}"] = _fusewise(chunk_size=c, fp32_accumulate=True)
    table |= {
        "eager-fp32-ce": eager(torch.float32),
        "eager-bf16-ce": eager(torch.bfloat16),
        "compile": torch.compile(eager(torch.float32)),
    }
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import (
            LigerFusedLinearCrossEntropyFunction as Liger,
        )

        table["liger"] = lambda h, w, t: Liger.apply(h, w, t)[0]
    except ImportError as e:
        print(f"# liger: skipped ({e})")
    try:
        from cut_cross_entropy import linear_cross_entropy as cce

        table["cce"] = lambda h, w, t: cce(h, w, t)
    except ImportError as e:
        print(f"# cce: skipped ({e})")
    return table


def make_inputs(n, d, v, seed=0, ignore_every=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = (torch.randn(n, d, device="cuda", generator=g) / 4).bfloat16().requires_grad_()
    w = (torch.randn(v, d, device="cuda", generator=g) / d**0.5).bfloat16().requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    if ignore_every:
        t[::ignore_every] = -100
    return h, w, t


def three_matmuls(h, w, t):
    """The floor: logits, dhidden and dweight as bare cuBLAS GEMMs (no loss at all)."""
    z = h.detach() @ w.detach().T
    return z @ w.detach(), z.T @ h.detach()


def bench(fn, n):
    h, w, t = make_inputs(n, D, V)
    if fn is three_matmuls:
        run = lambda: fn(h, w, t)  # noqa: E731
    else:
        run = lambda: torch.autograd.grad(fn(h, w, t), [h, w])  # noqa: E731
    run()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    ms = triton.testing.do_bench(run, warmup=100, rep=1500, return_mode="median")
    return ms, peak  # the tensors go with this frame; the caller empties the cache


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def precision(table, n=4096, d=2048, v=32768):
    """Relative error against float64 (loss, dhidden, dweight), grad_output = 1, 1 in 7 tokens
    ignored. Returns {provider: (loss, dh, dw)}."""
    h, w, t = make_inputs(n, d, v, seed=1, ignore_every=7)
    hd, wd = (x.detach().double().requires_grad_() for x in (h, w))
    ref = reference.linear_cross_entropy(hd, wd, t)
    ref_g = torch.autograd.grad(ref, [hd, wd])
    out = {}
    for name, fn in table.items():
        if name.startswith("compile") or "chunk" in name:
            continue
        try:
            loss = fn(h, w, t)
            grads = torch.autograd.grad(loss, [h, w])
        except Exception as e:
            print(f"# precision {name}: failed ({type(e).__name__}: {str(e)[:100]})")
            continue
        out[name] = (rel(loss, ref), rel(grads[0], ref_g[0]), rel(grads[1], ref_g[1]))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", default="8192,16384,32768")
    ap.add_argument(
        "--chunks", default="512,2048,4096", help="extra fusewise chunk sizes (tokens), at N=16384"
    )
    ap.add_argument("--csv", default=None)
    a = ap.parse_args(argv)
    gpu, commit = torch.cuda.get_device_name(), _rows.commit()
    print(f"# {gpu}; torch {torch.__version__}; triton {triton.__version__}; commit {commit}")
    chunks = [int(c) for c in a.chunks.split(",") if c]
    rows = []
    for n in map(int, a.tokens.split(",")):
        flops = cost.fwd_bwd(n, D, V, torch.bfloat16).flops  # 6·N·d·V, the three GEMMs
        table = {"cublas-3-matmuls": three_matmuls} | providers(chunks if n == 16384 else [])
        for name, fn in table.items():
            try:
                ms, peak = bench(fn, n)
                torch.cuda.empty_cache()
            except Exception as e:  # a peer that cannot run a shape is reported, not fatal
                print(f"# {name} N={n}: failed ({type(e).__name__}: {str(e)[:100]})")
                torch.cuda.empty_cache()
                continue
            tflops = flops / ms / 1e9
            rows.append(
                _rows.row(
                    "linear_cross_entropy",
                    name,
                    "fwd_bwd",
                    f"{n}x{D}x{V}",
                    "bf16",
                    ms,
                    tflops,
                    peak=peak,
                    commit_id=commit,
                )
            )
            print(
                f"N={n:6d} {name:26s} {ms:8.2f} ms {tflops:6.0f} TFLOP/s "
                f"peak extra {peak / 1e9:6.2f} GB",
                flush=True,
            )
    print("# relative error vs float64 at N=4096, d=2048, V=32768 (loss, dhidden, dweight)")
    for name, (el, eh, ew) in precision(providers([])).items():
        print(f"{name:26s} loss {el:.2e}  dh {eh:.2e}  dw {ew:.2e}", flush=True)
        rows.append(
            _rows.row(
                "linear_cross_entropy",
                name,
                "rel_error_loss_dh_dw",
                "4096x2048x32768",
                "bf16",
                0.0,
                0.0,
                peak=f"{el:.3e};{eh:.3e};{ew:.3e}",
                commit_id=commit,
            )
        )
    if a.csv:
        _rows.append_csv(a.csv, rows)


if __name__ == "__main__":
    main()
