"""An experiment for issue #14: RMSNorm's forward written as Inductor writes it (its generated
kernel is in results/h200_inductor_code/rms_norm_8192_fwd.txt), against fusewise's shipped
forward and torch.compile in the same process.

Inductor's kernel walks a row twice in chunks: the first loop adds x*x into a [rows, chunk]
register tile (no reduction per chunk) and reduces once, the second loads x again (mostly from
L2) to write y; its loads carry eviction hints (evict_last in the first loop, evict_first in the
second, evict_last for the weight). fusewise's block kernel holds the row in registers and reads
it once. torch.compile's forward measured 5% faster at 8,192 (bf16, 2**27 elements) in two runs
of bench_norms --isolate on 2026-12-04. This times the looped kernel by chunk, rows a program,
warps and hints, with the shipped kernel before and after (kernels alone, CUDA-graph replay).

    python benchmarks/sweep_fwd_loop.py --csv out.csv     # GPU only
"""

from __future__ import annotations

import argparse
import sys

import _rows  # benchmarks/ is on sys.path when run as a script
import torch
import triton
import triton.language as tl

import fusewise
from fusewise import hardware
from fusewise.ops import reference

WIDTHS = [1024, 4096, 8192, 16384]
ELEMENTS = 1 << 27
# (rows a program, chunk, warps); chunk 0 means the whole row in one chunk
CONFIGS = [(1, 1024, 4), (1, 2048, 4), (1, 2048, 8), (1, 4096, 8), (2, 1024, 4), (1, 0, 8)]
# what Inductor's autotuner launched (inductor_code.py, 2026-12-04): at 8,192 one row of 8,192 on
# 16 warps (so two loops of one chunk each: x held in no register across the reduction); at
# 1,024 one row a program on one warp
INDUCTOR_CONFIGS = [(1, 0, 16), (1, 0, 32), (1, 0, 1), (1, 0, 2), (4, 0, 4)]
# at 16,384-32,768 (--wide): chunks of 4,096-16,384 on 8-32 warps
WIDE_CONFIGS = [(1, 0, 16), (1, 0, 32), (1, 16384, 16), (1, 8192, 16), (1, 8192, 8), (1, 4096, 8)]


@triton.jit
def rms_fwd_loop_kernel(
    X,
    W,
    Y,
    Rstd,
    N,
    eps,
    ROWS: tl.constexpr,
    CHUNK: tl.constexpr,
    HINTS: tl.constexpr,
):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    cols0 = tl.arange(0, CHUNK)[None, :]
    acc = tl.zeros([ROWS, CHUNK], tl.float32)
    for start in range(0, N, CHUNK):
        cols = start + cols0
        ptrs = X + rows * N + cols
        if HINTS:
            x = tl.load(ptrs, mask=cols < N, other=0.0, eviction_policy="evict_last")
        else:
            x = tl.load(ptrs, mask=cols < N, other=0.0)
        x = x.to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)[:, None]
    tl.store(Rstd + rows, rstd)
    for start in range(0, N, CHUNK):
        cols = start + cols0
        mask = cols < N
        ptrs = X + rows * N + cols
        if HINTS:
            x = tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
            w = tl.load(W + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        else:
            x = tl.load(ptrs, mask=mask, other=0.0)
            w = tl.load(W + cols, mask=mask, other=0.0)
        y = x.to(tl.float32) * rstd * w.to(tl.float32)
        tl.store(Y + rows * N + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def ln_fwd_loop_kernel(X, W, B, Y, N, eps, ROWS: tl.constexpr, CHUNK: tl.constexpr):
    """LayerNorm as Inductor writes it: three walks over the row (the sum, the centred sum of
    squares, y), the last two mostly from L1/L2, with its eviction hints."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]
    cols0 = tl.arange(0, CHUNK)[None, :]
    acc = tl.zeros([ROWS, CHUNK], tl.float32)
    for start in range(0, N, CHUNK):
        cols = start + cols0
        x = tl.load(X + rows * N + cols, mask=cols < N, other=0.0, eviction_policy="evict_last")
        acc += x.to(tl.float32)
    mean = (tl.sum(acc, axis=1) / N)[:, None]
    acc = tl.zeros([ROWS, CHUNK], tl.float32)
    for start in range(0, N, CHUNK):
        cols = start + cols0
        x = tl.load(X + rows * N + cols, mask=cols < N, other=0.0, eviction_policy="evict_last")
        xc = tl.where(cols < N, x.to(tl.float32) - mean, 0.0)
        acc += xc * xc
    rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)[:, None]
    for start in range(0, N, CHUNK):
        cols = start + cols0
        mask = cols < N
        x = tl.load(X + rows * N + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        w = tl.load(W + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        b = tl.load(B + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        y = (x.to(tl.float32) - mean) * rstd * w.to(tl.float32) + b.to(tl.float32)
        tl.store(Y + rows * N + cols, y.to(Y.dtype.element_ty), mask=mask)


def loop_ln(x, w, b, rows, chunk, warps):
    m, n = x.shape
    y = torch.empty_like(x)
    chunk = chunk or triton.next_power_of_2(n)
    ln_fwd_loop_kernel[(m // rows,)](x, w, b, y, n, 1e-5, ROWS=rows, CHUNK=chunk, num_warps=warps)
    return y


def loop_rms(x, w, rows, chunk, warps, hints):
    m, n = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    chunk = chunk or triton.next_power_of_2(n)
    rms_fwd_loop_kernel[(m // rows,)](
        x, w, y, rstd, n, 1e-6, ROWS=rows, CHUNK=chunk, HINTS=hints, num_warps=warps
    )
    return y


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--csv")
    p.add_argument("--inductor", action="store_true", help="INDUCTOR_CONFIGS, not CONFIGS")
    p.add_argument("--wide", action="store_true", help="WIDE_CONFIGS at 16,384 and 32,768")
    p.add_argument("--layer-norm", action="store_true", help="LayerNorm (with hints), not RMSNorm")
    a = p.parse_args(argv)
    if a.layer_norm:
        return main_layer_norm(a, [16384, 32768] if a.wide else WIDTHS)
    widths = [16384, 32768] if a.wide else WIDTHS
    if not torch.cuda.is_available():
        sys.exit("sweep_fwd_loop.py times GPU kernels; no CUDA device is present")
    dev = torch.device("cuda")
    ceiling = hardware.measure_bandwidth(dev)
    print(f"# copy ceiling {ceiling:,.0f} GB/s; % of it, RMSNorm forward bf16, {ELEMENTS} elements")
    print(f"{'variant':>34}: " + " ".join(f"{n:>6}" for n in widths))
    variants = [("shipped#1", lambda x, w: fusewise.ops.rms_norm(x, w, 1e-6))]
    configs = WIDE_CONFIGS if a.wide else INDUCTOR_CONFIGS if a.inductor else CONFIGS
    for rows, chunk, warps in configs:
        for hints in (False, True):
            label = f"loop rows={rows} chunk={chunk or 'N'} warps={warps} hints={int(hints)}"
            variants.append((label, lambda x, w, c=(rows, chunk, warps, hints): loop_rms(x, w, *c)))
    variants.append(("shipped#2", variants[0][1]))
    compiled = torch.compile(lambda x, w: reference.rms_norm(x, w, 1e-6), dynamic=False)
    torch._dynamo.config.recompile_limit = 64
    variants.append(("torch.compile (last: it may move the rest)", compiled))
    out = []
    for label, fn in variants:
        cells = []
        for n in widths:
            g = torch.Generator(device=dev).manual_seed(0)
            x = torch.randn(ELEMENTS // n, n, device=dev, dtype=torch.bfloat16, generator=g)
            w = 1 + 0.1 * torch.randn(n, device=dev, dtype=torch.bfloat16, generator=g)
            with torch.no_grad():
                want = reference.rms_norm(x.float(), w.float(), 1e-6)
                err = (fn(x, w).float() - want).abs().max().item()
                if err > 0.05:
                    raise AssertionError(f"{label} n={n}: max error {err}")
                replay = _rows.graph_replay(lambda fn=fn, x=x, w=w: fn(x, w))
            ms = triton.testing.do_bench(replay, warmup=25, rep=100, return_mode="median")
            gbps = 2 * x.numel() * x.element_size() / ms / 1e6
            cells.append(100 * gbps / ceiling)
            out.append(
                _rows.row(
                    "rms_norm", label, "fwd+graph", f"{x.shape[0]}x{n}", "bf16", ms, gbps, cells[-1]
                )
            )
        print(f"{label:>34}: " + " ".join(f"{c:6.1f}" for c in cells), flush=True)
    if a.csv:
        _rows.append_csv(a.csv, out)


def main_layer_norm(a, widths) -> None:
    """The same for LayerNorm: the looped kernel (hints always) against the shipped and
    torch.compile."""
    dev = torch.device("cuda")
    ceiling = hardware.measure_bandwidth(dev)
    print(f"# copy ceiling {ceiling:,.0f} GB/s; % of it, LayerNorm forward bf16, {ELEMENTS}")
    print(f"{'variant':>34}: " + " ".join(f"{n:>6}" for n in widths))
    shipped = lambda x, w, b: fusewise.ops.layer_norm(x, w, b, 1e-5)  # noqa: E731
    variants = [("shipped#1", shipped)]
    for rows, chunk, warps in WIDE_CONFIGS if a.wide else CONFIGS:
        label = f"loop rows={rows} chunk={chunk or 'N'} warps={warps}"
        variants.append((label, lambda x, w, b, c=(rows, chunk, warps): loop_ln(x, w, b, *c)))
    variants.append(("shipped#2", shipped))
    compiled = torch.compile(lambda x, w, b: reference.layer_norm(x, w, b, 1e-5), dynamic=False)
    torch._dynamo.config.recompile_limit = 64
    variants.append(("torch.compile (last: it may move the rest)", compiled))
    out = []
    for label, fn in variants:
        cells = []
        for n in widths:
            g = torch.Generator(device=dev).manual_seed(0)
            x = torch.randn(ELEMENTS // n, n, device=dev, dtype=torch.bfloat16, generator=g)
            w = 1 + 0.1 * torch.randn(n, device=dev, dtype=torch.bfloat16, generator=g)
            b = 0.1 * torch.randn(n, device=dev, dtype=torch.bfloat16, generator=g)
            with torch.no_grad():
                want = reference.layer_norm(x.float(), w.float(), b.float(), 1e-5)
                err = (fn(x, w, b).float() - want).abs().max().item()
                if err > 0.05:
                    raise AssertionError(f"{label} n={n}: max error {err}")
                replay = _rows.graph_replay(lambda fn=fn, x=x, w=w, b=b: fn(x, w, b))
            ms = triton.testing.do_bench(replay, warmup=25, rep=100, return_mode="median")
            gbps = 2 * x.numel() * x.element_size() / ms / 1e6
            cells.append(100 * gbps / ceiling)
            shape = f"{x.shape[0]}x{n}"
            row = _rows.row("layer_norm", label, "fwd+graph", shape, "bf16", ms, gbps, cells[-1])
            out.append(row)
        print(f"{label:>34}: " + " ".join(f"{c:6.1f}" for c in cells), flush=True)
    if a.csv:
        _rows.append_csv(a.csv, out)


if __name__ == "__main__":
    main()
