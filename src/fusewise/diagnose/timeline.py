"""Where the GPU sat idle in the profiled steps, and why: launch overhead, data loading, other
host work (the idle after a host sync is the host-sync analyzer's). Stateless: (Timeline,
OpGraph) -> list[Finding]; registered as "timeline gaps", which needs a GPU timeline.

The timeline is what torch.profiler saw over the profiled steps (capture/timeline.py); how each
gap gets its cause: diagnose/_gaps.py. Thresholds and their reasons: thresholds.py; the
heuristics: docs/findings.md.
"""

from __future__ import annotations

import collections

from .. import fixes
from ..capture.graph import OpGraph
from ..capture.timeline import Timeline
from ..report import Finding
from . import _gaps
from . import thresholds as T
from .registry import Skip, analyzer


@analyzer("timeline gaps (launch overhead, data loading, idle host)")
def analyze(obs, ceilings) -> list[Finding]:
    if obs.timeline is None:
        raise Skip("no device activity in the profile (a CPU step)")
    # tokens per step: known only when the caller said (fusewise.diagnose(step,
    # tokens_per_step=N)); the Observation has no field for it yet, hence getattr
    tokens = getattr(obs, "tokens_per_step", None)
    return find_gaps(obs.timeline, obs.graph, obs.median_ms, obs.loader_lines, tokens)


def _launching_lines(graph: OpGraph, n: int = 3) -> tuple[list[tuple[str, int]], str]:
    """The lines that launch the most ops, and which ops were counted: those under SHORT_OP_US
    on the device (launch-bound on any GPU); if none was measured that short (another process on
    the GPU stretches every kernel; a GPU test under pytest-xdist found "?" here), every op with
    device time; if no op has any, every op. A launch gap is the host's time between launches,
    whatever the kernels' length, so the line that launches most is the one to name either way.
    The ops counted are chosen before their lines are looked at: where they have no known line
    ("?"), none is named (never a line of the next kind of ops in their place)."""
    ops = [op for op in graph.ops if not op.is_view]
    short = [op for op in ops if 0 < op.ms * 1e3 < T.SHORT_OP_US]
    timed = [op for op in ops if op.ms > 0]
    for counted, chosen in (
        (f"ops under {T.SHORT_OP_US:g} us on the device", short),
        ("ops on the device", timed),
        ("ops (none was timed on the device)", ops),
    ):
        if chosen:
            count = collections.Counter(op.where for op in chosen if op.where != "?")
            return count.most_common(n), counted + ("" if count else ", none of a known line")
    return [], "no ops"


def graph_prediction(
    tl: Timeline,
    step_ms: float | None,
    tokens_per_step: int | None = None,
    idle_ms: dict | None = None,
) -> dict:
    """What a CUDA graph of the step would give, from the profiled timeline.

    A graph replays the same kernels with one host call: the kernels' time stays (the GPU's
    busy time per step, measured by the profiler, which times device work faithfully) and the
    time the GPU waited for kernel launches and other host work goes. Predicted graph step =
    busy time + the waits a graph cannot remove (idle_ms, per cause, from _gaps.idle: a host
    sync or a DataLoader wait cannot be captured at all; both are 0 in a capturable step);
    gain = the step (the plain median when known, else the profiled step) minus that. Launches
    per token only when the caller said how many tokens a step makes (never guessed)."""
    window_ms = (tl.window[1] - tl.window[0]) / 1e3 / tl.steps
    step = step_ms if step_ms else window_ms
    busy = min(_gaps.busy_us(tl) / 1e3 / tl.steps, step)
    kept = sum((idle_ms or {}).get(cause, 0.0) for cause in _GRAPH_KEEPS)
    after = min(busy + kept, step)
    launches = len(tl.device) / tl.steps
    out = dict(
        launches_per_step=launches,
        gpu_busy_ms=busy,
        gpu_busy_share=busy / step if step > 0 else None,
        graph_step_ms_predicted=after,
        graph_gain_ms=step - after,
        graph_gain_from="plain step" if step_ms else "profiled step",
    )
    if kept:
        out["graph_keeps_ms"] = kept  # sync and loader waits: not capturable
    if tokens_per_step:
        out.update(
            tokens_per_step=tokens_per_step,
            launches_per_token=launches / tokens_per_step,
            tokens_per_s_eager=tokens_per_step / step * 1e3,
            tokens_per_s_graph=tokens_per_step / after * 1e3 if after > 0 else None,
        )
    else:
        out.update(
            steps_per_s_eager=1e3 / step,
            steps_per_s_graph=1e3 / after if after > 0 else None,
        )
    return out


# idle causes a graph does not remove: the step must lose them before it can be captured
_GRAPH_KEEPS = ("host-sync", "data-loading")


def _graph_words(p: dict) -> str:
    rate = "tokens" if "tokens_per_s_eager" in p else "steps"
    before, after = p[f"{rate}_per_s_eager"], p[f"{rate}_per_s_graph"]
    return (
        f"; a CUDA graph would save {p['graph_gain_ms']:.2f} ms per step (GPU busy "
        f"{100 * (p['gpu_busy_share'] or 0):.0f}% of it; {before:,.0f} -> {after or 0:,.0f} "
        f"{rate}/s)"
    )


def find_gaps(
    tl: Timeline,
    graph: OpGraph,
    step_ms: float | None = None,
    loader_lines=None,
    tokens_per_step: int | None = None,
) -> list[Finding]:
    """Launch-overhead, data-loading and idle-gap findings from the timeline. Idle times are
    scaled to the plain step (step_ms: _gaps.idle says why). loader_lines (a Counter of the
    lines that took DataLoader batches, capture/loader.py) names the data-loading line.
    tokens_per_step (a decode step's batch) adds launches and tokens/s per token to the
    launch-overhead finding's CUDA-graph prediction (graph_prediction)."""
    found = _gaps.idle(tl, step_ms)
    causes, per_step, common = found.causes, found.per_step_ms, found.evidence
    window_ms, scale = found.window_ms, found.scale

    def worth(ms: float) -> bool:
        return ms >= T.GAP_MIN_MS and ms >= T.GAP_MIN_SHARE * window_ms * scale

    out = []
    ms = per_step.get("launch-overhead", 0.0)
    if worth(ms):
        lines, counted = _launching_lines(graph)
        gaps = causes["launch-overhead"]
        predicted = graph_prediction(tl, step_ms, tokens_per_step, per_step)
        out.append(
            Finding(
                kind="launch-overhead",
                where=lines[0][0] if lines else "?",
                est_saving_ms=ms,
                bytes_avoidable=0.0,
                title=f"the GPU waits for kernel launches: {len(gaps) / tl.steps:.0f} short gaps "
                f"per step, {ms:.2f} ms in all" + _graph_words(predicted),
                fix=fixes.text("launch-overhead"),
                evidence=dict(
                    common,
                    gaps_per_step=len(gaps) / tl.steps,
                    median_gap_us=sorted(g1 - g0 for g0, g1 in gaps)[len(gaps) // 2],
                    kernels_per_step=len(tl.device) / tl.steps,
                    lines_with_most_ops=[f"{w} ({c})" for w, c in lines],
                    ops_counted=counted,
                    **predicted,
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
                fix=fixes.text("data-loading"),
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
        during = [_gaps.host_op_during(tl, g0, g1) or "Python (no aten op)" for g0, g1 in gaps]
        out.append(
            Finding(
                kind="idle-gap",
                where="?",
                est_saving_ms=ms,
                bytes_avoidable=0.0,
                title=f"the GPU is idle {ms:.2f} ms per step while the host does other work",
                fix=fixes.text("idle-gap"),
                evidence=dict(
                    common,
                    gaps_per_step=len(causes["idle-gap"]) / tl.steps,
                    largest_gaps_us=[round(g1 - g0, 1) for g0, g1 in gaps],
                    host_during_largest=during,
                ),
            )
        )
    return out
