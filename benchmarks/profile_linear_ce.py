"""Where fusewise's linear-CE time goes, per kernel (torch.profiler, GPU), and how its gradient
error depends on the number of chunks. python benchmarks/profile_linear_ce.py [--csv P]"""

from __future__ import annotations

import argparse
import collections
import importlib

import _rows  # noqa: E402
import bench_linear_ce as B
import torch

import fusewise
from fusewise.ops import reference

lce = importlib.import_module("fusewise.ops.linear_cross_entropy")


def breakdown(n, lean, chunk_mib):
    h, w, t = B.make_inputs(n, B.D, B.V)
    fn = B._fusewise(chunk_mib, lean=lean)
    for _ in range(2):
        torch.autograd.grad(fn(h, w, t), [h, w])
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            torch.autograd.grad(fn(h, w, t), [h, w])
        torch.cuda.synchronize()
    per = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:70]] += e.device_time_total / 1e3 / 3
    total = sum(per.values())
    print(f"# N={n} lean={lean} chunk={chunk_mib} MiB: {total:.2f} ms of kernels per step")
    for name, ms in per.most_common(8):
        print(f"  {ms:8.2f} ms  {name}")
    return total


def precision_vs_chunks(n=4096, d=2048, v=32768):
    """dweight / dhidden error against float64 with k chunks forced (k=16 is PERF.md's shape at
    the default chunk size), next to eager (same formula, bf16 logits) and Liger."""
    h, w, t = B.make_inputs(n, d, v, seed=1, ignore_every=7)
    hd, wd = (x.detach().double().requires_grad_() for x in (h, w))
    ref_g = torch.autograd.grad(reference.linear_cross_entropy(hd, wd, t), [hd, wd])
    rows = []
    for k in (1, 4, 8, 16, 32):
        for lean in (False, True):
            old = lce.CHUNK_BYTES
            lce.CHUNK_BYTES = (n // k) * v * 2
            try:
                g = torch.autograd.grad(fusewise.ops.linear_cross_entropy(h, w, t, lean=lean),
                                        [h, w])  # fmt: skip
            finally:
                lce.CHUNK_BYTES = old
            e = (B.rel(g[0], ref_g[0]), B.rel(g[1], ref_g[1]))
            print(f"  chunks={k:2d} lean={lean!s:5s} dh {e[0]:.3e} dw {e[1]:.3e}")
            rows.append((f"fusewise{'-lean' if lean else ''}-k{k}", e))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", default=None)
    a = ap.parse_args()
    rows = []
    for lean, mib in ((True, 256), (False, 256), (True, 512), (True, 1024), (False, 1024)):
        ms = breakdown(16384, lean, mib)
        rows.append(_rows.row("linear_cross_entropy", f"fusewise{'-lean' if lean else ''}-chunk"
                              f"{mib}M", "kernel_sum", f"16384x{B.D}x{B.V}", "bf16", ms, 0.0))  # fmt: skip
        torch.cuda.empty_cache()
    print("# gradient error vs float64 by chunk count (N=4096, d=2048, V=32768)")
    for name, (eh, ew) in precision_vs_chunks():
        rows.append(_rows.row("linear_cross_entropy", name, "rel_error_dh_dw", "4096x2048x32768",
                              "bf16", 0.0, 0.0, peak=f"{eh:.3e};{ew:.3e}"))  # fmt: skip
    if a.csv:
        _rows.append_csv(a.csv, rows)


if __name__ == "__main__":
    main()
