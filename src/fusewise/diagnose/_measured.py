"""What removing a set of ops would save, from measurements: the time the ops took, the launch
gaps before their kernels, less what the fused kernel that replaces them needs. Shared by the
fusion-chain and attention-fallback analyzers. Not an analyzer: registers nothing.

Why not the byte model alone: it is a floor. Unfused ops run well below the bandwidth ceiling
(small tensors, fp32 upcasts, strided reads) and each of them also costs a launch; on the H200
the demo's chains were predicted at 8.4 ms by bytes and the step got 15.5 ms faster.

The ops' times come from the recorded step (each op's kernels, by profiler range), scaled by the
device-busy time of the profiled steps over the recorded step's (the recorder's step runs one
op at a time; the scale puts its times on the unrecorded steps' clock). On the CPU each op's
host time is scaled per profiler op name to the profiled steps' self time of that name: the
recorder's per-op overhead inflates small ops 2-5x (nanoGPT and a Llama on a CPU: the predicted
cross-entropy saving came out above the profiled time of its ops). Launch gaps come from
the profiled steps: the idle before each kernel, under the (phase, aten op) that launched it
(capture/timeline.py kernel_gaps), spread over the recorded ops of that phase and name.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from ..capture.graph import OpGraph, OpRecord
from . import thresholds as T
from ._replay import Replay, device_gap_us

MATMULS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default"}


def profiler_name(aten: str) -> str:
    """'aten.mm.default' -> 'aten::mm' (how torch.profiler names it)."""
    parts = aten.split(".")
    return f"{parts[0]}::{parts[1]}" if len(parts) >= 2 else aten


@dataclass
class Timing:
    """How the recorded ops' times map onto the plain step: `scale` for their times, and the
    launch gap (ms) each op's kernel waits for, by (phase, profiler op name)."""

    scale: float = 1.0
    gap_ms: dict[tuple[str, str], float] = field(default_factory=dict)
    source: str = "recorded step"
    # profiler op name -> its own scale (the CPU's); a name not in it takes `scale`
    name_scale: dict[str, float] = field(default_factory=dict)
    # the recorded step's trace, calibrated (GPU, profiler capture): a fix's saving replayed
    replay: Replay | None = None

    def op_ms(self, op: OpRecord) -> float:
        if not 0.0 < op.ms < math.inf:  # no time, or a broken one (negative, NaN): none
            return 0.0
        return op.ms * self.name_scale.get(profiler_name(op.name), self.scale)

    def op_gap_ms(self, op: OpRecord) -> float:
        if op.ms <= 0:
            return 0.0
        # the profile knows forward, backward and optimizer by thread and range; gradient
        # processing between backward and optimizer runs on the forward's thread
        phase = "forward" if op.phase == "post-backward" else op.phase
        return self.gap_ms.get((phase, profiler_name(op.name)), 0.0)


def has_times(graph: OpGraph) -> bool:
    return any(op.ms > 0 for op in graph.ops)


def timing(obs) -> Timing | None:
    """The Timing of an observation; None when its op graph holds no measured times."""
    graph = obs.graph
    if not has_times(graph):
        return None
    tl = obs.timeline
    if tl is None:  # a CPU step: op times are host times, launch costs included
        return Timing(
            source="recorded step (host time per op, scaled per op name to the profiled steps)",
            name_scale=_name_scales(graph, obs.op_ms),
        )
    recorded = sum(op.ms for op in graph.ops if not op.is_view and 0.0 < op.ms < math.inf)
    busy = _busy_ms(tl)
    scale = busy / recorded if recorded > 0 and busy > 0 else 1.0
    # beyond these, the two steps did different work: keep the recorded times as they are
    if not T.TIME_SCALE_RANGE[0] <= scale <= T.TIME_SCALE_RANGE[1]:
        scale = 1.0
    # idle per step, scaled like the gap analyzers' (the profiler slows the host: _gaps.idle)
    window_ms = (tl.window[1] - tl.window[0]) / 1e3 / tl.steps
    idle_scale = min(1.0, obs.median_ms / window_ms) if obs.median_ms and window_ms else 1.0
    ops_per_key = Counter(
        ("forward" if op.phase == "post-backward" else op.phase, profiler_name(op.name))
        for op in graph.ops
        if op.ms > 0
    )
    gap_ms = {}
    for (phase, name), gaps in tl.kernel_gaps.items():
        launch = sum(g for g in gaps if g < T.LAUNCH_GAP_MAX_US) / 1e3 / tl.steps
        n = ops_per_key.get((phase, name))
        if n and launch > 0:
            gap_ms[(phase, name)] = launch * idle_scale / n
    return Timing(scale, gap_ms, "profiled steps", replay=replay_of(obs))


def replay_of(obs) -> Replay | None:
    """The observation's calibrated Replay (made once: every analyzer asks), or None without
    a trace or a plain step time."""
    cached = obs.__dict__.get("_replay", False)
    if cached is not False:
        return cached
    trace = getattr(obs, "trace", None)
    plain = obs.median_ms if trace is not None else None
    gap = device_gap_us(trace.kernels) if trace is not None else 0.0
    obs._replay = Replay(trace, plain, getattr(obs, "marks_ms", None), gap) if plain else None
    return obs._replay


def _name_scales(graph: OpGraph, op_ms: dict[str, float]) -> dict[str, float]:
    """profiler op name -> profiled ms per step / recorded ms, for the names both measured. A
    name the profile lacks keeps its recorded times (scale 1)."""
    recorded: Counter = Counter()
    for op in graph.ops:
        if not op.is_view and 0.0 < op.ms < math.inf:
            recorded[profiler_name(op.name)] += op.ms
    # a ratio far from 1 means the two profiles put the time under different names (a cast's
    # time under its copy_ child, say): such a name keeps its recorded times
    low, high = T.NAME_SCALE_RANGE
    return {
        n: op_ms[n] / ms
        for n, ms in recorded.items()
        if op_ms.get(n, 0) > 0 and low <= op_ms[n] / ms <= high
    }


def _busy_ms(tl) -> float:
    """Device-busy ms per step (the union of kernel intervals) of the profiled steps."""
    busy, cursor = 0.0, None
    for start, end, _ in sorted(tl.device):  # the union needs them by start
        if cursor is None or start >= cursor:
            busy += end - start
            cursor = end
        elif end > cursor:
            busy += end - cursor
            cursor = end
    return busy / 1e3 / tl.steps


@dataclass
class Saving:
    ms: float  # predicted saving per step
    removed_ms: float  # measured time of the ops the fix removes
    launch_gap_ms: float  # launch idle before their kernels
    fused_ms: float  # what the fused kernel needs (its bytes at the pattern's efficiency)
    removed_ops: int
    removed: tuple[int, ...] = ()  # their op-graph indices


def saving(
    removed: list[OpRecord],
    fused_bytes: float,
    bandwidth_GBps: float,
    t: Timing,
    efficiency: float = T.FUSED_KERNEL_EFFICIENCY,
    compute_ms: float = 0.0,
):
    """removed: the ops the fix takes away (a chain's matmuls are not among them unless the
    fused kernel does their FLOPs itself: attention); fused_bytes: what the fused kernel must
    move, at `efficiency` of the copy ceiling; compute_ms: its FLOPs' time where it has them.
    The fused kernel takes the longer of the two."""
    removed_ms = sum(t.op_ms(op) for op in removed)
    gaps = sum(t.op_gap_ms(op) for op in removed)
    fused = max(fused_bytes / (bandwidth_GBps * 1e9 * efficiency) * 1e3, compute_ms)
    return Saving(
        max(0.0, removed_ms + gaps - fused),
        removed_ms,
        gaps,
        fused,
        len(removed),
        tuple(op.index for op in removed),
    )


def replayed(parts: list[Saving], t: Timing | None, launches: int = 1) -> float | None:
    """The saving of removing every part's ops at once, each part replaced by its fused kernel
    (`launches` launches of it), by replaying the step (_replay.py); None when there is no
    replay, or its trace lacks one of the ops."""
    r = t.replay if t is not None else None
    ops = [i for p in parts for i in p.removed]
    if r is None or not ops or not r.covers(ops):
        return None
    fused = []
    for p in parts:
        f = r.fused(p.removed, p.fused_ms)
        f.host_us *= launches
        fused.append(f)
    return max(0.0, r.saving_ms(ops, fused))


def replay_evidence(t: Timing, sum_ms: float) -> dict:
    """What a replayed prediction shows: how, the calibration, and the sum it replaced."""
    return dict(
        estimate="replayed: the recorded step's host and device timeline without the removed "
        "ops, with the fused kernel (diagnose/_replay.py)",
        sum_of_parts_ms=round(max(0.0, sum_ms), 4),
        **t.replay.evidence(),
    )
