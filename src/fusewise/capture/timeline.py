"""What torch.profiler saw over the profiled steps, parsed as soon as the session stops (its
kineto results are then freed: capture/profiler.py): time per op name, and on a GPU the timeline
of device intervals and the host ranges that explain the gaps between them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

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


def timeline_from_profiler(prof, steps: int) -> Timeline | None:
    """The Timeline of a finished torch.profiler run; None when it saw no device activity."""
    device, syncs, loader, host = [], [], [], []
    t0 = None
    for e in prof.events():
        start, end = e.time_range.start, e.time_range.end
        if e.device_type == torch.autograd.DeviceType.CUDA:
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
    return Timeline((t0, max(d[1] for d in device)), device, sorted(syncs), loader, host, steps)


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
