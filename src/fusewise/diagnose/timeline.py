"""Where the GPU sat idle in the profiled steps, and why: launch overhead, host syncs, data
loading, other host work. Stateless: (Timeline, OpGraph, host-sync findings) -> findings.

The timeline is what torch.profiler saw over the profiled steps: device intervals (kernels,
copies, memsets), host waits on the device (cuda*Synchronize, blocking copies) and DataLoader
`__next__` ranges. Every gap between device intervals is classified by what the host was doing:

- a DataLoader `__next__` overlaps it           -> data-loading
- a host wait on the device ends inside it      -> the cost of a host sync (the GPU drained its
                                                   queue and waits for the host to refill it)
- shorter than LAUNCH_GAP_MAX_US                -> launch overhead (the host launches kernels
                                                   more slowly than the GPU runs them)
- anything longer                               -> idle-gap (other host work)

Thresholds and their reasons: thresholds.py; the heuristics: docs/findings.md.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field

from ..capture.opgraph import OpGraph
from . import thresholds as T
from .findings import Finding

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
    device: list[tuple[float, float, str]] = field(default_factory=list)
    syncs: list[tuple[float, float, str]] = field(default_factory=list)
    loader: list[tuple[float, float]] = field(default_factory=list)
    host: list[tuple[float, float, str]] = field(default_factory=list)  # aten ops, for naming
    steps: int = 1


def timeline_from_profiler(prof, steps: int) -> Timeline | None:
    """The Timeline of a finished torch.profiler run; None when it saw no device activity."""
    import torch

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


def _gaps(tl: Timeline) -> list[tuple[float, float]]:
    """Intervals inside the window where no device interval runs."""
    out, cursor = [], tl.window[0]
    for start, end, _ in tl.device:
        if start > cursor:
            out.append((cursor, start))
        cursor = max(cursor, end)
    return out


def _overlap(a0, a1, b0, b1) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _host_op_during(tl: Timeline, g0: float, g1: float) -> str | None:
    """The aten op the host spent most of a gap in, if any."""
    best, name = 0.0, None
    for s, e, n in tl.host:
        o = _overlap(s, e, g0, g1)
        if o > best:
            best, name = o, n
    return name


def classify(tl: Timeline) -> dict[str, list[tuple[float, float]]]:
    """Each gap under one cause: data-loading, host-sync, launch-overhead or idle-gap."""
    causes = collections.defaultdict(list)
    for g0, g1 in _gaps(tl):
        if any(_overlap(s, e, g0, g1) > 0.5 * (g1 - g0) for s, e in tl.loader):
            causes["data-loading"].append((g0, g1))
        elif any(g0 - T.SYNC_SLACK_US <= e <= g1 for _, e, _ in tl.syncs):
            causes["host-sync"].append((g0, g1))
        elif g1 - g0 < T.LAUNCH_GAP_MAX_US:
            causes["launch-overhead"].append((g0, g1))
        else:
            causes["idle-gap"].append((g0, g1))
    return causes


def _short_op_lines(graph: OpGraph, n: int = 3) -> list[tuple[str, int]]:
    """Lines that launch the most short ops (measured device time under SHORT_OP_US)."""
    count = collections.Counter(
        op.where for op in graph.ops if not op.is_view and 0 < op.ms * 1e3 < T.SHORT_OP_US
    )
    return count.most_common(n)


def find_gaps(
    tl: Timeline | None,
    graph: OpGraph,
    syncs: list[Finding],
    step_ms: float | None = None,
    loader_lines=None,
) -> list[Finding]:
    """Findings from the timeline, and `syncs` (the op graph's host-sync findings) returned with
    their measured idle time. Without a timeline (a CPU step) `syncs` comes back unchanged.

    The profiler slows the host (it records every op), which lengthens host-bound gaps: with
    step_ms (the median unprofiled step) every idle time is scaled by step_ms / the profiled
    step, when that is below 1. Both are in the evidence. loader_lines (a Counter of the lines
    that took DataLoader batches, capture/loader.py) names the data-loading finding's line."""
    if tl is None:
        return list(syncs)
    causes = classify(tl)
    window_ms = (tl.window[1] - tl.window[0]) / 1e3 / tl.steps
    scale = min(1.0, step_ms / window_ms) if step_ms else 1.0
    per_step = {k: scale * sum(g1 - g0 for g0, g1 in v) / 1e3 / tl.steps for k, v in causes.items()}
    common = dict(
        profiled_step_ms=round(window_ms, 3),
        plain_step_ms=step_ms,
        idle_scaled_by=round(scale, 3),
        gpu_busy_ms_profiled=round(window_ms - sum(per_step.values()) / scale, 3),
    )

    def worth(ms: float) -> bool:
        return ms >= T.GAP_MIN_MS and ms >= T.GAP_MIN_SHARE * window_ms * scale

    out = []
    ms = per_step.get("launch-overhead", 0.0)
    if worth(ms):
        lines = _short_op_lines(graph)
        gaps = causes["launch-overhead"]
        out.append(
            Finding(
                kind="launch-overhead",
                where=lines[0][0] if lines else "?",
                est_saving_ms=ms,
                bytes_avoidable=0.0,
                title=f"the GPU waits for kernel launches: {len(gaps) / tl.steps:.0f} short gaps "
                f"per step, {ms:.2f} ms in all",
                fix="capture the step in a CUDA graph (torch.compile(mode='reduce-overhead'), "
                "torch.cuda.graphs), or fuse the small ops so there are fewer launches",
                evidence=dict(
                    common,
                    gaps_per_step=len(gaps) / tl.steps,
                    median_gap_us=sorted(g1 - g0 for g0, g1 in gaps)[len(gaps) // 2],
                    kernels_per_step=len(tl.device) / tl.steps,
                    lines_with_most_short_ops=[f"{w} ({c})" for w, c in lines],
                ),
            )
        )
    ms = per_step.get("data-loading", 0.0)
    if worth(ms):
        lines = (loader_lines or {}).items()
        where = max(lines, key=lambda kv: kv[1])[0] if lines else "?"
        out.append(
            Finding(
                kind="data-loading",
                where=where,
                est_saving_ms=ms,
                bytes_avoidable=0.0,
                title=f"the GPU waits {ms:.2f} ms per step for the DataLoader",
                fix="DataLoader(num_workers > 0, pin_memory=True, persistent_workers=True), "
                "prefetch the next batch, or move preprocessing onto the GPU",
                evidence=dict(
                    common,
                    waits_per_step=len(causes["data-loading"]) / tl.steps,
                    batches_taken_at=dict(loader_lines or {}),
                ),
            )
        )
    ms = per_step.get("idle-gap", 0.0)
    if worth(ms):
        gaps = sorted(causes["idle-gap"], key=lambda g: g[0] - g[1])[:3]
        during = [_host_op_during(tl, g0, g1) or "Python (no aten op)" for g0, g1 in gaps]
        out.append(
            Finding(
                kind="idle-gap",
                where="?",
                est_saving_ms=ms,
                bytes_avoidable=0.0,
                title=f"the GPU is idle {ms:.2f} ms per step while the host does other work",
                fix="move host work off the step's critical path (another thread, fewer Python "
                "loops per step) or overlap it with GPU work",
                evidence=dict(
                    common,
                    gaps_per_step=len(causes["idle-gap"]) / tl.steps,
                    largest_gaps_us=[round(g1 - g0, 1) for g0, g1 in gaps],
                    host_during_largest=during,
                ),
            )
        )
    return out + _with_sync_idle(syncs, per_step.get("host-sync", 0.0), tl, common)


def _with_sync_idle(syncs, idle_ms, tl, common) -> list[Finding]:
    """Share the measured post-sync idle among the host-sync lines by their syncs per step. A
    sync the op graph did not see (torch.cuda.synchronize(), a blocking copy outside aten)
    becomes its own finding."""
    total = sum(f.evidence.get("syncs_per_step", 0) for f in syncs)
    out = []
    for f in syncs:
        share = idle_ms * f.evidence.get("syncs_per_step", 0) / total if total else 0.0
        ev = dict(f.evidence, idle_time=f"measured: {share:.3f} ms per step", **common)
        out.append(dataclasses.replace(f, est_saving_ms=share, evidence=ev))
    if not syncs and idle_ms >= T.GAP_MIN_MS:
        names = sorted({n for _, _, n in tl.syncs})
        out.append(
            Finding(
                kind="host-sync",
                where="?",
                est_saving_ms=idle_ms,
                bytes_avoidable=0.0,
                title=f"the host waits for the GPU ({', '.join(names)}) and the GPU then idles "
                f"{idle_ms:.2f} ms per step",
                fix="remove explicit synchronisation from the step (torch.cuda.synchronize, "
                "blocking copies); keep values on the GPU",
                evidence=dict(common, sync_calls_per_step=len(tl.syncs) / tl.steps),
            )
        )
    return out
