"""Where fusewise's linear-CE time goes, per kernel (torch.profiler, GPU), and how its gradient
error depends on the number of chunks. python benchmarks/profile_linear_ce.py [--csv P]"""

from __future__ import annotations

import argparse
import collections

import _rows  # noqa: E402
import bench_linear_ce as B
import torch

import fusewise
from fusewise.ops import reference


def breakdown(n, exact, chunk):
    h, w, t = B.make_inputs(n, B.D, B.V)
    fn = B._fusewise(chunk_size=chunk, fp32_accumulate=exact)
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
    print(f"# N={n} fp32_accumulate={exact} chunk={chunk}: {total:.2f} ms of kernels per step")
    for name, ms in per.most_common(8):
        print(f"  {ms:8.2f} ms  {name}")
    return total


def row_kernel_sweep(rows):
    """The chunk pass alone on [1024, 128256] bf16 logits (statistics + gradient in place):
    programs per SM x columns per step x warps. Byte model: read twice, write once."""
    import triton

    from fusewise.ops.linear_ce import launch as R

    z = torch.randn(1024, B.V, device="cuda").bfloat16()
    t = torch.randint(0, B.V, (1024,), device="cuda")
    loss, lse, scale = (torch.empty(1024, device="cuda") for _ in range(3))
    scale.fill_(1e-3)
    nbytes = 3 * z.numel() * 2
    saved = (R.PROGRAMS_PER_SM, R.BLOCK_V, R.ROW_WARPS)
    print("# row kernel alone, [1024, 128256] bf16: programs/SM, block, warps -> us, GB/s")
    for pps in (1, 2, 4, 8):
        for block in (2048, 4096, 8192):
            for warps in (4, 8, 16):
                R.PROGRAMS_PER_SM, R.BLOCK_V, R.ROW_WARPS = pps, block, warps
                args = (z, t, loss, lse, scale, (-100, 0.0, 0.0, None))
                fn = lambda args=args: R.ce_rows_triton(*args)  # noqa: E731
                try:
                    ms = triton.testing.do_bench(fn, warmup=20, rep=200, return_mode="median")
                except Exception as e:  # a configuration that does not compile is skipped
                    print(f"  {pps} {block} {warps}: failed {type(e).__name__}")
                    continue
                print(f"  {pps} {block:5d} {warps:2d}: {ms * 1e3:7.1f} us {nbytes / ms / 1e6:6.0f}")
                rows.append(
                    _rows.row(
                        "ce_rows_kernel",
                        f"pps{pps}-b{block}-w{warps}",
                        "fwd_grad",
                        f"1024x{B.V}",
                        "bf16",
                        ms,
                        nbytes / ms / 1e6,
                    )
                )
    R.PROGRAMS_PER_SM, R.BLOCK_V, R.ROW_WARPS = saved


def precision_vs_chunks(n=4096, d=2048, v=32768):
    """dweight / dhidden error against float64 with k chunks forced (k=16 is PERF.md's shape at
    the default chunk size), next to eager (same formula, bf16 logits) and Liger."""
    h, w, t = B.make_inputs(n, d, v, seed=1, ignore_every=7)
    hd, wd = (x.detach().double().requires_grad_() for x in (h, w))
    ref_g = torch.autograd.grad(reference.linear_cross_entropy(hd, wd, t), [hd, wd])
    rows = []
    for k in (1, 4, 8, 16, 32):
        for exact in (False, True):
            loss = fusewise.ops.linear_cross_entropy(
                h, w, t, fp32_accumulate=exact, chunk_size=n // k
            )
            g = torch.autograd.grad(loss, [h, w])
            e = (B.rel(g[0], ref_g[0]), B.rel(g[1], ref_g[1]))
            print(f"  chunks={k:2d} fp32_accumulate={exact!s:5s} dh {e[0]:.3e} dw {e[1]:.3e}")
            rows.append((f"fusewise{'-fp32acc' if exact else ''}-k{k}", e))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", default=None)
    a = ap.parse_args()
    rows = []
    row_kernel_sweep(rows)
    for exact, chunk in ((False, 1024), (True, 1024), (False, 2048)):
        ms = breakdown(16384, exact, chunk)
        name = f"fusewise{'-fp32acc' if exact else ''}-chunk{chunk}"
        rows.append(
            _rows.row(
                "linear_cross_entropy", name, "kernel_sum", f"16384x{B.D}x{B.V}", "bf16", ms, 0.0
            )
        )
        torch.cuda.empty_cache()
    print("# gradient error vs float64 by chunk count (N=4096, d=2048, V=32768)")
    for name, (eh, ew) in precision_vs_chunks():
        rows.append(
            _rows.row(
                "linear_cross_entropy",
                name,
                "rel_error_dh_dw",
                "4096x2048x32768",
                "bf16",
                0.0,
                0.0,
                peak=f"{eh:.3e};{ew:.3e}",
            )
        )
    if a.csv:
        _rows.append_csv(a.csv, rows)


if __name__ == "__main__":
    main()
