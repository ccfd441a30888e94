"""Tuning sweep for the norm launch heuristics (ops/_norm_launch.py module constants).

Times fusewise rms_norm / layer_norm (bf16, 2**27 elements) forward and forward+backward under
each setting and prints GB/s per width, so the defaults can be chosen from data. GPU only.
"""

from __future__ import annotations

import itertools
import sys

import torch
import triton

import fusewise
from fusewise import cost, hardware
from fusewise.ops import _norm_launch as L


def gbps(op, mode, n, dtype=torch.bfloat16):
    m = (1 << 27) // n
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    w = torch.randn(n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype) if op == "layer_norm" else None
    f = (lambda: fusewise.ops.layer_norm(x, w, b)) if op == "layer_norm" else (lambda: fusewise.ops.rms_norm(x, w))
    c = cost.norm(op, m, n, dtype)
    if mode == "fwd":
        ms = triton.testing.do_bench(f, warmup=10, rep=40, return_mode="median")
    else:
        leaves = [t.requires_grad_() for t in (x, w, b) if t is not None]
        dy = torch.randn_like(x)
        run = lambda: torch.autograd.grad(f(), leaves, dy)  # noqa: E731
        ms = triton.testing.do_bench(run, warmup=10, rep=40, return_mode="median")
        c = c + cost.norm(op, m, n, dtype, backward=True)
    return c.bytes / ms / 1e6


def main():
    ceiling = hardware.measure_bandwidth(torch.device("cuda"))
    print(f"# copy ceiling {ceiling:.0f} GB/s")
    block_widths = [256, 1024, 4096, 8192, 16384]
    for op in sys.argv[1:] or ["rms_norm"]:
        for tile, ept in itertools.product([2048, 4096, 8192], [8, 16, 32]):
            L.TILE_ELEMENTS, L.FWD_ELEMENTS_PER_THREAD = tile, ept
            r = [gbps(op, "fwd", n) for n in block_widths]
            print(f"fwd {op} tile={tile} ept={ept}: " + " ".join(f"{v / ceiling * 100:5.1f}" for v in r), flush=True)
        L.TILE_ELEMENTS, L.FWD_ELEMENTS_PER_THREAD = 4096, 16
        for tile, ept, pps in itertools.product([2048, 4096, 8192], [4, 8, 16], [1, 2]):
            L.TILE_ELEMENTS, L.BWD_ELEMENTS_PER_THREAD, L.BWD_PROGRAMS_PER_SM = tile, ept, pps
            r = [gbps(op, "fwd_bwd", n) for n in block_widths]
            print(f"fwdbwd {op} tile={tile} ept={ept} pps={pps}: " + " ".join(f"{v / ceiling * 100:5.1f}" for v in r), flush=True)
        L.TILE_ELEMENTS, L.BWD_ELEMENTS_PER_THREAD, L.BWD_PROGRAMS_PER_SM = 4096, 8, 2
        for maxb, chunk, warps in itertools.product([16384, 32768], [2048, 4096, 8192], [8, 16]):
            L.MAX_BLOCK_N, L.WIDE_CHUNK, L.WIDE_WARPS = maxb, chunk, warps
            r = [gbps(op, mode, n) for mode in ("fwd", "fwd_bwd") for n in (32768, 65536, 262144)]
            print(f"wide {op} maxblock={maxb} chunk={chunk} warps={warps}: fwd/fwdbwd " + " ".join(f"{v / ceiling * 100:5.1f}" for v in r), flush=True)
        L.MAX_BLOCK_N, L.WIDE_CHUNK, L.WIDE_WARPS = 16384, 4096, 16


if __name__ == "__main__":
    sys.exit(main())
