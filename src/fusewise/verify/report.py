"""What `fusewise verify` found, as data (to_dict) and as a terminal report (render)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .measure import Comparison, LossCheck, Samples

# the fix group that fusewise.patch applies for a finding: (kind, pattern) -> group
GROUPS = {
    ("fusion-chain", "norm"): "norms",
    ("fusion-chain", "gated-activation"): "activations",
    ("fusion-chain", "rotary"): "rotary",
    ("fusion-chain", "cross-entropy"): "loss",
    ("fusion-chain", "optimizer"): "optimizer",
}


def group_of(finding) -> str | None:
    return GROUPS.get((finding.kind, finding.pattern or ""))


@dataclass
class FindingCheck:
    """One finding of the first diagnosis: its predicted saving, the fix group that patch applies
    for it (None: patch has no fix for it), whether patch changed anything in that group, the
    group's measured saving (all its findings together), and whether it is gone afterwards."""

    kind: str
    pattern: str
    where: str
    title: str
    predicted_ms: float
    group: str | None
    applied: bool
    measured_ms: float | None = None
    measured_low_ms: float | None = None
    measured_high_ms: float | None = None
    gone: bool | None = None


@dataclass
class VerifyReport:
    script: str
    variants: dict[str, Samples]
    comparisons: list[Comparison]
    losses: LossCheck
    patch: object = None  # the PatchReport of the patched runs
    findings: list[FindingCheck] = field(default_factory=list)
    after_findings: list = field(default_factory=list)  # the patched step's diagnosis
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        def clean(x):
            if isinstance(x, float) and not math.isfinite(x):
                return None
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            if isinstance(x, list):
                return [clean(v) for v in x]
            return x

        return clean(
            dict(
                script=self.script,
                variants={
                    n: dict(
                        median_ms=s.median_ms,
                        ms=s.ms,
                        round_ms=s.round_ms,
                        peak_bytes=s.peak_bytes,
                        tokens_per_step=s.tokens_per_step,
                        losses=s.losses,
                    )
                    for n, s in self.variants.items()
                },
                comparisons=[c.to_dict() for c in self.comparisons],
                losses=dict(vars(self.losses), equal=self.losses.equal),
                patch=self.patch.to_dict() if self.patch is not None else None,
                findings=[dict(vars(f)) for f in self.findings],
                after_findings=[f.as_dict() for f in self.after_findings],
                notes=self.notes,
            )
        )

    def save_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    def render(self, console: Console) -> None:
        if self.patch is not None:
            console.rule("[bold]what fusewise.patch changed[/]")
            console.print(escape(str(self.patch)))
        t = Table(title=f"before and after: {escape(self.script)}")
        for col in ("variant", "ms/step (median)", "rounds", "tokens/s", "peak GB"):
            t.add_column(col, justify="right" if col != "variant" else "left")
        for name, s in self.variants.items():
            tps = (
                f"{s.tokens_per_step / (s.median_ms / 1e3):,.0f}"
                if s.tokens_per_step and s.median_ms > 0
                else "-"
            )
            peak = f"{s.peak_bytes / 1e9:.2f}" if s.peak_bytes else "-"
            rounds = ", ".join(f"{m:.1f}" for m in s.round_ms)
            t.add_row(escape(name), f"{s.median_ms:.2f}", rounds, tps, peak)
        console.print(t)
        for c in self.comparisons:
            console.print(escape(c.describe()))
        console.print(escape(self.losses.describe()))
        if self.findings:
            ft = Table(title="each finding of the first diagnosis: predicted against measured")
            for col in ("finding", "where", "predicted ms", "fix", "measured ms (group)", "after"):
                ft.add_column(col, justify="right" if "ms" in col else "left")
            for f in self.findings:
                if f.measured_ms is None:
                    measured = "-"
                else:
                    measured = (
                        f"{f.measured_ms:.2f} [{f.measured_low_ms:.2f}, {f.measured_high_ms:.2f}]"
                    )
                fix = f.group or "not in patch"
                if f.group and not f.applied:
                    fix += " (nothing swapped)"
                after = "-" if f.gone is None else ("gone" if f.gone else "still there")
                name = f"{f.kind} {f.pattern}".strip()
                ft.add_row(
                    escape(name), escape(f.where), f"{f.predicted_ms:.2f}", fix, measured, after
                )
            console.print(ft)
        for note in self.notes:
            console.print(escape(note))
