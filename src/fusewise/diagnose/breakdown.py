"""Breakdown and roofline: time per aten op (from the profiler), FLOPs and bytes per op (from the
op graph), intensity against the ridge point, the bound, and % of that ceiling reached.
Stateless: (op times, OpGraph, Ceilings, step ms, n) -> list[TopOp]. Not an analyzer: the
driver puts its rows in the report.

The join: op_ms is keyed by the profiler's op name ("aten::mm"); the graph's ops are grouped by
that name and, for tensor-core ops (matmuls, attention kernels), by the dtype they computed in,
since an fp32 matmul without TF32 and a bf16 one have ceilings some 15x apart. A name's profiled
time is shared among its dtype groups in proportion to their measured time in the recorded step
(their FLOPs when the recording has no times). Views and metadata ops (aten::t, aten::view,
aten::empty, ...) are not kernels: they are left out of the rows, and they take none of the time.
"""

from __future__ import annotations

from collections import defaultdict

from ..capture.graph import OpGraph
from ..report import TopOp
from ._matmuls import compute_key, input_dtype, is_kernel
from ._measured import profiler_name


class _Group:
    def __init__(self):
        self.flops = self.bytes = self.recorded_ms = 0.0
        self.dtype = None


def _groups(graph: OpGraph, settings: dict | None) -> dict[str, dict[str | None, _Group]]:
    """profiler name -> rate key (None: not a tensor-core op) -> the kernels' totals."""
    out: dict[str, dict[str | None, _Group]] = defaultdict(lambda: defaultdict(_Group))
    for op in graph.ops:
        if not is_kernel(op) or (op.bytes == 0 and op.flops == 0):
            continue  # moves nothing: no row, no share of the name's time
        key = compute_key(op, graph, settings)
        g = out[profiler_name(op.name)][key]
        g.flops += op.flops
        g.bytes += op.bytes
        g.recorded_ms += op.ms
        if key is not None:
            g.dtype = input_dtype(op, graph)
    return out


def _shares(groups: dict[str | None, _Group]) -> dict[str | None, float]:
    """Each group's share of its name's time: by recorded time, else by FLOPs, else equal."""
    for weight in (lambda g: g.recorded_ms, lambda g: g.flops):
        total = sum(weight(g) for g in groups.values())
        if total > 0:
            return {k: weight(g) / total for k, g in groups.items()}
    return {k: 1.0 / len(groups) for k in groups}


def top_ops(
    op_ms: dict[str, float],
    graph: OpGraph,
    ceilings,
    step_ms: float,
    n: int = 10,
    *,
    matmul_settings: dict | None = None,
) -> list[TopOp]:
    """op_ms: profiler name -> ms per step. Rows for the n most expensive kernels of the graph,
    a tensor-core op judged against its dtype's matmul rate (matmul_settings: whether fp32
    matmuls ran as TF32, hardware.matmul_settings)."""
    groups = _groups(graph, matmul_settings)
    rows = []
    for name, ms_total in op_ms.items():
        if name not in groups or ms_total <= 0:
            continue
        for key, share in _shares(groups[name]).items():
            ms = ms_total * share
            if ms > 0:
                rows.append(_row(name, ms, groups[name][key], key, ceilings, step_ms))
    rows.sort(key=lambda r: (-r.ms_per_step, r.name, r.ceiling))
    return rows[:n]


def _row(name: str, ms: float, g: _Group, key: str | None, ceilings, step_ms: float) -> TopOp:
    rate = ceilings.rate(key) if key is not None else None
    label = key if rate is not None else "matmul"  # "matmul": the headline rate, no rate of its own
    rate = rate or ceilings.matmul_TFLOPs
    intensity = g.flops / g.bytes if g.bytes else float("inf")
    bound = "memory" if intensity < ceilings.ridge_for(rate) else "compute"
    if bound == "memory":
        achieved, label = g.bytes / (ms * 1e-3) / 1e9 / ceilings.bandwidth_GBps, "bandwidth"
    else:
        achieved = g.flops / (ms * 1e-3) / 1e12 / rate
    return TopOp(
        name=name,
        ms_per_step=ms,
        share=ms / step_ms if step_ms else 0.0,
        flops=g.flops,
        bytes=g.bytes,
        intensity=intensity,
        bound=bound,
        pct_of_ceiling=100.0 * achieved,
        dtype=g.dtype,
        ceiling=label,
    )
