"""Gated activations, SwiGLU (silu(gate) * up) and GeGLU (gelu(gate, "tanh") * up): fusewise against
torch eager, torch.compile of the same eager function, and Liger, forward and forward+backward.

Shapes: gate, up [tokens, intermediate] = 16384 x 5632 and 16384 x 14336 in bf16 (Llama-7B and
Llama-3-8B MLPs at 16k tokens), and 16384 x 5632 in fp32. Providers:
  fusewise  fusewise.ops.swiglu / geglu(approximate="tanh")
  eager     F.silu(g) * u, F.gelu(g, approximate="tanh") * u (what HF's MLP runs)
  compile   torch.compile(eager, dynamic=False), one graph per shape (the recompile limit raised
            so that no shape falls back to eager)
  liger     liger_kernel.ops.swiglu.LigerSiLUMulFunction, liger_kernel.ops.geglu.
            LigerGELUMulFunction (tanh GELU only). Its backward writes dgate and dup over its
            saved gate and up (the inputs): no gradient buffers, and in this loop the inputs
            hold gradients after the first backward (values change, the traffic does not)

Byte model (fusewise.ops.gated.cost, n = tokens x intermediate elements of s bytes):
  fwd      reads gate, up; writes y                                  3·n·s
  fwd_bwd  adds reading gate, up, dy and writing dgate, dup          8·n·s
GB/s = those bytes / median time (triton.testing.do_bench); % is of the device-to-device copy
ceiling measured in the same run (hardware.measure_bandwidth), as bench_norms.py. peak_bytes: the
most allocated during the timed calls above what was allocated before them (inputs, dy). fwd rows
also carry the forward's error against the fp32 eager reference (max |y - ref| / max |ref|).

    python benchmarks/bench_gated.py --csv out.csv
    python benchmarks/bench_gated.py --tiny          # CPU smoke test (Triton interpreter)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

# --tiny on a machine without a GPU runs the real kernels in Triton's interpreter, which must be
# chosen before any kernel is decorated (before fusewise is imported).
if "--tiny" in sys.argv and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import _rows  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import fusewise  # noqa: E402
from fusewise import hardware  # noqa: E402
from fusewise.ops.gated import cost, reference  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
SHAPES = "16384x5632:bf16,16384x14336:bf16,16384x5632:fp32"
TINY_SHAPES = "64x96:fp32,33x50:bf16"  # 33x50: rows that are not a multiple of any tile
OPS = ("swiglu", "geglu")
ACT = {"swiglu": "silu", "geglu": "gelu_tanh"}  # the reference's name of each op's activation
PEERS = ("eager", "compile", "liger")


def eager_swiglu(g, u):
    return F.silu(g) * u


def eager_geglu(g, u):
    return F.gelu(g, approximate="tanh") * u


def _liger() -> dict | str:
    """op -> fn, or the reason Liger cannot run here."""
    try:
        from liger_kernel.ops.geglu import LigerGELUMulFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except ImportError as e:
        return f"liger-kernel not importable ({e})"
    return {
        "swiglu": lambda g, u: LigerSiLUMulFunction.apply(g, u),
        "geglu": lambda g, u: LigerGELUMulFunction.apply(g, u),
    }


def providers(names: list[str], device: torch.device) -> dict[str, dict]:
    """provider -> op -> fn(gate, up); a provider that cannot run is printed and left out."""
    eager = {"swiglu": eager_swiglu, "geglu": eager_geglu}
    table = {
        "fusewise": {
            "swiglu": fusewise.ops.swiglu,
            "geglu": lambda g, u: fusewise.ops.geglu(g, u, approximate="tanh"),
        },
        "eager": eager,
    }
    if "compile" in names:
        # one graph per (shape, dtype, grad mode): 3 shapes x 2 modes x 2 ops would pass the
        # default limit of 8 and the rest would silently run eager
        torch._dynamo.config.cache_size_limit = 64
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 64
        table["compile"] = {op: torch.compile(fn, dynamic=False) for op, fn in eager.items()}
    if "liger" in names:
        liger = _liger() if device.type == "cuda" else "liger-kernel's kernels need a CUDA GPU"
        if isinstance(liger, str):
            print(f"# liger: skipped ({liger})")
        else:
            table["liger"] = liger
    return {n: table[n] for n in names if n in table}


def time_ms(run, device: torch.device) -> float:
    """Median ms: do_bench on a GPU, else a few wall-clock calls (the smoke test's)."""
    if device.type == "cuda":
        return triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median")
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def make_inputs(m, n, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    gate = 2 * torch.randn(m, n, device=device, dtype=dtype, generator=g)
    up = torch.randn(m, n, device=device, dtype=dtype, generator=g)
    return gate, up


def forward_error(fn, op, gate, up) -> float:
    """max |fn - ref| / max |ref|, ref the fp32 eager reference of the same inputs."""
    with torch.no_grad():
        y = fn(gate, up).float()
        ref = reference.gated_forward(gate.float(), up.float(), ACT[op])
    return ((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def bench_one(fn, op, mode, m, n, dtype, device):
    """(ms, peak extra bytes or "", forward error or ""). mode "fwd" / "fwd_bwd" times eager
    calls (host time included); with "@graph" appended, the same calls captured once in a CUDA
    graph and replayed (the kernels alone)."""
    mode, _, timing = mode.partition("@")
    gate, up = make_inputs(m, n, dtype, device)
    err = forward_error(fn, op, gate, up) if mode == "fwd" else ""
    if mode == "fwd":

        def run():
            with torch.no_grad():
                fn(gate, up)

    else:
        gate.requires_grad_()
        up.requires_grad_()
        dy = torch.randn_like(gate)

        def run():
            torch.autograd.grad(fn(gate, up), (gate, up), dy)

    run()  # compile / autotune outside the timing
    if device.type != "cuda":
        if timing:
            raise RuntimeError("CUDA graphs need a GPU")
        return time_ms(run, device), "", err
    if timing == "graph":
        run = _rows.graph_replay(run)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ms = time_ms(run, device)
    return ms, torch.cuda.max_memory_allocated() - base, err


def parse_shapes(text: str) -> list[tuple[int, int, str]]:
    out = []
    for item in text.split(","):
        dims, _, dname = item.partition(":")
        m, n = map(int, dims.split("x"))
        if dname not in DTYPES:
            raise SystemExit(f"unknown dtype {dname!r} in --shapes; known: {', '.join(DTYPES)}")
        out.append((m, n, dname))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument(
        "--modes",
        default="fwd,fwd_bwd",
        help="fwd, fwd_bwd; @graph: replayed from a CUDA graph (kernels only, no host time)",
    )
    p.add_argument("--shapes", default=None, help=f"MxN:dtype,... (default {SHAPES})")
    p.add_argument("--providers", default="fusewise," + ",".join(PEERS))
    p.add_argument("--csv", default=None, help="append rows to this CSV")
    p.add_argument("--tiny", action="store_true", help="small shapes; runs on the CPU too")
    p.add_argument(
        "--isolate", action="store_true", help="one process per provider (_rows.isolated)"
    )
    a = p.parse_args(argv)
    if a.isolate:
        argv = sys.argv[1:] if argv is None else argv
        print(summary(_rows.isolated(__file__, argv, a.providers.split(","), a.csv)))
        return
    if not torch.cuda.is_available() and not a.tiny:
        sys.exit("bench_gated.py times GPU kernels; no CUDA device is present (--tiny runs here)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = parse_shapes(a.shapes or (TINY_SHAPES if a.tiny else SHAPES))
    commit = _rows.commit()
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    copy_gbps = hardware.measure_bandwidth(device)
    print(f"# {gpu}; torch {torch.__version__}; triton {triton.__version__}; commit {commit}")
    print(f"# copy ceiling {copy_gbps:,.0f} GB/s (measured now)")
    if device.type == "cpu":
        print("# CPU smoke test: kernels in Triton's interpreter; times mean nothing, peak n/a")
    provs = providers(a.providers.split(","), device)
    rows = []
    for m, n, dname in shapes:
        dtype = DTYPES[dname]
        for op in a.ops.split(","):
            for mode in a.modes.split(","):
                if a.tiny and mode.endswith("@graph"):
                    continue
                fwd_only = mode.partition("@")[0] == "fwd"
                c = cost.gated(m * n, dtype) if fwd_only else cost.gated_fwd_bwd(m * n, dtype)
                for prov, fns in provs.items():
                    what = f"{op} {mode} {m}x{n} {dname} {prov}"
                    try:
                        ms, peak, err = bench_one(fns[op], op, mode, m, n, dtype, device)
                    except Exception as e:  # a peer that cannot run a shape is reported
                        first = (str(e).splitlines() or [""])[0][:120]
                        print(f"# {what}: failed ({type(e).__name__}: {first})", flush=True)
                        continue
                    finally:
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                    gbps = c.bytes / ms / 1e6
                    pct = 100 * gbps / copy_gbps
                    row = _rows.row(
                        op, prov, mode, f"{m}x{n}", dname, ms, gbps, pct, peak, commit_id=commit
                    )
                    row["fwd_rel_error"] = "" if err == "" else f"{err:.2e}"
                    rows.append(row)
                    if a.csv:  # each row as it is measured: a run cut short keeps what it had
                        _rows.append_csv(a.csv, [row])
                    peak_txt = f"{peak / 1e9:6.2f} GB" if peak != "" else "   n/a   "
                    err_txt = f"err {err:.1e}" if err != "" else ""
                    print(
                        f"{op:7s} {mode:7s} {dname:4s} {m:>6d}x{n:<6d} {prov:9s} {ms:9.4f} ms "
                        f"{gbps:7.0f} GB/s {pct:5.1f}%  peak {peak_txt} {err_txt}",
                        flush=True,
                    )
    print(summary(rows))


def summary(rows: list[dict]) -> str:
    """Per (op, mode, dtype, shape): fusewise's % of the copy ceiling, the best peer, fusewise's
    speed-up over it, and issue #13's target (bf16: >= 90% and faster than every peer)."""
    lines = [
        "\n# summary: fusewise % of copy ceiling, best peer, speed-up of fusewise over it; "
        "issue #13 target (bf16): >= 90% and faster than every peer"
    ]

    def key(r):
        return r["op"], r["mode"], r["dtype"], r["shape"]

    for k in sorted({key(r) for r in rows}):
        group = {r["provider"]: r for r in rows if key(r) == k}
        fw = group.get("fusewise")
        peers = [r for p, r in group.items() if p != "fusewise"]
        if not fw or not peers:
            continue
        best = min(peers, key=lambda r: r["ms"])
        missing = [p for p in PEERS if p not in group]
        target = ""
        if k[2] == "bf16":
            ok = fw["pct_of_ceiling"] >= 90 and all(fw["ms"] < r["ms"] for r in peers)
            target = "met" if ok else "NOT met"
            target += f" (without {', '.join(missing)})" if missing else ""
        lines.append(
            f"{k[0]:7s} {k[1]:7s} {k[2]:4s} {k[3]:>12s}  fusewise {fw['pct_of_ceiling']:5.1f}%  "
            f"best peer {best['provider']:8s} {best['pct_of_ceiling']:5.1f}%  "
            f"x{best['ms'] / fw['ms']:.2f}  {target}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
