"""Observation: everything one diagnosis saw of a step, at one size. Filled by the step schedule
(capture/schedule.py) whoever drives it (fusewise.diagnose(step), or the script runner);
read by every analyzer, `(Observation, Ceilings) -> list[Finding]` (diagnose/registry.py)."""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field

from ._trace import StepTrace
from .graph import OpGraph
from .timeline import Timeline


@dataclass
class Observation:
    graph: OpGraph  # the recorded step: dataflow, bytes, FLOPs, lines, each GPU op's time
    times_ms: list[float]  # wall time of each timed step
    op_ms: dict[str, float]  # profiler op name -> ms per step (device time on a GPU)
    captured_ms: float  # wall time of the recorded step (the recorder's overhead)
    device: str  # "cuda" or "cpu": where the step ran
    peak_memory_bytes: int | None = None  # allocator peak over the timed steps (GPU)
    timeline: Timeline | None = None  # the profiled steps on the GPU; None on the CPU
    # path:line -> DataLoader batches taken there during the profiled steps
    loader_lines: collections.Counter = field(default_factory=collections.Counter)
    size: tuple[str, float] | None = None  # (name, value) when run at a size (--sizes)
    other: Observation | None = None  # the same step at another size (memory scaling)
    # torch's fp32 matmul settings as the recorded step ended (hardware.matmul_settings: whether
    # its fp32 matmuls ran as TF32); None from an observation made without them
    matmul_settings: dict | None = None
    # the recorded step's host/device trace (GPU, profiler capture): diagnose/_replay.py
    trace: StepTrace | None = None
    # per timed step: (label, ms from the step's start) of its backward and optimizer marks and
    # ("end", ms) where its host work ended (capture/profiler.py note_host_marks)
    marks_ms: list[list[tuple[str, float]]] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)
