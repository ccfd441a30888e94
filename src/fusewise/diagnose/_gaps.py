"""The gaps of a GPU timeline, each under its cause, and the idle time per step they add up to:
shared by the timeline analyzer (launch overhead, data loading, idle host) and the host-sync
analyzer (the idle after a sync). Not an analyzer itself: registers nothing.

Every gap between device intervals is classified by what the host was doing:

- a DataLoader `__next__` overlaps it           -> data-loading
- a host wait on the device ends inside it      -> host-sync (the GPU drained its queue and
                                                   waits for the host to refill it)
- shorter than LAUNCH_GAP_MAX_US                -> launch-overhead (the host launches kernels
                                                   more slowly than the GPU runs them)
- anything longer                               -> idle-gap (other host work)
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from ..capture.timeline import Timeline
from . import thresholds as T


def gaps(tl: Timeline) -> list[tuple[float, float]]:
    """Intervals inside the window where no device interval runs."""
    out, cursor = [], tl.window[0]
    for start, end, _ in tl.device:
        if start > cursor:
            out.append((cursor, start))
        cursor = max(cursor, end)
    return out


def busy_us(tl: Timeline) -> float:
    """Time inside the window when at least one device interval runs (overlaps counted once)."""
    total, cursor = 0.0, tl.window[0]
    for start, end, _ in tl.device:
        start, end = max(start, cursor), min(end, tl.window[1])
        if end > start:
            total += end - start
            cursor = end
    return total


def overlap(a0, a1, b0, b1) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def host_op_during(tl: Timeline, g0: float, g1: float) -> str | None:
    """The aten op the host spent most of a gap in, if any."""
    best, name = 0.0, None
    for s, e, n in tl.host:
        o = overlap(s, e, g0, g1)
        if o > best:
            best, name = o, n
    return name


def classify(tl: Timeline) -> dict[str, list[tuple[float, float]]]:
    """Each gap under one cause: data-loading, host-sync, launch-overhead or idle-gap."""
    causes = collections.defaultdict(list)
    for g0, g1 in gaps(tl):
        if any(overlap(s, e, g0, g1) > 0.5 * (g1 - g0) for s, e in tl.loader):
            causes["data-loading"].append((g0, g1))
        elif any(g0 - T.SYNC_SLACK_US <= e <= g1 for _, e, _ in tl.syncs):
            causes["host-sync"].append((g0, g1))
        elif g1 - g0 < T.LAUNCH_GAP_MAX_US:
            causes["launch-overhead"].append((g0, g1))
        else:
            causes["idle-gap"].append((g0, g1))
    return causes


@dataclass
class Idle:
    causes: dict[str, list[tuple[float, float]]]  # cause -> its gaps (us, profiler clock)
    per_step_ms: dict[str, float]  # cause -> idle ms per step, scaled to the plain step
    window_ms: float  # the profiled step
    scale: float
    evidence: dict  # what every gap finding shows of the above


def idle(tl: Timeline, step_ms: float | None = None) -> Idle:
    """The profiler slows the host (it records every op), which lengthens host-bound gaps: with
    step_ms (the median unprofiled step) every idle time is scaled by step_ms / the profiled
    step, when that is below 1. Both are in the evidence."""
    causes = classify(tl)
    window_ms = (tl.window[1] - tl.window[0]) / 1e3 / tl.steps
    scale = min(1.0, step_ms / window_ms) if step_ms else 1.0
    per_step = {k: scale * sum(g1 - g0 for g0, g1 in v) / 1e3 / tl.steps for k, v in causes.items()}
    evidence = dict(
        profiled_step_ms=round(window_ms, 3),
        plain_step_ms=step_ms,
        idle_scaled_by=round(scale, 3),
        gpu_busy_ms_profiled=round(window_ms - sum(per_step.values()) / scale, 3),
    )
    return Idle(causes, per_step, window_ms, scale, evidence)
