"""`fusewise demo`: diagnose a built-in GPT training step that has the classic problems (a
three-pass LayerNorm, attention written out, fp32 logits into the loss, a per-parameter AdamW
loop), then the same step fixed, and show what changed.

On a GPU the fixed step uses fusewise's ops (fusewise.nn.LayerNorm, fusewise.optim.AdamW) and
scaled_dot_product_attention, at a realistic size in bf16. On the CPU fusewise's kernels would run
their eager reference (or the slow interpreter), so the fixed step uses what torch runs fused on
the CPU (nn.LayerNorm, SDPA, AdamW(fused=True)), at a small size.
"""

from __future__ import annotations

import warnings

import torch
from rich.console import Console
from rich.table import Table

from .diagnose.driver import diagnose
from .examples.gpt import GPTConfig, make_step
from .verify import check_losses, compare, interleave_steps

# make_step's 1e-3 is too high for the GPU demo's model on one fixed batch: every variant's loss
# (torch's fused AdamW too) fell to ~2 by the 5th step and jumped to 4-6 at the 6th on the H200,
# so the naive and fused trajectories parted by 4x there, chaos rather than a wrong kernel. At
# 3e-4 the loss falls smoothly and they agree within 0.4% over 10 steps
# (benchmarks/results/h200_demo_losses.txt). The step's time does not depend on it.
DEMO_LR = 3e-4

# The naive step's findings (kind, pattern) that the fixed step's changes address: the norm, the
# attention, the loss and the optimizer. Its saving is predicted from these alone; the naive
# step's other findings (launch overhead, idle gaps, ...) name fixes the fixed step does not
# make (on the H200 they added 5.5 ms to a 16.1 ms prediction that was otherwise 16.1 ms).
ADDRESSED = {
    ("fusion-chain", "norm"),
    ("fusion-chain", "attention"),
    ("attention-fallback", None),
    ("quadratic-memory", None),
    ("fusion-chain", "cross-entropy"),
    ("fusion-chain", "optimizer"),
}


def addressed(findings) -> tuple[float, dict[str, float]]:
    """(predicted saving of the findings the fixed step addresses, {"kind[ pattern]": saving}
    of the rest)."""
    ours, others = 0.0, {}
    for f in findings:
        if (f.kind, f.pattern) in ADDRESSED:
            ours += f.est_saving_ms
        else:
            name = f"{f.kind} {f.pattern}" if f.pattern else f.kind
            others[name] = others.get(name, 0.0) + f.est_saving_ms
    return ours, others


def run(console: Console, *, steps: int = 7, warmup: int = 2) -> int:
    gpu = torch.cuda.is_available()
    if gpu:
        cfg = GPTConfig(vocab=32768, seq=1024, d_model=1024, heads=16, layers=4, batch=8)
        device, dtype, fixed = "cuda", torch.bfloat16, "fusewise"
    else:
        cfg, device, dtype, fixed = GPTConfig(), "cpu", torch.float32, "clean"
    reports, steps_of = {}, {}
    for variant in ("naive", fixed):
        step, model, opt = make_step(cfg, variant=variant, device=device, dtype=dtype)
        for group in opt.param_groups:
            group["lr"] = DEMO_LR
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fusewise's CPU-path notices, if any
            reports[variant] = diagnose(step, steps=steps, warmup=warmup, restore=[model, opt])
        steps_of[variant] = step
        console.rule(f"[bold]{variant} step[/]")
        reports[variant].render(console)
    # The saving measured with the two steps interleaved (not two diagnoses' medians taken
    # minutes apart, whose difference noise can flip): both start from the same weights (the
    # diagnoses restored them), so their losses must agree step by step.
    console.rule("[bold]verify: the two steps interleaved[/]")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = interleave_steps(steps_of, warmup=warmup, per_round=2, rounds=12, device=device)
    comparison = compare(measured["naive"], measured[fixed])
    # The first steps from the restored weights: both steps train on one fixed batch, whose loss
    # falls towards 0 within ~30 steps, where bf16's small differences become large relative
    # ones (on the H200 the 24th losses differed by 3.9x): the trajectories are compared where
    # they are still the same computation, not after it has memorised the batch (and at
    # DEMO_LR, where they are smooth).
    first = slice(0, steps)
    losses = check_losses(
        measured["naive"].losses[0][first], measured[fixed].losses[0][first], rtol=2e-2
    )
    before, after = reports["naive"], reports[fixed]
    t = Table(title=f"naive -> {fixed}: what changed")
    for col in ("", "naive", fixed):
        t.add_column(col, justify="left" if not col else "right")
    t.add_row(
        "step ms (median, interleaved)",
        f"{measured['naive'].median_ms:.2f}",
        f"{measured[fixed].median_ms:.2f}",
    )
    if before.step.peak_memory_bytes:
        t.add_row(
            "peak memory GB",
            f"{before.step.peak_memory_bytes / 1e9:.2f}",
            f"{after.step.peak_memory_bytes / 1e9:.2f}",
        )
    t.add_row(
        "predicted saving ms (all findings)",
        f"{sum(f.est_saving_ms for f in before.findings):.2f}",
        f"{sum(f.est_saving_ms for f in after.findings):.2f}",
    )
    keys = sorted({(f.kind, f.pattern or "") for r in reports.values() for f in r.findings})
    for kind, pattern in keys:
        n = [
            sum(1 for f in r.findings if (f.kind, f.pattern or "") == (kind, pattern))
            for r in (before, after)
        ]
        t.add_row(f"{kind} {pattern}".strip() + " findings", str(n[0]), str(n[1]))
    console.rule("[bold]before and after[/]")
    console.print(t)
    console.print(comparison.describe())
    console.print(losses.describe())
    predicted, others = addressed(before.findings)
    left_out = ", ".join(f"{name} {ms:.2f} ms" for name, ms in others.items() if ms > 0)
    console.print(
        f"predicted {predicted:.2f} ms (the naive step's findings that the {fixed} step fixes: "
        f"norm, attention, loss, optimizer) against {comparison.saving_ms:.2f} ms measured. "
        + (f"Not counted, fixes the {fixed} step does not make: {left_out}. " if left_out else "")
        + "The prediction is the measured time of the ops each fix removes, with their launch "
        "gaps, less the fused kernel at 60% of the copy ceiling (docs/findings.md): a fused "
        "kernel that runs slower than that (or costs more host time per call) saves less."
    )
    if not gpu:
        console.print(
            "On the CPU, at this small size, the step is mostly matmuls and Python "
            "overhead. On an H200 at realistic size the same "
            "demo went from 27.2 to 11.7 ms per step and 6.7 to 2.8 GB "
            "(benchmarks/results/h200_diagnose_demo.txt)."
        )
    return 0
