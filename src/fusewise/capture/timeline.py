"""What torch.profiler saw over the profiled steps, parsed as soon as the session stops (its
kineto results are then freed: capture/profiler.py): time per op name, and on a GPU the timeline
of device intervals and the host ranges that explain the gaps between them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import profiler

_SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
)  # cudaMemcpy without Async blocks too
_LOADER = "enumerate(DataLoader)"


@dataclass
class Timeline:
    """Intervals in microseconds on the profiler's clock, over `steps` steps."""

    window: tuple[float, float]
    device: list[tuple[float, float, str]] = field(default_factory=list)  # kernels, copies
    syncs: list[tuple[float, float, str]] = field(default_factory=list)  # host waits on device
    loader: list[tuple[float, float]] = field(default_factory=list)  # DataLoader __next__
    host: list[tuple[float, float, str]] = field(default_factory=list)  # aten ops, for naming
    steps: int = 1
    # (phase, aten op) -> the idle gap (us) just before each kernel that op launched, over the
    # steps (kernel_gaps below); the diagnosis decides which gaps are launch-bound
    kernel_gaps: dict[tuple[str, str], list[float]] = field(default_factory=dict)


# torch.optim wraps every Optimizer.step in a profiler range of this name
_OPTIMIZER_RANGE = "Optimizer.step#"
_MARKS = (profiler.OPT_BEGIN, profiler.OPT_END)
# Profiler ranges (record_function) that kineto also shows on the device, spanning the kernels
# launched inside them: not kernels. Counted as device work, Optimizer.step's range hid every
# launch gap of a per-parameter optimizer loop (the H200 showed 0 ms of gaps where the loop's
# idle was most of an 8.6 ms saving).
_RANGES = (
    _OPTIMIZER_RANGE,
    "ProfilerStep#",
    "fusewise.op#",
    "fusewise.optimizer.",
    "fusewise.backward",
    "enumerate(DataLoader)",
)


def _annotation(name: str) -> bool:
    return name.startswith(_RANGES)


def timeline_from_profiler(prof, steps: int) -> Timeline | None:
    """The Timeline of a finished torch.profiler run; None when it saw no device activity."""
    device, syncs, loader, host = [], [], [], []
    t0 = None
    events = prof.events()
    ranges = {e.name for e in events if getattr(e, "is_user_annotation", False)}
    for e in events:
        start, end = e.time_range.start, e.time_range.end
        if e.device_type == torch.autograd.DeviceType.CUDA:
            # zero-length device events do no work (capture/_trace.py says where they came from)
            if end > start and not (_annotation(e.name) or e.name in ranges):
                device.append((start, end, e.name))
            continue
        t0 = start if t0 is None else min(t0, start)
        if e.name.startswith(_SYNC_CALLS) and not e.name.startswith("cudaMemcpyAsync"):
            syncs.append((start, end, e.name))
        elif e.name.startswith(_LOADER):
            loader.append((start, end))
        elif e.name.startswith("aten::"):
            host.append((start, end, e.name))
    if not device or t0 is None:
        return None
    device.sort()
    return Timeline(
        (t0, max(d[1] for d in device)),
        device,
        sorted(syncs),
        loader,
        host,
        steps,
        kernel_gaps(prof),
    )


def kernel_gaps(prof) -> dict[tuple[str, str], list[float]]:
    """The idle device time just before each kernel (0 when the device was still busy), listed
    under the (phase, aten op) that launched it: a short gap is the device waiting for that
    launch, what removing the op would give back (diagnose/_measured.py).

    Kernels are joined to their op through the profiler's correlation ids (a kernel's linked
    correlation id is its launching op's id), read from the raw kineto events before the
    session's results are freed. Phase: "optimizer" between the optimizer-step markers
    (profiler.mark_optimizer_steps, registered while the profiled steps run); "backward" on a
    thread other than the one that ran the optimizer (autograd runs the backward on a device
    thread); else "forward". Empty when the kineto results are gone or their API
    differs (the estimate then goes without launch gaps)."""
    inner = getattr(prof, "profiler", None) or prof
    results = getattr(inner, "kineto_results", None)
    try:
        events = list(results.events()) if results is not None else []
        ops, kernels, marks = {}, [], []
        for e in events:
            name = e.name()
            if e.device_type() == torch.autograd.DeviceType.CUDA:
                if _annotation(name) or getattr(e, "is_user_annotation", lambda: False)():
                    continue
                kernels.append((e.start_ns() / 1e3, e.end_ns() / 1e3, e.linked_correlation_id()))
            elif name in _MARKS:
                marks.append((e.start_ns(), e.start_thread_id(), name == profiler.OPT_BEGIN))
            elif name.startswith("aten::"):
                ops[e.correlation_id()] = (name, e.start_ns(), e.start_thread_id())
    except (AttributeError, RuntimeError, TypeError):
        return {}
    ranges = profiler.optimizer_ranges(marks)
    main = {t for t, _, _ in ranges}
    out: dict[tuple[str, str], list[float]] = {}
    cursor = None
    for start, end, link in sorted(kernels):
        gap = 0.0 if cursor is None else max(0.0, start - cursor)
        cursor = end if cursor is None else max(cursor, end)
        op = ops.get(link)
        if op is None:
            continue
        name, at, thread = op
        if any(t == thread and r0 <= at <= r1 for t, r0, r1 in ranges):
            phase = "optimizer"
        elif main and thread not in main:
            phase = "backward"
        else:
            phase = "forward"
        out.setdefault((phase, name), []).append(gap)
    return out


def op_times(prof, steps: int, cuda: bool) -> dict[str, float]:
    """ms per step for each profiler op name: device time when the step ran on the GPU; CPU
    time for a CPU step (also when a GPU is present but the step never used it)."""
    return self_times(prof.key_averages(), steps, cuda)


def self_times(events, steps: int, cuda: bool) -> dict[str, float]:
    """ms per step per name from key_averages() rows, counting each op's *self* time: the
    inclusive totals count a child's kernels again under its parent (aten::linear's would repeat
    aten::addmm's), so the shares of a step summed to 111-189%; self times partition it."""
    events = list(events)
    on_device = cuda and sum(e.self_device_time_total for e in events) > 0
    return {
        e.key: (e.self_device_time_total if on_device else e.self_cpu_time_total) / 1e3 / steps
        for e in events
    }
