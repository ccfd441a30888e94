"""Breakdown and roofline: time per aten op (from the profiler), FLOPs and bytes per op (from the
op graph), intensity against the ridge point, the bound, and % of that ceiling reached.
Stateless: (op times, OpGraph, Ceilings, step ms, n) -> list[TopOp]. Not an analyzer: the
driver puts its rows in the report."""

from __future__ import annotations

from collections import defaultdict

from ..capture.graph import OpGraph
from ..report import TopOp
from ._measured import profiler_name


def top_ops(
    op_ms: dict[str, float], graph: OpGraph, ceilings, step_ms: float, n: int = 10
) -> list[TopOp]:
    """op_ms: profiler name -> ms per step. Rows for the n most expensive ops of the graph."""
    flops: dict[str, float] = defaultdict(float)
    nbytes: dict[str, float] = defaultdict(float)
    for op in graph.ops:
        key = profiler_name(op.name)
        flops[key] += op.flops
        nbytes[key] += op.bytes
    rows = []
    for name, ms in sorted(op_ms.items(), key=lambda kv: -kv[1]):
        if name not in nbytes or ms <= 0:
            continue
        f, b = flops[name], nbytes[name]
        intensity = f / b if b else float("inf")
        bound = "memory" if intensity < ceilings.ridge else "compute"
        achieved = (
            b / (ms * 1e-3) / 1e9 / ceilings.bandwidth_GBps
            if bound == "memory"
            else f / (ms * 1e-3) / 1e12 / ceilings.matmul_TFLOPs
        )
        rows.append(
            TopOp(
                name=name,
                ms_per_step=ms,
                share=ms / step_ms if step_ms else 0.0,
                flops=f,
                bytes=b,
                intensity=intensity,
                bound=bound,
                pct_of_ceiling=100.0 * achieved,
            )
        )
        if len(rows) == n:
            break
    return rows
