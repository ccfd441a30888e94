"""Linear + cross-entropy, forward + backward: fusewise against eager (fp32 and bf16 CE),
torch.compile, Liger's fused linear CE and Apple's CCE, at hidden [N, 4096], weight
[128256, 4096], bf16, N in 8192, 16384 (PERF.md's shape), 32768.

Reported: ms (median of do_bench), TFLOP/s against 6·N·d·V (three matmuls: logits, dhidden,
dweight), and peak extra memory: the most allocated during the step above what the inputs and
the weight took before it (gradients included, as PERF.md counts them).

    python benchmarks/bench_linear_ce.py --csv out.csv
"""

from __future__ import annotations

import argparse

import _rows  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
import torch
import torch.nn.functional as F
import triton

import fusewise

V, D = 128256, 4096


def providers():
    def eager(dtype):
        def fn(h, w, t):
            return F.cross_entropy((h @ w.T).to(dtype), t)

        return fn

    table = {
        "fusewise": lambda h, w, t: fusewise.ops.linear_cross_entropy(h, w, t),
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


def bench(fn, n):
    g = torch.Generator(device="cuda").manual_seed(0)
    h = (torch.randn(n, D, device="cuda", generator=g) / 4).bfloat16().requires_grad_()
    w = (torch.randn(V, D, device="cuda", generator=g) / D**0.5).bfloat16().requires_grad_()
    t = torch.randint(0, V, (n,), device="cuda", generator=g)

    def run():
        torch.autograd.grad(fn(h, w, t), [h, w])

    run()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    ms = triton.testing.do_bench(run, warmup=50, rep=500, return_mode="median")
    return ms, peak  # the tensors go with this frame; the caller empties the cache


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", default="8192,16384,32768")
    ap.add_argument("--csv", default=None)
    a = ap.parse_args(argv)
    gpu, commit = torch.cuda.get_device_name(), _rows.commit()
    print(f"# {gpu}; torch {torch.__version__}; triton {triton.__version__}; commit {commit}")
    rows = []
    for n in map(int, a.tokens.split(",")):
        flops = 6.0 * n * D * V
        for name, fn in providers().items():
            try:
                ms, peak = bench(fn, n)
                torch.cuda.empty_cache()
            except Exception as e:  # a peer that cannot run a shape is reported, not fatal
                print(f"# {name} N={n}: failed ({type(e).__name__}: {str(e)[:100]})")
                continue
            tflops = flops / ms / 1e9
            rows.append(_rows.row("linear_cross_entropy", name, "fwd_bwd", f"{n}x{D}x{V}", "bf16",
                                  ms, tflops, peak=peak, commit_id=commit))  # fmt: skip
            print(f"N={n:6d} {name:14s} {ms:8.2f} ms {tflops:6.0f} TFLOP/s "
                  f"peak extra {peak / 1e9:6.2f} GB", flush=True)  # fmt: skip
    if a.csv:
        _rows.append_csv(a.csv, rows)


if __name__ == "__main__":
    main()
