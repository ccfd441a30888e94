"""Sweep of the cooperative forward (kernels_coop.py, settings.FWD_COOP): a row cut into pieces,
one program each, against the shipped forward (walk or wide kernel) before and after, kernels
only (CUDA-graph replay), % of the copy ceiling by sweep_norm_configs' byte model. Each line ends
with the largest error against float32 torch. GPU only.

    python benchmarks/sweep_norm_coop.py --dtypes bf16,fp32 --csv out.csv
"""

from __future__ import annotations

import argparse
import itertools
import sys

import _rows  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
import torch
from sweep_norm_configs import DTYPES, Inputs, _worst, measure, relative_error

from fusewise import hardware
from fusewise.ops.norms import launch as L

# pieceXwarps[n][rR]: a piece's elements a thread holds are piece / (32 * warps), 16-32 fp32
# registers; n: narrow, 16-bit inputs held as they are (Coop.narrow), so twice the elements in
# registers; rR: at most R registers a thread (Coop.registers), 32: two programs of 32 warps on a
# multiprocessor
PIECES = ["16384x16", "32768x32", "32768x32n", "32768x32nr32", "65536x32n"]


def coop_setting(spec: str):
    """Coop(1, 2**40, ...) from "pieceXwarps[n][rR]" (PIECES)."""
    piece, rest = spec.split("x")
    rest, _, registers = rest.partition("r")
    narrow = rest.endswith("n")
    return L.Coop(1, 1 << 40, int(piece), int(rest.rstrip("n")), narrow, int(registers or 0))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="layer_norm,rms_norm,add_rms_norm")
    p.add_argument("--dtypes", default="bf16")
    p.add_argument("--widths", default="65536,131072,262144")
    p.add_argument("--pieces", default=",".join(PIECES))
    p.add_argument("--elements", type=int, default=1 << 27)
    p.add_argument("--csv", default=None)
    args = p.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    ceiling = hardware.measure_bandwidth(torch.device("cuda"))
    print(f"# copy ceiling {ceiling:.0f} GB/s; % of it by the byte model; commit {_rows.commit()}")
    inputs = Inputs(args.elements)
    labels = ["shipped#1"] + [f"coop {s}" for s in args.pieces.split(",")] + ["shipped#2"]
    for op, dname in itertools.product(args.ops.split(","), args.dtypes.split(",")):
        print(f"# coop {op} fwd {dname}, widths {widths}", flush=True)
        for label in labels:
            coop = {}
            if label.startswith("coop"):
                setting = (coop_setting(label.split()[1]),)
                coop = {(op, 2): setting, (op, 4): setting}
            saved, L.FWD_COOP = L.FWD_COOP, coop or L.FWD_COOP
            cells, rows, errors = [], [], []
            try:
                for n in widths:
                    try:
                        ms, nbytes = measure(inputs, op, "fwd", n, DTYPES[dname])
                        errors.append(relative_error(inputs, op, "fwd", n, DTYPES[dname]))
                    except Exception as e:  # a setting that does not compile or fit: say so
                        print(f"#   {label} n={n}: {type(e).__name__}: {str(e)[:120]}")
                        cells.append(float("nan"))
                        continue
                    gbps = nbytes / ms / 1e6
                    cells.append(100 * gbps / ceiling)
                    shape = f"{args.elements // n}x{n}"
                    rows.append(_rows.row(op, f"fusewise[{label}]", "fwd", shape, dname, ms, gbps,
                                          cells[-1]))  # fmt: skip
            finally:
                L.FWD_COOP = saved
            if args.csv:
                _rows.append_csv(args.csv, rows)
            line = " ".join(f"{c:5.1f}" for c in cells)
            print(f"{label:>20}: {line}  {_worst(errors)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
