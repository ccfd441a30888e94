"""Host time per eager call at a launch-bound size (8 x 4,096 bf16, so the GPU is never the
limit): fusewise against torch and, when installed, Liger; forward alone and forward+backward.
This is the overhead an eager step pays per norm (issue #14: within 1.5x of torch's native op).
"floor" is the least any Python autograd.Function launching a Triton kernel pays (_Floor).
GPU only.

python benchmarks/host_overhead.py [--profile] [--csv F]   (--profile: where fusewise's time
    goes, the top functions of cProfile over its layer_norm forward+backward calls; --csv: one
    long-format row per case and variant, the median over the rounds, in ms: with_tag.py and
    ab_summary.py then compare two source trees)
"""

import argparse
import cProfile
import pstats
import statistics
import time

import _rows
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import fusewise
from fusewise.ops._launch import launch

M, N = 8, 4096


def host_us(fn, n=500, warmup=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def inputs():
    """x, weight, bias (leaves that require grad), dy: [M, N] / [N] bf16 on the GPU."""
    kw = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(M, N, **kw, requires_grad=True)
    w = torch.randn(N, **kw, requires_grad=True)
    b = torch.randn(N, **kw, requires_grad=True)
    return x, w, b, torch.randn(M, N, **kw)


@triton.jit
def _nothing_kernel(p0, p1, p2, p3, p4, p5, p6, p7, i0, i1, i2, i3, i4, i5, eps, X: tl.constexpr):
    """Arguments as many as a norm kernel's, and no work: its launch is all that costs."""
    pass


class _Floor(torch.autograd.Function):
    """The least a Python autograd.Function over a Triton kernel can do per call: allocate its
    outputs and launch one kernel each way through fusewise's direct launcher, no checks, no
    plans. What fusewise's op costs beyond this is fusewise's; this much is the architecture's
    (a C++ op, as torch's, pays none of it)."""

    @staticmethod
    def forward(ctx, x, w, b):
        y = torch.empty_like(x)
        stats = torch.empty(x.shape[0], device=x.device, dtype=torch.float32)
        launch(
            _nothing_kernel,
            (1,),
            x,
            w,
            b,
            y,
            stats,
            stats,
            x,
            x,
            8,
            4096,
            4096,
            4096,
            1,
            1,
            1e-5,
            X=1,
        )
        ctx.save_for_backward(x, w, b, stats)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, b, stats = ctx.saved_tensors
        dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)
        launch(
            _nothing_kernel,
            (1,),
            x,
            w,
            dy,
            dx,
            stats,
            stats,
            dw,
            db,
            8,
            4096,
            4096,
            4096,
            1,
            1,
            1e-5,
            X=1,
        )
        return dx, dw, db


def _floor_fwd(x, w, b):
    """The floor without autograd (what a forward that needs no gradient pays)."""
    y = torch.empty_like(x)
    stats = torch.empty(x.shape[0], device=x.device, dtype=torch.float32)
    launch(
        _nothing_kernel, (1,), x, w, b, y, stats, stats, x, x, 8, 4096, 4096, 4096, 1, 1, 1e-5, X=1
    )
    return y


def cases():
    x, w, b, dy = inputs()
    xd, wd, bd = x.detach(), w.detach(), b.detach()

    def fwd_bwd(f, *params):
        return lambda: torch.autograd.grad(f(), params, dy)

    fw = fusewise.ops
    out = {
        "layer_norm fwd": {
            "fusewise": lambda: fw.layer_norm(xd, wd, bd),
            "torch": lambda: F.layer_norm(xd, (N,), wd, bd),
        },
        "layer_norm fwd+bwd": {
            "fusewise": fwd_bwd(lambda: fw.layer_norm(x, w, b), x, w, b),
            "torch": fwd_bwd(lambda: F.layer_norm(x, (N,), w, b), x, w, b),
        },
        "rms_norm fwd": {
            "fusewise": lambda: fw.rms_norm(xd, wd),
            "torch": lambda: F.rms_norm(xd, (N,), wd),
        },
        "rms_norm fwd+bwd": {
            "fusewise": fwd_bwd(lambda: fw.rms_norm(x, w), x, w),
            "torch": fwd_bwd(lambda: F.rms_norm(x, (N,), w), x, w),
        },
    }
    for case in ("layer_norm", "rms_norm"):
        out[f"{case} fwd"]["floor"] = lambda: _floor_fwd(xd, wd, bd)
        out[f"{case} fwd+bwd"]["floor"] = fwd_bwd(lambda: _Floor.apply(x, w, b), x, w, b)
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        out["layer_norm fwd"]["liger"] = lambda: LigerLayerNormFunction.apply(xd, wd, bd, 1e-5)
        out["layer_norm fwd+bwd"]["liger"] = fwd_bwd(
            lambda: LigerLayerNormFunction.apply(x, w, b, 1e-5), x, w, b
        )
        out["rms_norm fwd"]["liger"] = lambda: LigerRMSNormFunction.apply(xd, wd, 1e-6)
        out["rms_norm fwd+bwd"]["liger"] = fwd_bwd(
            lambda: LigerRMSNormFunction.apply(x, w, 1e-6), x, w
        )
    except ImportError:
        print("# liger: not installed, skipped")
    return out


def interleaved(fns: dict, rounds=9, n=300):
    """Host us per call of each variant, measured in alternation (round by round, so a host
    whose speed drifts moves every variant alike): {name: [us per round]}."""
    for fn in fns.values():
        host_us(fn, n=50)
    out = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            out[name].append(host_us(fn, n=n, warmup=0))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--csv", help="append a row per case and variant here")
    a = ap.parse_args()
    table = cases()
    print(f"host us per eager call, {M} x {N} bf16, {torch.cuda.get_device_name()}, median of")
    print("9 interleaved rounds; fusewise/torch: median [min, max] of the per-round ratios")
    rows = []
    for case, fns in table.items():
        us = interleaved(fns)
        ratios = sorted(f / t for f, t in zip(us["fusewise"], us["torch"]))
        med = {name: statistics.median(v) for name, v in us.items()}
        print(
            f"{case:20s} "
            + "  ".join(f"{name} {v:6.1f}" for name, v in med.items())
            + f"   fusewise/torch {statistics.median(ratios):.2f}"
            + f" [{ratios[0]:.2f}, {ratios[-1]:.2f}]"
        )
        rows += [
            _rows.row(case, name, "host", f"{M}x{N}", "bf16", v / 1e3, v) for name, v in med.items()
        ]
    if a.csv:
        _rows.append_csv(a.csv, rows)
    if a.profile:
        fn = table["layer_norm fwd+bwd"]["fusewise"]
        host_us(fn, n=50)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
