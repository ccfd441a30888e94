"""Tuning sweep for the norm launch heuristics (ops/norms/launch.py module constants).

Times the fusewise rms_norm / layer_norm kernels alone (bf16, 2**26 elements by default),
replayed from a CUDA graph so host overhead stays out, under each setting of the launch
constants; % of the copy ceiling by the byte model (forward 2·M·N·s, backward 3·M·N·s). GPU only.

Parts (--parts):
  fwd     the forward with the shipped settings, every width
  fused   the fused (persistent, registers) backward: tile, elements per thread, programs per SM
  wide16  the fused backward at 16384: warps, programs per SM, prefetch
  split   the split backward (row sums, then tiles): tile rows, columns, warps, waves
  rows    the one-program-per-row wide backward (rows past MAX_BLOCK_N)
  fwdwide the forward's wide path: chunk and warps

    python benchmarks/sweep_norm_configs.py --csv out.csv --parts fused,split
"""

from __future__ import annotations

import argparse
import csv
import itertools
import sys

import torch
import triton

from fusewise import hardware
from fusewise.ops.norms import launch as L

BLOCK_WIDTHS = [256, 1024, 4096, 8192, 16384]
WIDE_WIDTHS = [32768, 65536, 262144]


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


class Inputs:
    """One set of tensors per (op, width), reused by every setting."""

    def __init__(self, elements: int):
        self.elements, self.cache = elements, {}

    def get(self, op: str, n: int):
        if (op, n) not in self.cache:
            self.cache.clear()
            torch.cuda.empty_cache()
            m = self.elements // n
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            b = None if op == "rms_norm" else torch.randn_like(w)
            _, _, mean, rstd = L.norm_forward(x, None, w, b, 1e-6, op == "rms_norm")
            self.cache[(op, n)] = (x, w, b, torch.randn_like(x), mean, rstd)
        return self.cache[(op, n)]


def pct(inputs, op, mode, n, ceiling):
    x, w, b, dy, mean, rstd = inputs.get(op, n)
    is_rms = op == "rms_norm"
    if mode == "fwd":
        ms = graphed_ms(lambda: L.norm_forward(x, None, w, b, 1e-6, is_rms))
        passes = 2
    else:
        ms = graphed_ms(lambda: L.norm_backward(dy, None, x, w, b, mean, rstd, is_rms))
        passes = 3
    return ms, 100 * passes * x.numel() * x.element_size() / ms / 1e6 / ceiling


def settings(part: str, op: str):
    """(label, {constant: value}) for each setting of a part; shipped values are restored after."""
    ln = op == "layer_norm"
    if part == "fused":
        names = (
            ("TILE_ELEMENTS_BWD_LN", "BWD_ELEMENTS_PER_THREAD_LN", "BWD_PROGRAMS_PER_SM_LN")
            if ln
            else ("TILE_ELEMENTS_BWD", "BWD_ELEMENTS_PER_THREAD", "BWD_PROGRAMS_PER_SM")
        )
        for tile, ept, pps in itertools.product([2048, 4096, 8192], [8, 16], [1, 2]):
            yield f"tile={tile} ept={ept} pps={pps}", dict(zip(names, (tile, ept, pps)))
    elif part == "wide16":
        pps_name = "BWD_PROGRAMS_PER_SM_LN" if ln else "BWD_PROGRAMS_PER_SM"
        for warps, pps, prefetch in itertools.product([16, 32], [1, 2], [8192, 16384]):
            label = f"warps={warps} pps={pps} prefetch={prefetch > 8192}"
            yield label, {"MAX_WARPS_BWD_WIDE": warps, pps_name: pps, "PREFETCH_MAX_N": prefetch}
    elif part == "split":
        for tm, tn, tw, waves in [
            (16, 512, 8, 4),
            (8, 512, 4, 4),
            (16, 256, 4, 4),
            (32, 256, 8, 4),
            (8, 1024, 8, 4),
            (32, 512, 16, 2),
            (16, 512, 8, 8),
        ]:
            yield (
                f"m={tm} n={tn} warps={tw} waves={waves}",
                {"TILES_M": tm, "TILES_N": tn, "TILES_WARPS": tw, "TILES_WAVES": waves},
            )
    elif part == "rows":
        for chunk, warps in [(4096, 16), (2048, 8), (8192, 16)]:
            yield (
                f"chunk={chunk} warps={warps}",
                {"WIDE_BACKWARD": "rows", "WIDE_CHUNK": chunk, "WIDE_WARPS": warps},
            )
    elif part == "fwdwide":
        for chunk, warps in [(16384, 16), (8192, 16), (8192, 8), (32768, 32)]:
            yield f"chunk={chunk} warps={warps}", {"WIDE_CHUNK_FWD": chunk, "WIDE_WARPS": warps}
    else:
        yield "shipped", {}


WIDTHS = {
    "fwd": BLOCK_WIDTHS + WIDE_WIDTHS,
    "fused": BLOCK_WIDTHS[:-1],
    "wide16": [16384],
    "split": [8192, 16384] + WIDE_WIDTHS,
    "rows": WIDE_WIDTHS,
    "fwdwide": WIDE_WIDTHS,
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="layer_norm,rms_norm")
    p.add_argument("--parts", default="fwd,fused,wide16,split,rows")
    p.add_argument("--elements", type=int, default=1 << 26)
    p.add_argument("--csv", default=None)
    args = p.parse_args()
    ceiling = hardware.measure_bandwidth(torch.device("cuda"))
    print(f"# copy ceiling {ceiling:.0f} GB/s; % of it by the byte model")
    inputs = Inputs(args.elements)
    out = csv.writer(open(args.csv, "a", newline="", buffering=1)) if args.csv else None
    # SPLIT_MIN_N_* decide fused or split at block widths: each part forces its own path
    force = {"fused": 1 << 40, "wide16": 1 << 40, "split": 0}
    for part, op in itertools.product(args.parts.split(","), args.ops.split(",")):
        widths = WIDTHS[part]
        mode = "fwd" if part.startswith("fwd") else "bwd"
        print(f"# {part} {op} {mode}, widths {widths}", flush=True)
        for label, values in settings(part, op):
            values = {**values}
            if part in force:
                values["SPLIT_MIN_N_LN" if op == "layer_norm" else "SPLIT_MIN_N_RMS"] = force[part]
            saved = {k: getattr(L, k) for k in values}
            try:
                for k, v in values.items():
                    setattr(L, k, v)
                cells = []
                for n in widths:
                    try:
                        ms, share = pct(inputs, op, mode, n, ceiling)
                    except Exception as e:  # a setting that does not compile or fit: say so
                        print(f"#   {label} n={n}: {type(e).__name__}: {str(e)[:120]}")
                        ms, share = float("nan"), float("nan")
                    cells.append(share)
                    if out:
                        out.writerow([part, op, mode, n, label, f"{ms:.5f}", f"{share:.1f}"])
            finally:
                for k, v in saved.items():
                    setattr(L, k, v)
            print(f"{label:>36}: " + " ".join(f"{c:5.1f}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
