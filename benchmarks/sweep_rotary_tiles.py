"""The rotary kernel's chunk (q and k elements a program loads before it stores) and warps, swept
on the GPU at bench_rotary's shape: the choice behind ops/rotary/launch.py's CHUNK_ELEMENTS and
NUM_WARPS (set there as module attributes, part of every launch plan's key). Forward and
forward+backward, % of the copy ceiling by the same byte model as bench_rotary.py, timed as
CUDA-graph replays (the kernels alone: eager calls at this size are host-bound).

    python benchmarks/sweep_rotary_tiles.py [--dtypes bf16,fp32] [--inplace] [--csv out.csv]

Liger's kernel is timed before and after the sweep in the same process (the yardstick, and the
drift of the machine over the sweep). --inplace (an experiment, not a shipped mode) writes the
outputs over q and k, as Liger does, to tell its in-place writes from the kernel's other
differences.
"""

from __future__ import annotations

import argparse

import _rows  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
import bench_rotary  # noqa: E402
import torch

import fusewise
from fusewise import hardware
from fusewise.ops.rotary import cost, launch

CHUNKS = (1024, 2048, 4096, 8192)
WARPS = (4, 8)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dtypes", default="bf16")
    p.add_argument("--chunks", default=",".join(map(str, CHUNKS)))
    p.add_argument("--warps", default=",".join(map(str, WARPS)))
    p.add_argument("--inplace", action="store_true", help="also time each setting in place")
    p.add_argument("--csv", default=None)
    a = p.parse_args(argv)
    device = torch.device("cuda")
    copy_gbps = hardware.measure_bandwidth(device)  # GB/s, read + written, of a large copy
    b, s, hq, hkv, d = bench_rotary.SHAPE
    print(f"# copy ceiling {copy_gbps:,.0f} GB/s; commit {_rows.commit()}")
    lines = ["variant,chunk,warps,dtype,mode,ms,pct_copy"]
    liger = bench_rotary.providers(["liger"]).get("liger")
    alloc = launch.alloc

    def time_it(variant, fn, chunk, warps, dtype, dname):
        for mode in ("fwd@graph", "fwd_bwd@graph"):  # the kernels alone: no host time
            ms, _ = bench_rotary.bench_one(fn, mode, bench_rotary.SHAPE, dtype, device)
            one = cost.rotary(b * s * (hq + hkv) * d, b * s * d, dtype).bytes
            nbytes = one * (1 if mode.startswith("fwd@") else 2)
            pct = 100 * nbytes / (ms * 1e-3) / (copy_gbps * 1e9)
            lines.append(f"{variant},{chunk},{warps},{dname},{mode},{ms:.4f},{pct:.1f}")
            print(lines[-1], flush=True)

    for dname in a.dtypes.split(","):
        dtype = DTYPES[dname]
        if liger:
            time_it("liger-before", liger, "", "", dtype, dname)
        for chunk in map(int, a.chunks.split(",")):
            for warps in map(int, a.warps.split(",")):
                launch.CHUNK_ELEMENTS, launch.NUM_WARPS = chunk, warps
                for inplace in (False, True) if a.inplace else (False,):
                    launch.alloc = (lambda like: like) if inplace else alloc
                    variant = "inplace" if inplace else "shipped"
                    time_it(variant, fusewise.ops.apply_rotary, chunk, warps, dtype, dname)
                launch.alloc = alloc
        if liger:
            time_it("liger-after", liger, "", "", dtype, dname)
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
