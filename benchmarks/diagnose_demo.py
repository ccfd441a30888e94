"""Run the diagnosis demo and keep its reports: python benchmarks/diagnose_demo.py OUT_DIR.
Writes naive/fixed JSON and HTML reports and prints the terminal rendering (GPU: realistic size)."""

import sys
import warnings
from pathlib import Path

import torch
from rich.console import Console

from fusewise.diagnose.driver import diagnose
from fusewise.examples.gpt import GPTConfig, make_step


def main(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available()
    cfg = (
        GPTConfig(vocab=32768, seq=1024, d_model=1024, heads=16, layers=4, batch=8)
        if gpu
        else GPTConfig()
    )
    console = Console(width=160)
    for variant in ("naive", "fusewise" if gpu else "clean"):
        step, model, opt = make_step(
            cfg,
            variant=variant,
            device="cuda" if gpu else "cpu",
            dtype=torch.bfloat16 if gpu else torch.float32,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = diagnose(step, steps=7, warmup=2, restore=[model, opt])
        console.rule(variant)
        r.render(console)
        r.save_json(out / f"demo_{variant}.json")
        r.save_html(out / f"demo_{variant}.html")
        compare_chains(r, console)


def compare_chains(report, console):
    """Each chain's predicted saving (avoidable bytes / bandwidth) against what its ops took in
    the recorded step minus the fused floor (the saving a fused kernel at the floor would make)."""
    console.print(
        "chain                        where                 predicted  measured-floor  ratio"
    )
    for f in report.findings:
        ev = f.evidence or {}
        if f.kind != "fusion-chain" or ev.get("measured_ms_unfused") is None:
            continue
        measured = ev["measured_ms_unfused"] - ev["fused_floor_ms"]
        ratio = f.est_saving_ms / measured if measured > 0 else float("nan")
        console.print(
            f"{f.pattern:28s} {f.where:22s} {f.est_saving_ms:9.3f} {measured:15.3f} {ratio:6.2f}"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "out"))
