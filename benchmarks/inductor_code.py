"""The Triton code torch.compile generates for the peers' formulas (the norms of bench_norms.py
and the rotary embedding of bench_rotary.py), written to files so that a kernel of ours can be
compared line by line with the one it races: eviction hints, block sizes, warps, masks.

    python benchmarks/inductor_code.py --out /tmp/inductor    # GPU only
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

import torch
from bench_norms import providers  # benchmarks/ is on sys.path when run as a script
from bench_rotary import hf_apply_rotary
from bench_rotary import inputs as rotary_inputs
from torch._inductor.utils import run_and_get_code

NORMS = [("rms_norm", 8192), ("layer_norm", 8192), ("layer_norm", 256), ("rms_norm", 1024)]
ELEMENTS = 1 << 27


def _write(out: str, name: str, codes: list[str]) -> None:
    path = os.path.join(out, f"{name}.py")
    with open(path, "w") as f:
        f.write("\n\n# ----- next module -----\n\n".join(codes))
        f.write(f"\n\n# the configs Inductor launched (after autotuning):\n# {_chosen()}\n")
    print(f"# {path}: {sum(c.count('@triton.jit') for c in codes)} Triton kernels; {_chosen()}")


def _chosen() -> list[str]:
    """The launch configs of the Triton kernels Inductor has loaded: its autotuner keeps the one
    it picked as its only launcher."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    seen = []
    for obj in gc.get_objects():
        try:
            tuner = isinstance(obj, CachingAutotuner)
        except ReferenceError:  # a weak proxy whose object is gone
            continue
        if tuner:
            for launcher in getattr(obj, "launchers", []):
                config = launcher.config
                seen.append(f"{obj.fn.__name__}: {config.kwargs} warps={config.num_warps}")
    return seen


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--norms", help="op:width,... (default: NORMS); no rotary then")
    a = p.parse_args(argv)
    norms = NORMS
    if a.norms:
        norms = [(op, int(n)) for op, n in (c.split(":") for c in a.norms.split(","))]
    if not torch.cuda.is_available():
        sys.exit("inductor_code.py compiles for a GPU; no CUDA device is present")
    os.makedirs(a.out, exist_ok=True)
    naive = providers(["naive"])["naive"]
    dev = torch.device("cuda")
    for op, n in norms:
        torch._dynamo.reset()
        gc.collect()  # the previous case's kernels, so _chosen lists this one's
        m = ELEMENTS // n
        x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        r = torch.randn_like(x) if op == "add_rms_norm" else None
        w = torch.ones(n, device=dev, dtype=torch.bfloat16)
        b = torch.zeros(n, device=dev, dtype=torch.bfloat16) if op == "layer_norm" else None
        with torch.no_grad():
            _, codes = run_and_get_code(torch.compile(naive[op], dynamic=False), x, r, w, b)
        _write(a.out, f"{op}_{n}_fwd", codes)
    if a.norms:
        return
    torch._dynamo.reset()
    q, k, cos, sin = rotary_inputs((4, 2048, 32, 8, 128), torch.bfloat16, dev)
    with torch.no_grad():
        _, codes = run_and_get_code(torch.compile(hf_apply_rotary, dynamic=False), q, k, cos, sin)
    _write(a.out, "rotary_fwd", codes)


if __name__ == "__main__":
    main()
