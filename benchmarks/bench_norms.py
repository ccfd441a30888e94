"""LayerNorm / RMSNorm / add+RMSNorm: fusewise against torch, torch.compile, Liger, naive eager.

Byte model (fusewise.ops.norms.cost.norm, activations only; weights and per-row stats are < 2%
at these shapes):
  forward           layer_norm, rms_norm: reads x, writes y                 2·M·N·s
                    add_rms_norm: reads x, residual, writes y, x+residual   4·M·N·s
  forward+backward  adds reading x (h) and dy and writing dx                +3·M·N·s
GB/s = those bytes / median time; % is of the device-to-device copy ceiling measured in the same
run (hardware.measure_bandwidth). M·N = 2**27 elements at every width (256 MiB in bf16, several
times the 60 MB L2 of an H200), so the widths compare at equal traffic.

    python benchmarks/bench_norms.py --dtypes bf16 --csv out.csv
"""

from __future__ import annotations

import argparse
import datetime
import sys

import _rows  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
import torch
import torch.nn.functional as F
import triton

import fusewise
from fusewise import hardware
from fusewise.ops import reference
from fusewise.ops.norms import cost

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
WIDTHS = [256, 1024, 4096, 8192, 16384, 32768, 65536, 262144]
ELEMENTS = 1 << 27


def _liger():
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError as e:
        print(f"# liger: skipped ({e})")
        return None
    return {
        "layer_norm": lambda x, r, w, b: LigerLayerNormFunction.apply(x, w, b, 1e-5),
        "rms_norm": lambda x, r, w, b: LigerRMSNormFunction.apply(x, w, 1e-6),
        "add_rms_norm": lambda x, r, w, b: LigerFusedAddRMSNormFunction.apply(x, r, w, 1e-6),
    }


def providers(names: list[str]) -> dict[str, dict]:
    """provider -> op -> fn(x, residual, weight, bias) returning the output(s)."""
    naive = {
        "layer_norm": lambda x, r, w, b: reference.layer_norm(x, w, b, 1e-5),
        "rms_norm": lambda x, r, w, b: reference.rms_norm(x, w, 1e-6),
        "add_rms_norm": lambda x, r, w, b: reference.add_rms_norm(x, r, w, 1e-6),
    }
    table = {
        "fusewise": {
            "layer_norm": lambda x, r, w, b: fusewise.ops.layer_norm(x, w, b, 1e-5),
            "rms_norm": lambda x, r, w, b: fusewise.ops.rms_norm(x, w, 1e-6),
            "add_rms_norm": lambda x, r, w, b: fusewise.ops.add_rms_norm(x, r, w, 1e-6),
        },
        "torch": {
            "layer_norm": lambda x, r, w, b: F.layer_norm(x, x.shape[-1:], w, b, 1e-5),
            "rms_norm": lambda x, r, w, b: F.rms_norm(x, x.shape[-1:], w, 1e-6),
            "add_rms_norm": lambda x, r, w, b: _add_then_rms(x, r, w),
        },
        "compile": {op: torch.compile(fn, dynamic=False) for op, fn in naive.items()},
        "naive": naive,
    }
    if "liger" in names:
        liger = _liger()
        if liger:
            table["liger"] = liger
    return {n: table[n] for n in names if n in table}


def _add_then_rms(x, r, w):
    h = x + r
    return F.rms_norm(h, h.shape[-1:], w, 1e-6), h


def _outputs(out):
    return out if isinstance(out, tuple) else (out,)


def bench_one(fn, op, mode, m, n, dtype, device, graphed=False):
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, n, device=device, dtype=dtype, generator=g)
    r = torch.randn(m, n, device=device, dtype=dtype, generator=g) if op == "add_rms_norm" else None
    w = 1 + 0.1 * torch.randn(n, device=device, dtype=dtype, generator=g)
    b = (
        0.1 * torch.randn(n, device=device, dtype=dtype, generator=g)
        if op == "layer_norm"
        else None
    )
    if mode == "fwd":
        with torch.no_grad():
            run = lambda: fn(x, r, w, b)  # noqa: E731
    else:
        leaves = [t.requires_grad_() for t in (x, r, w, b) if t is not None]
        # The outputs die here with their graph: a graph kept alive keeps the leaves'
        # AccumulateGrad nodes of the default stream, which a CUDA-graph capture cannot wait on
        # (torch's "AccumulateGrad node's stream does not match" warning; the first capture of
        # 125eab1's run failed so and spoilt the process's later ones).
        grads = [torch.randn_like(o) for o in _outputs(fn(x, r, w, b))]

        def run():
            o = _outputs(fn(x, r, w, b))
            torch.autograd.grad(o, leaves, grads)

    run()  # compile / autotune outside the timing
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    if graphed:
        run = _rows.graph_replay(run)  # the kernels alone (issue #14: host or kernel?)
    ms = triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median")
    peak = torch.cuda.max_memory_allocated() - base
    return ms, peak


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ops", default="layer_norm,rms_norm,add_rms_norm")
    p.add_argument("--modes", default="fwd,fwd_bwd")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    p.add_argument("--providers", default="fusewise,torch,compile,liger,naive")
    p.add_argument("--csv", default=None, help="append rows to this CSV")
    p.add_argument(
        "--elements", type=int, default=ELEMENTS, help="M·N (M = elements // width), 2**27"
    )
    p.add_argument(
        "--timings",
        default="eager",
        help="eager (host included), graph (the kernels alone: CUDA-graph replay), or both: "
        "eager,graph; graph rows have mode fwd+graph / fwd_bwd+graph",
    )
    p.add_argument(
        "--isolate", action="store_true", help="one process per provider (_rows.isolated)"
    )
    a = p.parse_args(argv)
    if a.isolate:
        argv = sys.argv[1:] if argv is None else argv
        _summary(_rows.isolated(__file__, argv, a.providers.split(","), a.csv))
        return
    if not torch.cuda.is_available():
        sys.exit("bench_norms.py times GPU kernels; no CUDA device is present")
    device = torch.device("cuda")
    gpu = torch.cuda.get_device_name()
    import triton as _t

    commit = _rows.commit()
    date = datetime.date.today().isoformat()
    copy_gbps = hardware.measure_bandwidth(device)
    print(f"# {gpu}; torch {torch.__version__}; triton {_t.__version__}; commit {commit}; {date}")
    print(f"# copy ceiling {copy_gbps:,.0f} GB/s (measured now)")
    provs = providers(a.providers.split(","))
    rows = []
    for dname in a.dtypes.split(","):
        dtype = DTYPES[dname]
        for op in a.ops.split(","):
            for n in map(int, a.widths.split(",")):
                m = max(1, a.elements // n)
                for mode in a.modes.split(","):
                    for prov, fns in provs.items():
                        if prov == "naive" and n > 65536 and mode == "fwd_bwd":
                            continue  # minutes of eager autograd at 2**27 elements: nothing new
                        for timing in a.timings.split(","):
                            row = _measure(
                                fns[op],
                                op,
                                mode,
                                timing,
                                prov,
                                m,
                                n,
                                dname,
                                dtype,
                                copy_gbps,
                                commit,
                            )
                            if row is not None:
                                rows.append(row)
                    torch.cuda.empty_cache()
    if a.csv:
        _rows.append_csv(a.csv, rows)
    _summary(rows)


def _measure(fn, op, mode, timing, prov, m, n, dname, dtype, copy_gbps, commit):
    """One row, or None when the provider cannot run the case (printed, not fatal)."""
    if prov == "compile":
        # a fresh compile per case: one compiled function across every width and mode hit
        # dynamo's recompile limit (8) at the 9th and ran eagerly from then on, with only a
        # warning (the 2026-12-04 run's rows at 16,384 and wider); hitting it now raises
        torch._dynamo.reset()
        torch._dynamo.config.fail_on_recompile_limit_hit = True
    c = cost.norm(op, m, n, dtype)
    if mode == "fwd_bwd":
        c = c + cost.norm(op, m, n, dtype, backward=True)
    label = mode if timing == "eager" else f"{mode}+graph"
    try:
        ms, peak = bench_one(fn, op, mode, m, n, dtype, torch.device("cuda"), timing == "graph")
    except Exception as e:  # a peer that cannot run a shape (or be captured) is reported
        print(
            f"# {prov} {op} {label} {m}x{n} {dname}: failed ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:120]})"
        )
        return None
    gbps = c.bytes / ms / 1e6
    pct = 100 * gbps / copy_gbps
    print(
        f"{op:13s} {label:13s} {dname:4s} {m:>7d}x{n:<7d} {prov:9s} "
        f"{ms:8.4f} ms {gbps:8.0f} GB/s {pct:5.1f}%",
        flush=True,
    )
    return _rows.row(op, prov, label, f"{m}x{n}", dname, ms, gbps, pct, peak, commit_id=commit)


def _summary(rows):
    """Per (op, mode, dtype, width): fusewise % of ceiling and its ratio to the best peer."""
    print("\n# summary: fusewise % of copy ceiling, best peer, fusewise speed-up over it")
    keys = sorted(
        {(r["op"], r["mode"], r["dtype"], r["shape"]) for r in rows},
        key=lambda k: (k[0], k[1], k[2], int(k[3].split("x")[1])),
    )
    for k in keys:
        group = {
            r["provider"]: r for r in rows if (r["op"], r["mode"], r["dtype"], r["shape"]) == k
        }
        fw = group.get("fusewise")
        peers = [r for p, r in group.items() if p not in ("fusewise", "naive")]
        if not fw or not peers:
            continue
        best = min(peers, key=lambda r: r["ms"])
        print(
            f"{k[0]:13s} {k[1]:7s} {k[2]:4s} {k[3]:>15s}  fusewise {fw['pct_of_ceiling']:5.1f}%  "
            f"best peer {best['provider']:8s} {best['pct_of_ceiling']:5.1f}%  "
            f"x{best['ms'] / fw['ms']:.2f}"
        )


if __name__ == "__main__":
    main()
