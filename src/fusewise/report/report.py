"""The Report: JSON (stable schema, DESIGN.md), terminal text (rich) and self-contained HTML."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..diagnose.findings import Finding


@dataclass
class Report:
    device: dict
    step: dict
    top: list[dict] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        from .. import __version__

        return {
            "fusewise_version": __version__,
            "device": self.device,
            "step": self.step,
            "top": self.top,
            "findings": [f.as_dict() for f in self.findings],
            "skipped": self.skipped,
        }

    def to_json(self) -> str:
        """Strict JSON (RFC 8259): a value that is not a finite number (the intensity of an op
        that moves no bytes is infinite) is written as null."""
        return json.dumps(_strict(self.as_dict()), indent=1, allow_nan=False)

    def save_json(self, path) -> None:
        Path(path).write_text(self.to_json())

    def save_html(self, path) -> None:
        from .html import render_html

        Path(path).write_text(render_html(self.as_dict()))

    def render(self, console) -> None:
        from .text import render_text

        render_text(self.as_dict(), console)

    def __str__(self) -> str:
        from rich.console import Console

        buf = io.StringIO()
        self.render(Console(file=buf, width=120, force_terminal=False))
        return buf.getvalue()


def _strict(x):
    """x with every non-finite float as None and other numbers (NumPy's too) as Python ones."""
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    if isinstance(x, (str, bool, int)) or x is None:
        return x
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    return f if math.isfinite(f) else None
