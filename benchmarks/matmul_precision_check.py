"""matmul-precision, predicted against measured, on the GPU (issue #12 part 2).

    PYTHONPATH=src python benchmarks/matmul_precision_check.py [--quick]

1. the measured matmul ceilings per dtype (fp32 = TF32 off, tf32, bf16, fp16, fp8);
2. an fp32 GPT training step whose matmuls dominate (fusewise.examples.gpt, variant "clean",
   GPT-2-small-like, vocabulary 50257), diagnosed with TF32 off: the top matmul rows with their
   ceilings, the matmul-precision finding's predicted saving for set_float32_matmul_precision
   ("high") and for bf16 autocast, and the matmul-shape findings;
3. the real savings: the same step with precision "highest", "high" and "highest" + bf16
   autocast, interleaved (fusewise.verify.interleave_steps, compare) with the 95% interval;
4. a table: predicted vs measured and their ratio (target: within +-30%); one CSV row per check
   in $OUT/matmul_precision_check.csv when $OUT is set.

The user's precision setting is put back at the end. About 30-60 s on an H200.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _rows  # noqa: E402  (benchmarks/ on sys.path)

import fusewise  # noqa: E402
from fusewise import hardware  # noqa: E402
from fusewise.examples.gpt import GPTConfig, make_step  # noqa: E402
from fusewise.report import _units as units  # noqa: E402
from fusewise.verify import compare, interleave_steps  # noqa: E402


@contextlib.contextmanager
def precision(p: str):
    """torch.set_float32_matmul_precision(p) in the block, the previous value after it."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(p)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


def variant(step, p: str, autocast: bool, device: str):
    def run():
        with precision(p), torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            return step()

    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a smaller model, fewer rounds")
    ap.add_argument(
        "--device", default="cuda", help="cpu: a smoke test of this script (no finding expected)"
    )
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (or --device cpu for a smoke test)")
    t0 = time.perf_counter()
    saved = torch.get_float32_matmul_precision()
    try:
        run_checks(a.quick, a.device)
    finally:
        torch.set_float32_matmul_precision(saved)
    assert torch.get_float32_matmul_precision() == saved
    print(f"\ntotal {time.perf_counter() - t0:.1f} s; float32 matmul precision back to {saved!r}")


def run_checks(quick: bool, device: str):
    t = time.perf_counter()
    ceil = hardware.ceilings(device, refresh=True)
    print(
        f"{ceil.device_name}: bandwidth {ceil.bandwidth_GBps:,.0f} GB/s (measured in "
        f"{time.perf_counter() - t:.1f} s with the matmul rates)"
    )
    sheet = hardware.datasheet_matmul(ceil.device_name) or {}
    for key, rate in ceil.matmul_by_dtype.items():
        pct = (
            f" ({100 * rate / sheet[key]:.0f}% of the datasheet's {sheet[key]:g})"
            if key in sheet
            else ""
        )
        print(f"  matmul {key:>4}: {units.rate(rate):>16}{pct}")

    if device == "cpu":  # the smoke test: small enough for a CPU
        c = GPTConfig(vocab=1001, seq=64, d_model=64, heads=2, layers=1, batch=2)
    else:
        c = GPTConfig(
            vocab=50257, seq=512, d_model=768, heads=12, layers=6 if not quick else 2, batch=8
        )
    steps = {}
    for name, p, ac in (
        ("highest", "highest", False),
        ("high", "high", False),
        ("bf16-autocast", "highest", True),
    ):
        step, model, opt = make_step(c, variant="clean", device=device)
        steps[name] = (variant(step, p, ac, device), model, opt)

    run, model, opt = steps["highest"]
    torch.set_float32_matmul_precision("highest")  # the step as the user runs it: TF32 off
    t = time.perf_counter()
    report = fusewise.diagnose(run, steps=5, warmup=2, restore=[model, opt], ceilings=ceil)
    print(f"\ndiagnosis in {time.perf_counter() - t:.1f} s; step {report.step.median_ms:.2f} ms")
    for row in report.top:
        if row.ceiling != "bandwidth":
            print(
                f"  {row.name:<24} {row.ms_per_step:8.2f} ms  {row.dtype or '':<9} "
                f"vs {row.ceiling:<5} {row.pct_of_ceiling:5.0f}% of ceiling"
            )
    found = {f.kind: f for f in report.findings if f.kind.startswith("matmul")}
    for f in report.findings:
        if f.kind.startswith("matmul"):
            print(f"  {f.kind} at {f.where}: {f.title}\n    fix: {f.fix}")
    if "matmul-precision" in found:
        ev = found["matmul-precision"].evidence
        predicted = {"high": ev["saving_ms_tf32"], "bf16-autocast": ev["saving_ms_bf16_autocast"]}
        print(
            f"  fp32 matmuls {ev['measured_ms']:.2f} ms at {100 * ev['fraction_of_ceiling']:.0f}% "
            f"of the fp32 rate; predicted: TF32 -{predicted['high']:.2f} ms, "
            f"bf16 autocast -{predicted['bf16-autocast']:.2f} ms"
        )
    else:
        print("NO matmul-precision finding; skipped:", report.skipped)
        if device == "cuda":
            return
        predicted = {"high": float("nan"), "bf16-autocast": float("nan")}  # the smoke test

    t = time.perf_counter()
    rounds = 4 if quick else 6
    samples = interleave_steps(
        {k: v[0] for k, v in steps.items()}, warmup=3, per_round=5, rounds=rounds, device=device
    )
    print(f"\nmeasured in {time.perf_counter() - t:.1f} s ({rounds} interleaved rounds of 5 steps)")
    rows = []
    print(
        f"\n{'check':<16}{'predicted ms':>14}{'measured ms':>13}{'95% interval':>20}"
        f"{'ratio':>8}  within 30%"
    )
    for name in ("high", "bf16-autocast"):
        cmp = compare(samples["highest"], samples[name])
        ratio = predicted[name] / cmp.saving_ms if cmp.saving_ms else float("nan")
        ok = abs(ratio - 1) <= 0.3
        print(
            f"{name:<16}{predicted[name]:>14.2f}{cmp.saving_ms:>13.2f}"
            f"{f'{cmp.low_ms:+.2f}..{cmp.high_ms:+.2f}':>20}{ratio:>8.2f}  {'yes' if ok else 'NO'}"
        )
        rows.append(
            dict(
                check=f"matmul-precision {name}",
                predicted_ms=round(predicted[name], 3),
                measured_ms=round(cmp.saving_ms, 3),
                low_ms=round(cmp.low_ms, 3),
                high_ms=round(cmp.high_ms, 3),
                ratio=round(ratio, 3),
                within_30pct=ok,
                step_ms_before=round(samples["highest"].median_ms, 3),
                step_ms_after=round(samples[name].median_ms, 3),
                verdict=cmp.verdict,
                gpu=ceil.device_name,
                torch=torch.__version__,
                commit=_rows.commit(),
                date=datetime.date.today().isoformat(),
            )
        )
    if os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], "matmul_precision_check.csv")
        _rows.append_csv(path, rows)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
