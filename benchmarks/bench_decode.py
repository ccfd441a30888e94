"""Decode with a static KV cache: the CUDA-graph gain the diagnosis predicts, then measured.

PYTHONPATH=src python benchmarks/bench_decode.py            # batch 1 and 8, ~30-60 s on an H200

For each batch: (1) fusewise.diagnose on the eager decode step (tokens_per_step = batch) ->
the launch-overhead finding's predicted graph gain (step time minus the GPU's busy time);
(2) the same step captured with fusewise.graphs.capture (the tokens of both checked equal);
(3) eager against graph step times, interleaved (fusewise.verify.interleave_steps, compare:
medians and a 95% interval) -> the measured gain, tokens/s both ways; predicted / measured
(target: within 25%). The model is small on purpose (4 layers, d_model 256, vocab 4096, bf16,
a 256-position cache): about 70 kernels a step of a few us each, so eager decode is launch-bound
at batch 1-8 (the host's launches take longer than the GPU's work). CSV rows to $OUT if set.
"""

import argparse
import os
import sys

import torch
from _rows import append_csv, row

import fusewise
from fusewise.examples.decode import (
    DecodeConfig,
    StaticKVCache,
    generate,
    looping,
    make_decoder,
    make_step,
)
from fusewise.verify import compare, interleave_steps

DEVICE = "cuda"


def predicted_gain(model, cache, batch, device) -> dict:
    """The launch-overhead finding of the eager decode step, its evidence, and the plain step."""
    token = torch.zeros(batch, dtype=torch.long, device=device)
    report = fusewise.diagnose(
        looping(make_step(model, cache), cache, token), steps=10, warmup=5, tokens_per_step=batch
    )
    found = [f for f in report.findings if f.kind == "launch-overhead"]
    if not found:
        kinds = [f.kind for f in report.findings]
        raise SystemExit(
            f"batch {batch}: no launch-overhead finding (found {kinds}); not launch-bound"
        )
    return dict(found[0].evidence, step_ms=report.step.median_ms, where=found[0].where)


def measure(model, c, batch, device, dtype, rounds, per_round) -> dict:
    """Eager and captured decode steps, interleaved; the tokens of both checked equal first."""
    caches = {m: StaticKVCache(c, batch, device=device, dtype=dtype) for m in ("eager", "graph")}
    steps = {m: make_step(model, caches[m]) for m in caches}
    token = torch.zeros(batch, dtype=torch.long, device=device)
    steps["graph"] = fusewise.graphs.capture(steps["graph"], token.clone())
    prompt = torch.randint(0, c.vocab, (batch, 8), device=device)
    tokens = {m: generate(steps[m], caches[m], prompt, 64) for m in steps}
    same = torch.equal(tokens["eager"], tokens["graph"])
    loops = {m: looping(steps[m], caches[m], token) for m in steps}
    samples = interleave_steps(loops, warmup=20, per_round=per_round, rounds=rounds, device=device)
    return dict(samples=samples, cmp=compare(samples["eager"], samples["graph"]), same=same)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=100)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_decode: needs a CUDA GPU (CUDA graphs); nothing measured")
        return 2
    device, dtype = DEVICE, getattr(torch, a.dtype)
    c = DecodeConfig(layers=a.layers, d_model=a.d_model, max_len=256)
    shape = f"L{c.layers}-d{c.d_model}-H{c.heads}-V{c.vocab}-cache{c.max_len}"
    lines, rows = [], []
    for batch in a.batch:
        model, cache, _ = make_decoder(c, batch, device=device, dtype=dtype)
        p = predicted_gain(model, cache, batch, device)
        m = measure(model, c, batch, device, dtype, a.rounds, a.per_round)
        eager, graph, cmp = m["samples"]["eager"], m["samples"]["graph"], m["cmp"]
        ratio = p["graph_gain_ms"] / cmp.saving_ms if cmp.saving_ms > 0 else float("nan")
        print(
            f"batch {batch}: {p['launches_per_step']:.0f} launches/step "
            f"({p['launches_per_token']:.1f}/token), GPU busy {p['gpu_busy_ms']:.3f} ms "
            f"= {100 * p['gpu_busy_share']:.0f}% of the {p['step_ms']:.3f} ms step; finding at "
            f"{p['where']}; tokens equal eager/graph: {m['same']}; {cmp.describe()}"
        )
        tps = {k: batch / ms * 1e3 for k, ms in (("e", eager.median_ms), ("g", graph.median_ms))}
        lines.append(
            f"{batch:5d}  {eager.median_ms:8.3f}  {graph.median_ms:8.3f}  "
            f"{p['graph_step_ms_predicted']:8.3f}  {cmp.saving_ms:8.3f} "
            f"[{cmp.low_ms:.3f}, {cmp.high_ms:.3f}]  {p['graph_gain_ms']:8.3f}  {ratio:5.2f}  "
            f"{'yes' if abs(ratio - 1) <= 0.25 else 'NO ':3s}  {tps['e']:9,.0f}  {tps['g']:9,.0f}  "
            f"{p['tokens_per_s_graph']:9,.0f}  {'' if m['same'] else 'TOKENS DIFFER'}"
        )
        mode = f"decode-batch{batch}"
        rows += [
            row("decode", "eager", mode, shape, a.dtype, eager.median_ms, tps["e"]),
            row("decode", "graph", mode, shape, a.dtype, graph.median_ms, tps["g"]),
            row(
                "decode",
                "graph-predicted",
                mode,
                shape,
                a.dtype,
                p["graph_step_ms_predicted"],
                p["tokens_per_s_graph"],
            ),
            # gain rows: ms = the gain per step; the pct column = predicted / measured x 100
            row("decode", "gain-measured", mode, shape, a.dtype, cmp.saving_ms, 0.0),
            row(
                "decode",
                "gain-predicted",
                mode,
                shape,
                a.dtype,
                p["graph_gain_ms"],
                0.0,
                100 * ratio,
            ),
        ]
        del model, cache
    print(
        f"\ndecode {shape} {a.dtype} (ms per step; gain = eager - graph; 'ok' = predicted within "
        "25% of measured; tokens/s = batch / step)"
    )
    print(
        "batch     eager     graph  pred.grf  meas.gain [95% interval]  pred.gain  ratio  ok   "
        "eager tok/s  graph tok/s  pred tok/s"
    )
    print("\n".join(lines))
    if os.environ.get("OUT"):
        append_csv(os.path.join(os.environ["OUT"], "bench_decode.csv"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
