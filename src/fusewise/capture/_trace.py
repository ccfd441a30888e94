"""The recorded step as a host/device trace, for replaying it without some of its ops
(diagnose/_replay.py): when the host issued each kernel and how long the kernel ran, when the
host waited for the device, and the host span of each op of the op graph.

Why: a fused kernel saves what the step waits for, not what its ops cost. Where the host runs
ahead of the device, removing device work saves that work and removing host work saves nothing;
where the device waits for launches (a per-parameter optimizer loop), it is the other way round.
On the H200 the demo's optimizer loop predicted 3.4 ms from its ops' times and launch gaps; the
fix saved 1.35 ms, because the loop's launches overlapped the backward's kernels.

Read from the kineto events of the recorded step's profiler session (capture/profiled.py), on a
GPU only. Times in microseconds from the session's first host event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .profiler import BACKWARD, OPT_BEGIN, OPT_END
from .timeline import _SYNC_CALLS, _annotation

# runtime calls that put work on a stream: the host time a kernel, copy or fill was issued
_LAUNCH_CALLS = (
    "cudaLaunchKernel",
    "cuLaunchKernel",
    "cudaLaunchCooperativeKernel",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
    "cudaMemcpy2DAsync",
    "cudaGraphLaunch",
)


@dataclass
class Kernel:
    issue_us: float  # when the host issued it (its runtime call; else its op's start)
    duration_us: float  # how long it ran on the device
    op: int  # index of the op-graph op that launched it; -1 for none
    start_us: float | None = None  # when it began on the device (None: not known)


@dataclass
class StepTrace:
    end_us: float  # the host's last event ends (the step's closing sync included)
    kernels: list[Kernel] = field(default_factory=list)  # in issue order
    syncs: list[tuple[float, float]] = field(default_factory=list)  # host waits on the device
    op_starts: list[float] = field(default_factory=list)  # every aten op event (profiler cost)
    spans: dict[int, tuple[float, float]] = field(default_factory=dict)  # graph op -> host span
    # (label, µs) of each backward call's begin and end and each optimizer step's begin and end
    # (capture/profiler.py's marks; the plain steps note the same on the host's clock)
    marks: list[tuple[str, float]] = field(default_factory=list)
    # kernels launched by an op event the graph's walk never reached (the graph lacks that op
    # and those after it: see capture/_event_graph.py's walk), and their device µs; a kernel of
    # an op the walk reached but that is no graph op (an autograd Function's own) is not counted
    unwalked_kernels: int = 0
    unwalked_us: float = 0.0

    @property
    def step_end_us(self) -> float:
        """Where the step's own host work ends: its closing sync's start."""
        return self.syncs[-1][0] if self.syncs else self.end_us


def trace_from_events(
    events, corr_ops: dict[int, list[int]], spans_ns, walked: set[int] | None = None
) -> StepTrace | None:
    """events: the session's kineto events (results.events()); corr_ops: correlation id -> the
    op-graph indices whose events hold it (outermost first, capture/_event_graph.Builder.corr);
    spans_ns: (start, end) ns of each op-graph op; walked: the correlation ids of every op event
    the graph's walk reached (Builder.walked; None: not counted). None without device work or
    host events."""
    host, launches, kernels, marks = [], {}, [], []
    for e in events:
        name = e.name()
        if e.device_type() == torch.autograd.DeviceType.CUDA:
            # zero-length device events are no kernels: the H200 showed two per op (op -1, never
            # joined) in a session after other CUDA work in the process; they do no work
            if e.duration_ns() <= 0:
                continue
            if not _annotation(name) and not getattr(e, "is_user_annotation", lambda: False)():
                kernels.append(
                    (e.start_ns(), e.duration_ns(), e.correlation_id(), e.linked_correlation_id())
                )
            continue
        host.append((e.start_ns(), e.start_ns() + e.duration_ns(), name, e.correlation_id()))
        if name in (BACKWARD, OPT_BEGIN, OPT_END):
            marks.append((name, e.start_ns(), e.start_ns() + e.duration_ns()))
        if name.startswith(_LAUNCH_CALLS):
            launches[e.correlation_id()] = e.start_ns()
    if not kernels or not host:
        return None
    t0 = min(h[0] for h in host)
    op_start = {corr: start for start, _, name, corr in host if name.startswith("aten::")}

    def us(ns: float) -> float:
        return (ns - t0) / 1e3

    trace = StepTrace(end_us=us(max(h[1] for h in host)))
    issued = []
    for start, dur, corr, linked in kernels:
        # the launch call; else the op that launched it; else no earlier than it started
        issue = launches.get(corr, op_start.get(linked, start))
        op = (corr_ops.get(linked) or [-1])[0]
        if walked is not None and linked > 0 and op < 0 and linked not in walked:
            trace.unwalked_kernels += 1
            trace.unwalked_us += dur / 1e3
        issued.append((issue, start, Kernel(us(issue), dur / 1e3, op, us(start))))
    # one stream's kernels run in issue order; ties (one call, several copies) by device start
    trace.kernels = [k for _, _, k in sorted(issued, key=lambda x: (x[0], x[1]))]
    trace.syncs = sorted(
        (us(s), us(e))
        for s, e, name, _ in host
        if name.startswith(_SYNC_CALLS) and "Async" not in name
    )
    trace.op_starts = sorted(us(s) for s, _, name, _ in host if name.startswith("aten::"))
    trace.spans = {i: (us(s), us(e)) for i, (s, e) in enumerate(spans_ns)}
    for name, start, end in marks:
        if name == BACKWARD:
            trace.marks += [(name + ".begin", us(start)), (name + ".end", us(end))]
        else:
            trace.marks.append((name, us(start)))
    trace.marks.sort(key=lambda m: m[1])
    if trace.marks and trace.marks[0][0] == OPT_END:
        trace.marks = trace.marks[1:]  # a session started inside an optimizer step
    return trace
