"""Why does a rotary kernel run 5-8% faster after torch.compile has run in the process?
(h200_rotary_order_dcea58d.txt: fusewise's and Liger's forward 47-48 us in a fresh process,
43.5-45.4 after the compile provider.) Times fusewise's and Liger's rotary (kernels only, CUDA
graph replay, bench_rotary's shape and timer) around one step, in one process:

    python benchmarks/order_probe.py --order pre,STEP,post   # kernels compiled before the step
    python benchmarks/order_probe.py --order STEP,post       # kernels compiled after it

STEP: none; ptxas (only what Inductor's first compile does to Triton's environment: point
TRITON_PTXAS_PATH at torch's own ptxas); compile_other (torch.compile of an unrelated function,
run once); compile_rotary (bench_rotary's compile provider, run once). Prints the TRITON_*
environment the step changed, and one row per (phase, provider, mode).
"""

from __future__ import annotations

import argparse
import os

import _rows
import bench_rotary as R
import torch


def _step(name: str) -> None:
    if name == "none":
        return
    if name == "ptxas":
        from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path

        _set_triton_ptxas_path()
    elif name == "compile_other":
        f = torch.compile(lambda x: x * 2 + 1, dynamic=False)
        f(torch.randn(1024, device="cuda"))
    elif name == "compile_rotary":
        fn = R.providers(["compile"])["compile"]
        R.bench_one(fn, "fwd@graph", R.SHAPE, torch.bfloat16, torch.device("cuda"))
    else:
        raise SystemExit(f"unknown step {name}")
    torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--order", required=True)
    p.add_argument("--csv", default=None)
    a = p.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    provs = R.providers(["fusewise", "liger"])
    b, s, hq, hkv, d = R.SHAPE
    shape_id = f"{b}x{s}x{hq}/{hkv}x{d}"
    env0 = {k: v for k, v in os.environ.items() if k.startswith("TRITON")}
    rows, steps = [], []
    for phase in a.order.split(","):
        if phase not in ("pre", "post"):
            steps.append(phase)
            _step(phase)
            env = {k: v for k, v in os.environ.items() if k.startswith("TRITON")}
            print(f"# after {phase}: TRITON env changed: {set(env.items()) - set(env0.items())}")
            continue
        for mode in ("fwd@graph", "fwd_bwd@graph"):
            for prov, fn in provs.items():
                ms, _ = R.bench_one(fn, mode, R.SHAPE, dtype, device)
                tag = f"{prov}[{a.order}:{phase}]"
                rows.append(_rows.row("rotary", tag, mode, shape_id, "bf16", ms, 0.0))
                print(f"{a.order:28s} {phase:4s} {mode:14s} {prov:9s} {1e3 * ms:8.2f} us")
    if a.csv:
        _rows.append_csv(a.csv, rows)


if __name__ == "__main__":
    main()
