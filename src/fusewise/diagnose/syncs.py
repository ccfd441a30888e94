"""Host-device syncs from the op graph: ops that make the host wait for the GPU to drain its
queue (a value read back: .item(), bool(t), float(t); a data-dependent shape: nonzero,
masked_select, unique; a blocking copy to the CPU). Each is named with its line and counted per
step. How long the GPU then sits idle comes from the timeline (timeline.find_gaps fills in
est_saving_ms on a GPU); from the op graph alone it is 0 and the evidence says so.
Stateless: (OpGraph) -> list[Finding].
"""

from __future__ import annotations

from ..capture.opgraph import OpGraph
from .findings import Finding

_SYNCING = {
    "aten._local_scalar_dense": ".item() / bool() / float() / int() of a GPU tensor",
    "aten.is_nonzero": "bool() of a GPU tensor (an `if tensor:`)",
    "aten.nonzero": "nonzero (output size depends on the data)",
    "aten.masked_select": "masked_select (output size depends on the data)",
    "aten._unique2": "unique (output size depends on the data)",
    "aten.unique_consecutive": "unique_consecutive (output size depends on the data)",
}


def _reason(graph: OpGraph, op) -> str | None:
    base = ".".join(op.name.split(".")[:2])
    on_gpu = [graph.values[v].device == "cuda" for v in op.inputs]
    if not any(on_gpu):
        return None
    if base in _SYNCING:
        return _SYNCING[base]
    if base in ("aten._to_copy", "aten.copy_") and any(
        graph.values[v].device == "cpu" for v in op.outputs
    ):
        return "a copy to the CPU (.cpu(), .tolist(), .numpy(): blocking unless non_blocking)"
    return None


def find_syncs(graph: OpGraph) -> list[Finding]:
    by_line: dict[str, dict] = {}
    for op in graph.ops:
        why = _reason(graph, op)
        if why is None:
            continue
        entry = by_line.setdefault(op.where, {"count": 0, "reasons": set(), "phase": op.phase})
        entry["count"] += 1
        entry["reasons"].add(why)
    return [
        Finding(
            kind="host-sync",
            where=where,
            est_saving_ms=0.0,
            bytes_avoidable=0.0,
            title=f"{e['count']} host-device sync(s) per step: " + "; ".join(sorted(e["reasons"])),
            fix="keep the value on the GPU (log it every N steps, accumulate with torch ops, "
            "use torch.where instead of `if`), or copy with non_blocking=True into pinned memory",
            evidence=dict(
                syncs_per_step=e["count"],
                phase=e["phase"],
                idle_time="not measured: needs a GPU timeline",
            ),
        )
        for where, e in sorted(by_line.items(), key=lambda kv: -kv[1]["count"])
    ]
