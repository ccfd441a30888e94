"""Rotary position embedding of q and k: fusewise against HF's eager formula, torch.compile of it
and Liger, forward and forward+backward, on what a Llama attention passes: q and k in HF's
transposed layout (view(B, S, H, D).transpose(1, 2)), cos and sin [B, S, D] in q's dtype.

Byte model (fusewise.ops.rotary.cost.rotary, per pass, n = B·(Hq + Hkv)·S·D, c = B·S·D):
  forward           reads q, k, cos, sin; writes q_out, k_out                2·n·s + 2·c·s
  forward+backward  the backward again with dq_out, dk_out -> dq, dk         twice that
GB/s = those bytes / median time; % is of the device-to-device copy ceiling measured in the same
run (hardware.measure_bandwidth). Each mode twice: eager calls (the host's Python, autograd and
Triton's launcher included: what a training step pays) and, with "@graph", the same calls
captured in a CUDA graph and replayed (the kernels alone), so a host cost and a kernel cost are
told apart. Liger reads only the first half of cos and sin (it assumes the
halves equal, as HF's rotary embedding makes them) and rotates q and k in place, so its timed
calls keep rotating the same buffers (a rotation: the values stay bounded); it is costed with the
same byte model. The default shape: B 4 x S 2048 x Hq 32 / Hkv 8 x D 128 (Llama-3-8B's heads).

    python benchmarks/bench_rotary.py --dtypes bf16,fp32 --csv out.csv
    python benchmarks/bench_rotary.py --tiny        # CPU smoke run (Triton's interpreter)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if "--tiny" in sys.argv:  # before any Triton kernel is decorated (importing fusewise does it)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import _rows  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
import torch  # noqa: E402
import triton  # noqa: E402

import fusewise  # noqa: E402
from fusewise import hardware  # noqa: E402
from fusewise.ops.rotary import cost  # noqa: E402

DTYPES = ("bf16", "fp32", "fp16")
SHAPE = (4, 2048, 32, 8, 128)  # B, S, Hq, Hkv, D
TINY_SHAPE = (2, 8, 4, 2, 16)


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", default="x".join(map(str, SHAPE)), help="BxSxHqxHkvxD")
    p.add_argument(
        "--modes",
        default="fwd,fwd_bwd,fwd@graph,fwd_bwd@graph",
        help="fwd, fwd_bwd; @graph: replayed from a CUDA graph (kernels only, no host time)",
    )
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--providers", default="fusewise,torch,compile,liger")
    p.add_argument("--csv", default=None, help="append rows to this CSV")
    p.add_argument(
        "--isolate", action="store_true", help="one process per provider (_rows.isolated)"
    )
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny shape, interpreter")
    return p.parse_args(argv)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def hf_apply_rotary(q, k, cos, sin):
    """HF's apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1), in the inputs' dtype."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _liger():
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except ImportError as e:
        print(f"# liger: skipped ({e})")
        return None
    return lambda q, k, cos, sin: LigerRopeFunction.apply(q, k, cos, sin)[:2]


def providers(names: list[str]) -> dict:
    """provider -> fn(q, k, cos, sin) returning (q_out, k_out)."""
    table = {
        "fusewise": lambda q, k, cos, sin: fusewise.ops.apply_rotary(q, k, cos, sin),
        "torch": hf_apply_rotary,
        "compile": torch.compile(hf_apply_rotary, dynamic=False),
    }
    if "liger" in names:
        liger = _liger()
        if liger:
            table["liger"] = liger
    return {n: table[n] for n in names if n in table}


def inputs(shape, dtype, device):
    """q, k in HF's transposed layout; cos, sin [B, S, D] of duplicated halves, as HF's Llama
    rotary embedding makes them (positions offset per sequence, base 500000)."""
    b, s, hq, hkv, d = shape
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(b, s, hq, d, device=device, dtype=dtype, generator=g).transpose(1, 2)
    k = torch.randn(b, s, hkv, d, device=device, dtype=dtype, generator=g).transpose(1, 2)
    positions = torch.arange(s, device=device)[None] + 7 * torch.arange(b, device=device)[:, None]
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=device).double() / d))
    freqs = positions.double()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return q, k, emb.cos().to(dtype), emb.sin().to(dtype)


def _timer(device):
    if device.type == "cuda":
        return lambda run: triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median")

    def cpu(run, reps=3):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            times.append(1e3 * (time.perf_counter() - t0))
        return sorted(times)[reps // 2]

    return cpu


def bench_one(fn, mode, shape, dtype, device):
    """(median ms, peak bytes above the inputs: 0 on the CPU). mode "fwd" / "fwd_bwd" times eager
    calls (host time included: Python, autograd, the launcher); with "@graph" appended, the same
    calls captured once in a CUDA graph and replayed (the kernels alone)."""
    mode, _, timing = mode.partition("@")
    q, k, cos, sin = inputs(shape, dtype, device)
    if mode == "fwd":

        def run():
            with torch.no_grad():
                fn(q, k, cos, sin)

    else:
        q.requires_grad_()
        k.requires_grad_()
        grads = [torch.randn_like(o) for o in fn(q, k, cos, sin)]

        def run():
            torch.autograd.grad(fn(q, k, cos, sin), (q, k), grads)

    run()  # compile / autotune outside the timing
    cuda = device.type == "cuda"
    if timing == "graph":
        if not cuda:
            raise RuntimeError("CUDA graphs need a GPU")
        run = _rows.graph_replay(run)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    ms = _timer(device)(run)
    peak = torch.cuda.max_memory_allocated() - base if cuda else 0
    return ms, peak


def main(argv=None):
    a = _parse(argv)
    if a.isolate:
        argv = sys.argv[1:] if argv is None else argv
        _summary(_rows.isolated(__file__, argv, a.providers.split(","), a.csv))
        return
    if a.tiny and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        sys.exit(
            "--tiny runs Triton's interpreter: pass it on the command line (it sets "
            "TRITON_INTERPRET=1 before fusewise is imported) or set TRITON_INTERPRET=1"
        )
    if a.tiny:
        device, shape = torch.device("cpu"), TINY_SHAPE
    elif not torch.cuda.is_available():
        sys.exit("bench_rotary.py times GPU kernels; no CUDA device is present (try --tiny)")
    else:
        device, shape = torch.device("cuda"), tuple(map(int, a.shape.split("x")))
    b, s, hq, hkv, d = shape
    shape_id = f"{b}x{s}x{hq}/{hkv}x{d}"
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    commit = _rows.commit()
    copy_gbps = hardware.measure_bandwidth(device)
    print(f"# {gpu}; torch {torch.__version__}; triton {triton.__version__}; commit {commit}")
    print(f"# copy ceiling {copy_gbps:,.0f} GB/s (measured now); B x S x Hq/Hkv x D {shape_id}")
    provs = providers(a.providers.split(","))
    rows = []
    for dname in a.dtypes.split(","):
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[dname]
        for mode in a.modes.split(","):
            if a.tiny and mode.endswith("@graph"):
                continue
            one = cost.rotary(b * s * (hq + hkv) * d, b * s * d, dtype)
            c = one if mode.startswith("fwd@") or mode == "fwd" else one + one
            for prov, fn in provs.items():
                try:
                    ms, peak = bench_one(fn, mode, shape, dtype, device)
                except Exception as e:  # a peer that cannot run a shape is reported, not fatal
                    print(
                        f"# {prov} {mode} {dname}: failed ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:120]})"
                    )
                    continue
                gbps = c.bytes / ms / 1e6
                pct = 100 * gbps / copy_gbps
                rows.append(
                    _rows.row(
                        "rotary", prov, mode, shape_id, dname, ms, gbps, pct, peak, commit_id=commit
                    )
                )
                print(
                    f"rotary {mode:13s} {dname:4s} {shape_id} {prov:9s} {ms:9.4f} ms "
                    f"{gbps:8.1f} GB/s {pct:5.1f}%  peak {peak / 2**20:7.1f} MiB",
                    flush=True,
                )
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if a.csv:
        _rows.append_csv(a.csv, rows)
    _summary(rows)


def _summary(rows):
    """Per (mode, dtype): fusewise % of ceiling and its speed-up over the fastest peer."""
    print("\n# summary: fusewise % of copy ceiling, best peer, fusewise speed-up over it")
    for key in sorted({(r["mode"], r["dtype"]) for r in rows}):
        group = {r["provider"]: r for r in rows if (r["mode"], r["dtype"]) == key}
        fw, peers = group.get("fusewise"), [r for p, r in group.items() if p != "fusewise"]
        if not fw or not peers:
            continue
        best = min(peers, key=lambda r: r["ms"])
        print(
            f"{key[0]:13s} {key[1]:4s} fusewise {fw['pct_of_ceiling']:5.1f}%  best peer "
            f"{best['provider']:8s} {best['pct_of_ceiling']:5.1f}%  x{best['ms'] / fw['ms']:.2f}"
        )


if __name__ == "__main__":
    main()
