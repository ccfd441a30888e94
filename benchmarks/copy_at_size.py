"""What a plain device-to-device copy reaches at the sizes the kernels move, against the copy
ceiling every benchmark divides by (hardware.measure_bandwidth: a 1 GiB copy, 2 GiB of traffic).

A kernel that moves 172 MB (the rotary forward at Llama's shapes) pays the same start-up and
tail as a copy of 172 MB; if that copy itself stays under 90% of the 2 GiB ceiling, so must any
kernel of that size. Each size is a copy of half its traffic (read + written = the size), in
bf16, replayed from a CUDA graph (the kernel alone) and timed with triton's do_bench (median);
the sizes go in ROUNDS interleaved rounds, so a drift of the machine shows as a spread.

Named sizes are the byte models of the benchmarks (bench_rotary, bench_gated, bench_norms):
  rotary_fwd   B 4 x S 2048 x (32 + 8) heads x 128, q and k read and written, cos and sin read
  gated_5632   swiglu forward at 16,384 x 5,632: gate and up read, the product written
  gated_14336  the same at 14,336
  norm_2e27    a norm forward over 2**27 elements: x read, y written

    python benchmarks/copy_at_size.py --csv out.csv
"""

from __future__ import annotations

import argparse
import sys

import _rows  # benchmarks/ is on sys.path when run as a script
import torch
import triton

from fusewise import hardware

MB = 1_000_000
_BF16 = 2
NAMED = {
    "rotary_fwd": 2 * 4 * (32 + 8) * 2048 * 128 * _BF16 + 2 * 4 * 2048 * 128 * _BF16,
    "gated_5632": 3 * 16384 * 5632 * _BF16,
    "gated_14336": 3 * 16384 * 14336 * _BF16,
    "norm_2e27": 2 * 2**27 * _BF16,
}
PLAIN_MB = (8, 32, 64, 128, 256, 512, 1024, 2048)


def copy_ms(traffic_bytes: int, device) -> float:
    """Median ms of one replayed copy of traffic_bytes / 2 bytes."""
    n = traffic_bytes // (2 * _BF16)
    src = torch.randn(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    replay = _rows.graph_replay(lambda: dst.copy_(src))
    return triton.testing.do_bench(replay, warmup=25, rep=100, return_mode="median")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--csv")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("copy_at_size.py times GPU copies; no CUDA device is present")
    device = torch.device("cuda")
    sizes = dict(NAMED) | {f"{mb}MB": mb * MB for mb in PLAIN_MB}
    ceiling = hardware.measure_bandwidth(device)
    print(f"# {torch.cuda.get_device_name()}; copy ceiling {ceiling:,.0f} GB/s (2 GiB of traffic)")
    per_size: dict[str, list[float]] = {name: [] for name in sizes}
    rows = []
    for r in range(a.rounds):
        for name, nbytes in sizes.items():
            ms = copy_ms(nbytes, device)
            gbps = nbytes / ms / 1e6
            per_size[name].append(gbps)
            rows.append(
                _rows.row(
                    "copy", "torch", f"graph#{r}", name, "bf16", ms, gbps, 100 * gbps / ceiling
                )
            )
    if a.csv:
        _rows.append_csv(a.csv, rows)
    print(f"{'size':12s} {'MB':>8s} {'GB/s (rounds)':>30s} {'% of ceiling':>14s}")
    for name, nbytes in sizes.items():
        g = sorted(per_size[name])
        pct = ", ".join(f"{100 * x / ceiling:.1f}" for x in g)
        print(f"{name:12s} {nbytes / MB:8.1f} {', '.join(f'{x:,.0f}' for x in g):>30s}   {pct}")


if __name__ == "__main__":
    main()
