"""The rotary kernel's variants (ops/rotary/launch.py VARIANTS: one program per row walking head
tiles, several rows a program, head blocks, whole rows with every load ahead of the stores,
the GPU's rounding cast) against Liger's rope kernel at bench_rotary's shape (B 4 x S 2048 x
Hq 32 / Hkv 8 x D 128, HF's transposed q and k), bf16 and fp32, forward and forward+backward,
timed as CUDA-graph replays (the kernels alone), % of the copy ceiling by bench_rotary's byte
model (fusewise.ops.rotary.cost). Each variant's forward and backward are first checked
bit for bit against the default's ("same" column). NAME-inplace rows: that variant's forward
writing over q and k as Liger's does (a diagnostic of the in-place writes; the same byte count).
About a minute on an H200.

    python benchmarks/sweep_rotary_variants.py [--variants row,whole,...] [--csv out.csv]
"""

from __future__ import annotations

import argparse

import _rows  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
import bench_rotary
import torch
import triton

import fusewise
from fusewise import hardware
from fusewise.ops.rotary import cost, launch

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
MODES = ("fwd@graph", "fwd_bwd@graph")
INPLACE = ("row-inplace", "row-native-inplace", "whole-inplace")


def _outputs(shape, dtype, device):
    """Forward and backward outputs of the current variant on bench_rotary's inputs."""
    q, k, cos, sin = bench_rotary.inputs(shape, dtype, device)
    q.requires_grad_()
    k.requires_grad_()
    outs = fusewise.ops.apply_rotary(q, k, cos, sin)
    g = torch.Generator(device=device).manual_seed(1)
    grads = [torch.randn(o.shape, device=device, dtype=dtype, generator=g) for o in outs]
    return [o.detach() for o in outs] + list(torch.autograd.grad(outs, (q, k), grads))


def _in_place(q, k, cos, sin):
    """The current variant's forward written over q and k, as Liger's (a diagnostic: apply_rotary
    always returns new tensors)."""
    return launch.rotary(q, k, cos, sin, False, in_place=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "--variants",
        default=",".join([*launch.VARIANTS, *INPLACE]),
        help="names of launch.VARIANTS; NAME-inplace: that variant's forward written over q, k",
    )
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--csv", default=None)
    a = p.parse_args(argv)
    device = torch.device("cuda")
    shape = bench_rotary.SHAPE
    b, s, hq, hkv, d = shape
    shape_id = f"{b}x{s}x{hq}/{hkv}x{d}"
    commit = _rows.commit()
    copy_gbps = hardware.measure_bandwidth(device)  # GB/s, read + written, of a large copy
    print(f"# {torch.cuda.get_device_name()}; triton {triton.__version__}; commit {commit}")
    print(f"# copy ceiling {copy_gbps:,.0f} GB/s; {shape_id}; CUDA-graph replays")
    names = a.variants.split(",")
    liger = bench_rotary.providers(["liger"]).get("liger")
    rows, table = [], {}
    for dname in a.dtypes.split(","):
        dtype = DTYPES[dname]
        launch.VARIANT = "row"
        want = _outputs(shape, dtype, device)
        one = cost.rotary(b * s * (hq + hkv) * d, b * s * d, dtype)
        for name in [*names, "liger"]:
            if name == "liger":
                if liger is None:
                    continue
                fn, same = liger, ""
            elif name.endswith("-inplace"):  # forward only: the kernel writing over q and k
                launch.VARIANT = name.removesuffix("-inplace")
                fn, same = _in_place, ""
            else:
                launch.VARIANT = name
                fn = fusewise.ops.apply_rotary
                got = _outputs(shape, dtype, device)
                same = "yes" if all(torch.equal(x, y) for x, y in zip(got, want)) else "NO"
            for mode in MODES:
                if name.endswith("-inplace") and mode != "fwd@graph":
                    continue
                ms, _ = bench_rotary.bench_one(fn, mode, shape, dtype, device)
                nbytes = one.bytes * (1 if mode.startswith("fwd@") else 2)
                gbps = nbytes / ms / 1e6
                pct = 100 * gbps / copy_gbps
                table[(name, dname, mode)] = (pct, same)
                row = _rows.row(
                    "rotary", name, mode, shape_id, dname, ms, gbps, pct, commit_id=commit
                )
                rows.append(row)
                print(f"{name:16s} {dname:4s} {mode:14s} {ms:8.4f} ms {pct:5.1f}% same={same}")
            torch.cuda.empty_cache()
    launch.VARIANT = "row"
    if a.csv:
        _rows.append_csv(a.csv, rows)
    print("\n# % of copy ceiling (CUDA-graph replays); same: outputs bit-equal to the default")
    cols = [(dn, m) for dn in a.dtypes.split(",") for m in MODES]
    print(f"{'variant':16s} " + " ".join(f"{dn + ' ' + m.split('@')[0]:>12s}" for dn, m in cols))
    for name in [*names, "liger"]:
        cells = [table.get((name, dn, m)) for dn, m in cols]
        if not any(cells):
            continue
        same = next((c[1] for c in cells if c), "")
        text = " ".join(f"{c[0]:12.1f}" if c else f"{'-':>12s}" for c in cells)
        print(f"{name:16s} {text}  {same}")


if __name__ == "__main__":
    main()
