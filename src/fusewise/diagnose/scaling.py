"""Memory scaling: the step at two sizes (e.g. sequence lengths), the fitted exponent of its peak
memory. ~1 is linear; ~2 means a quadratic intermediate (a lost fused-attention path).

The peak comes from the op graph, so it needs no GPU: every storage the step allocates is live
from the op that first writes it to the last op that reads it (views and in-place writes share
their storage); the peak is the largest sum of live storages over the step. Inputs and
parameters that exist before the step are left out (they do not grow with the sequence). On a
GPU the allocator's measured peak is reported beside it. Stateless:
(graph at size a, size a, graph at size b, size b[, measured peaks]) -> list[Finding];
registered as "memory-scaling", over an Observation and its `other` (the step at the first size).
"""

from __future__ import annotations

import math

from .. import fixes
from ..capture.graph import OpGraph
from ..report import Finding
from .registry import Skip, analyzer

QUADRATIC_EXPONENT = 1.6  # between linear (1) and quadratic (2), with room for constant terms


@analyzer("memory-scaling")
def analyze(obs, ceilings) -> list[Finding]:
    if obs.other is None:
        raise Skip("needs the step at two sizes: fusewise diagnose SCRIPT --sizes NAME=V1,V2")
    if _over_pair(fit, obs) is None:
        raise Skip("the recorded step allocated nothing at one of the two sizes: no exponent")
    return _over_pair(find_scaling, obs)


def fit_observations(obs) -> dict | None:
    """fit() of an observation and its `other`, or None without one (shown whatever the
    exponent; a finding only when quadratic)."""
    return _over_pair(fit, obs) if obs.other is not None else None


def _over_pair(fn, obs):
    """fn(graph_a, size_a, graph_b, size_b, name=, measured=) with a = obs.other, b = obs."""
    a, b = obs.other, obs
    peaks = (a.peak_memory_bytes, b.peak_memory_bytes)
    measured = None if None in peaks else peaks
    return fn(a.graph, a.size[1], b.graph, b.size[1], name=b.size[0], measured=measured)


def live_peak(graph: OpGraph) -> tuple[int, int | None]:
    """(peak bytes of storages made during the step, value id of the largest one live then)."""
    base = graph.view_bases()

    def storage(v: int) -> int:
        return graph.values[base.get(v, v)].obj

    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for op in graph.ops:
        for v in op.outputs:
            if op.is_view:
                continue
            s = storage(v)
            first.setdefault(s, op.index)
            last[s] = max(last.get(s, op.index), op.index)
        for v in op.inputs:
            s = storage(v)
            if s in first:
                last[s] = op.index
    delta = [0] * (len(graph.ops) + 1)
    for s, i in first.items():
        delta[i] += graph.values[s].nbytes
        delta[last[s] + 1] -= graph.values[s].nbytes
    live, peak, at = 0, 0, 0
    for i, d in enumerate(delta[:-1]):
        live += d
        if live > peak:
            peak, at = live, i
    alive = [s for s in first if first[s] <= at <= last[s]]
    largest = max(alive, key=lambda s: graph.values[s].nbytes, default=None)
    return peak, largest


def exponent(mem_a: float, size_a: float, mem_b: float, size_b: float) -> float:
    return math.log(mem_b / mem_a) / math.log(size_b / size_a)


def fit(
    graph_a: OpGraph,
    size_a: float,
    graph_b: OpGraph,
    size_b: float,
    *,
    name: str = "size",
    measured: tuple[float, float] | None = None,
) -> dict | None:
    """The fitted exponent of peak memory and what it comes from (the report shows it whatever
    its value), or None when a step allocated nothing."""
    return _fit(graph_a, size_a, graph_b, size_b, name, measured)[0]


def _fit(graph_a, size_a, graph_b, size_b, name, measured) -> tuple[dict | None, int | None]:
    """(fit's evidence, the largest storage live at graph_b's peak)."""
    peak_a, _ = live_peak(graph_a)
    peak_b, largest = live_peak(graph_b)
    if peak_a <= 0 or peak_b <= 0 or size_a == size_b:
        return None, largest
    evidence = dict(
        sizes={name: [size_a, size_b]},
        live_peak_bytes=[peak_a, peak_b],
        exponent=round(exponent(peak_a, size_a, peak_b, size_b), 3),
    )
    # a CPU step on a machine with a GPU measures no device peak (0): nothing to fit
    if measured and min(measured) > 0:
        evidence["measured_peak_bytes"] = list(measured)
        evidence["measured_exponent"] = round(exponent(measured[0], size_a, measured[1], size_b), 3)
    return evidence, largest


def find_scaling(
    graph_a: OpGraph,
    size_a: float,
    graph_b: OpGraph,
    size_b: float,
    *,
    name: str = "size",
    measured: tuple[float, float] | None = None,
) -> list[Finding]:
    evidence, largest = _fit(graph_a, size_a, graph_b, size_b, name, measured)
    if evidence is None or evidence["exponent"] < QUADRATIC_EXPONENT:
        return []
    peak_a, peak_b = evidence["live_peak_bytes"]
    k = evidence["exponent"]
    where = "?"
    if largest is not None:
        where = next((op.where for op in graph_b.ops if largest in op.outputs), "?")
    v = graph_b.values[largest] if largest is not None else None
    return [
        Finding(
            kind="quadratic-memory",
            where=where,
            est_saving_ms=0.0,
            bytes_avoidable=float(peak_b - peak_a * (size_b / size_a)),
            title=f"peak memory grows as {name}^{k:.2f} ({peak_a / 1e6:,.1f} MB at {size_a:g}, "
            f"{peak_b / 1e6:,.1f} MB at {size_b:g})"
            + (f"; the largest live tensor is {list(v.shape)}" if v else ""),
            fix=fixes.text("quadratic-memory"),
            evidence=evidence,
        )
    ]
