"""The rotary kernel's tile (elements per tile) and warps, swept on the GPU at bench_rotary's shape:
the choice behind ops/rotary/launch.py's TILE_ELEMENTS and NUM_WARPS (set there as module
attributes, read at each call). Forward and forward+backward in bf16, % of the copy ceiling by
the same byte model as bench_rotary.py, timed as CUDA-graph replays (the kernels alone: eager
calls at this size are host-bound).

    python benchmarks/sweep_rotary_tiles.py [--csv out.csv]
"""

from __future__ import annotations

import argparse

import bench_rotary  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
import torch

import fusewise
from fusewise import hardware
from fusewise.ops.rotary import cost, launch

TILES = (1024, 2048, 4096, 8192)
WARPS = (2, 4, 8)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--csv", default=None)
    a = p.parse_args(argv)
    device = torch.device("cuda")
    copy_gbps = hardware.measure_bandwidth(device)  # GB/s, read + written, of a large copy
    b, s, hq, hkv, d = bench_rotary.SHAPE
    dtype = torch.bfloat16
    print(f"# copy ceiling {copy_gbps:,.0f} GB/s")
    lines = ["tile,warps,mode,ms,pct_copy"]
    for tile in TILES:
        for warps in WARPS:
            launch.TILE_ELEMENTS, launch.NUM_WARPS = tile, warps
            for mode in ("fwd@graph", "fwd_bwd@graph"):  # the kernels alone: no host time
                ms, _ = bench_rotary.bench_one(
                    fusewise.ops.apply_rotary, mode, bench_rotary.SHAPE, dtype, device
                )
                one = cost.rotary(b * s * (hq + hkv) * d, b * s * d, dtype).bytes
                nbytes = one * (1 if mode.startswith("fwd@") else 2)
                pct = 100 * nbytes / (ms * 1e-3) / (copy_gbps * 1e9)
                lines.append(f"{tile},{warps},{mode},{ms:.4f},{pct:.1f}")
                print(lines[-1], flush=True)
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
