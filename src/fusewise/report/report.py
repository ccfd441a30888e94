"""The Report: typed dataclasses whose dict is the report JSON (docs/DESIGN.md, Report JSON),
rendered as terminal text (rich) and self-contained HTML. Imports nothing above report/."""

from __future__ import annotations

import io
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .._version import __version__
from .findings import Finding


@dataclass
class Device:
    name: str
    type: str  # "cuda" | "cpu"
    bandwidth_GBps: float  # measured copy bandwidth (read + write)
    matmul_TFLOPs: float  # measured matmul rate of the headline dtype (matmul_dtype)
    ridge: float  # FLOP per byte where the two ceilings meet (at the headline rate)
    matmul_dtype: str = ""  # "bf16" on a GPU, "fp32" on the CPU
    # TFLOP/s per rate key (fp32 = TF32 off, tf32, bf16, fp16, fp8), as measured
    matmul_by_dtype: dict = field(default_factory=dict)


@dataclass
class StepSummary:
    median_ms: float  # median of the timed steps
    peak_memory_bytes: int | None  # the allocator's peak over the timed steps (GPU only)
    steps_measured: int
    capture_overhead_ratio: float | None  # the recorded step's time / median_ms
    ops_recorded: int
    # the recorded step's kernels that joined no op of the graph, and their device ms (GPU):
    # an op graph missing ops their kernels ran for (diagnose/driver.py; incomplete_graph)
    kernels_without_op: int = 0
    kernels_without_op_ms: float = 0.0
    # with two sizes (--sizes): the fitted exponent of peak memory (diagnose/scaling.py)
    memory_scaling: dict | None = None


def incomplete_graph(step: dict) -> str | None:
    """The warning for a report whose recorded graph lacks ops (StepSummary.kernels_without_op),
    when their kernels took more than INCOMPLETE_GRAPH_SHARE of the step; else None (also for a
    report without the fields, or without a finite step time)."""
    ms = step.get("kernels_without_op_ms") or 0.0
    median = step.get("median_ms")
    if not median or not math.isfinite(median) or ms <= INCOMPLETE_GRAPH_SHARE * median:
        return None
    return (
        f"incomplete op graph: {step.get('kernels_without_op', '?')} kernels of the recorded "
        f"step ({ms:.2f} ms of device time) were launched by ops the graph lacks; findings in "
        "that part of the step are missing or predict too little. Diagnose again (on the H200 "
        "it came and went between runs), or use FUSEWISE_CAPTURE=recorder"
    )


# the share of the step above which the report warns (the graphs that lost ops on the H200 lacked
# 112-406 of 1,386 ops, whose kernels took 0.54-1.48 ms of a 27-29 ms step: 2-5.5%)
INCOMPLETE_GRAPH_SHARE = 0.01


@dataclass
class TopOp:
    """One row of the breakdown: an op as torch.profiler names it, per step."""

    name: str
    ms_per_step: float
    share: float  # of the step's median time
    flops: float
    bytes: float
    intensity: float  # FLOP per byte (inf for an op that moves nothing)
    bound: str  # "memory" | "compute": intensity against the ridge point
    pct_of_ceiling: float  # of the bound's ceiling
    dtype: str | None = None  # a tensor-core op's operand dtype ("float32", ...); else None
    # the ceiling judged against: "bandwidth", or the matmul rate key ("fp32" = TF32 off, "tf32",
    # "bf16", "fp16", "fp8"; "matmul" = the headline rate, the device has none for this dtype)
    ceiling: str = "bandwidth"


@dataclass
class Skipped:
    analysis: str
    reason: str


@dataclass
class Report:
    device: Device
    step: StepSummary
    top: list[TopOp] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def as_dict(self) -> dict:
        step = asdict(self.step)
        if step["memory_scaling"] is None:  # present only when two sizes ran
            del step["memory_scaling"]
        return {
            "fusewise_version": __version__,
            "device": asdict(self.device),
            "step": step,
            "top": [asdict(t) for t in self.top],
            "findings": [f.as_dict() for f in self.findings],
            "skipped": [asdict(s) for s in self.skipped],
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
