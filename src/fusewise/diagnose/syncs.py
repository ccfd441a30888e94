"""Host-device syncs from the op graph: ops that make the host wait for the GPU to drain its
queue (a value read back: .item(), bool(t), float(t); a data-dependent shape: nonzero,
masked_select, unique; a blocking copy to the CPU). Each is named with its line and counted per
step. How long the GPU then sits idle comes from the timeline on a GPU (the gaps that end a
host wait, diagnose/_gaps.py), shared among the lines by their syncs per step; a sync the op
graph did not see (torch.cuda.synchronize(), a blocking copy outside aten) becomes its own
finding. From the op graph alone (a CPU step) the saving is 0 and the evidence says so.
Stateless: (OpGraph, Timeline | None, step ms) -> list[Finding]; registered as "host-syncs".
"""

from __future__ import annotations

import dataclasses

from .. import fixes
from ..capture.graph import OpGraph
from ..capture.timeline import Timeline
from ..report import Finding
from . import _gaps, _measured
from . import thresholds as T
from .registry import analyzer

_SYNCING = {
    "aten._local_scalar_dense": ".item() / bool() / float() / int() of a GPU tensor",
    "aten.is_nonzero": "bool() of a GPU tensor (an `if tensor:`)",
    "aten.nonzero": "nonzero (output size depends on the data)",
    "aten.masked_select": "masked_select (output size depends on the data)",
    "aten._unique2": "unique (output size depends on the data)",
    "aten.unique_consecutive": "unique_consecutive (output size depends on the data)",
}


@analyzer("host-syncs")
def analyze(obs, ceilings) -> list[Finding]:
    syncs = find_syncs(obs.graph)
    if obs.timeline is None:
        return syncs
    return replay_sync_savings(share_sync_idle(syncs, obs.timeline, obs.median_ms), obs)


def replay_sync_savings(found: list[Finding], obs) -> list[Finding]:
    """Each line's saving replayed (diagnose/_replay.py): the step without its syncs' waits,
    so host work after a sync that the device's queue would cover counts, and a wait the host
    had reached late anyway does not. The shared idle stays in the evidence."""
    replay = _measured.replay_of(obs)
    if replay is None:
        return found
    out = []
    for f in found:
        ops = [op.index for op in obs.graph.ops if op.where == f.where and _reason(obs.graph, op)]
        if not ops or not replay.covers(ops):
            out.append(f)
            continue
        ms = max(0.0, replay.saving_ms(unsynced=ops))
        ev = dict(f.evidence, shared_idle_ms=round(f.est_saving_ms, 4), **replay.evidence())
        ev["estimate"] = "replayed: the recorded step without these syncs' waits"
        out.append(dataclasses.replace(f, est_saving_ms=ms, evidence=ev))
    return out


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
            fix=fixes.text("host-sync"),
            evidence=dict(
                syncs_per_step=e["count"],
                phase=e["phase"],
                idle_time="not measured: needs a GPU timeline",
            ),
        )
        for where, e in sorted(by_line.items(), key=lambda kv: -kv[1]["count"])
    ]


def share_sync_idle(
    syncs: list[Finding], tl: Timeline, step_ms: float | None = None
) -> list[Finding]:
    """`syncs` with the measured post-sync idle shared among their lines by syncs per step; a
    sync the op graph did not see becomes its own finding."""
    found = _gaps.idle(tl, step_ms)
    idle_ms, common = found.per_step_ms.get("host-sync", 0.0), found.evidence
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
                fix=fixes.text("host-sync", "explicit-sync"),
                evidence=dict(common, sync_calls_per_step=len(tl.syncs) / tl.steps),
            )
        )
    return out
