"""Tuning sweep for the norm launch heuristics (ops/norms/launch.py module constants).

Times fusewise rms_norm / layer_norm kernels (bf16, 2**27 elements) forward and backward, replayed
from a CUDA graph so host overhead stays out, under each setting; prints % of the copy ceiling
per width (forward byte model 2·M·N·s, backward 3·M·N·s). GPU only.
"""

from __future__ import annotations

import itertools
import sys

import torch
import triton

from fusewise import hardware
from fusewise.ops.norms import launch as L


def graphed_ms(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return triton.testing.do_bench(g.replay, warmup=10, rep=40, return_mode="median")


def pct(op, mode, n, ceiling, dtype=torch.bfloat16):
    m = (1 << 27) // n
    is_rms = op == "rms_norm"
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    w = torch.randn(n, device="cuda", dtype=dtype)
    b = None if is_rms else torch.randn(n, device="cuda", dtype=dtype)
    if mode == "fwd":
        ms = graphed_ms(lambda: L.norm_forward(x, None, w, b, 1e-6, is_rms))
        passes = 2
    else:
        _, _, mean, rstd = L.norm_forward(x, None, w, b, 1e-6, is_rms)
        dy = torch.randn_like(x)
        ms = graphed_ms(lambda: L.norm_backward(dy, None, x, w, b, mean, rstd, is_rms))
        passes = 3
    return 100 * passes * x.numel() * x.element_size() / ms / 1e6 / ceiling


def row(label, values):
    print(f"{label}: " + " ".join(f"{v:5.1f}" for v in values), flush=True)


def main():
    ceiling = hardware.measure_bandwidth(torch.device("cuda"))
    print(f"# copy ceiling {ceiling:.0f} GB/s; columns are widths")
    block_widths = [256, 1024, 4096, 8192, 16384]
    for op in sys.argv[1:] or ["rms_norm"]:
        print(f"# {block_widths}")
        row(f"fwd {op} defaults", [pct(op, "fwd", n, ceiling) for n in block_widths + [32768]])
        for tile, ept, pps in itertools.product([2048, 4096, 8192], [8, 16], [1, 2, 4]):
            L.TILE_ELEMENTS_BWD, L.BWD_ELEMENTS_PER_THREAD, L.BWD_PROGRAMS_PER_SM = tile, ept, pps
            row(
                f"bwd {op} tile={tile} ept={ept} pps={pps}",
                [pct(op, "bwd", n, ceiling) for n in block_widths],
            )
        L.TILE_ELEMENTS_BWD, L.BWD_ELEMENTS_PER_THREAD, L.BWD_PROGRAMS_PER_SM = 4096, 16, 2
        for maxw in (8, 32):
            L.MAX_WARPS_BWD = maxw
            row(f"bwd {op} max_warps={maxw}", [pct(op, "bwd", n, ceiling) for n in block_widths])
        L.MAX_WARPS_BWD = 16


if __name__ == "__main__":
    sys.exit(main())
