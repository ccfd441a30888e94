"""Which ops make the host wait for the GPU, by their nature: shared by the host-sync analyzer
(syncs.py), which names them, and the replay (_replay.py via _measured.replay_of), which makes
the replayed host wait there even when the profiler recorded no sync call inside the op."""

from __future__ import annotations

from ..capture.graph import OpGraph

SYNCING = {
    "aten._local_scalar_dense": ".item() / bool() / float() / int() of a GPU tensor",
    "aten.is_nonzero": "bool() of a GPU tensor (an `if tensor:`)",
    "aten.nonzero": "nonzero (output size depends on the data)",
    "aten.masked_select": "masked_select (output size depends on the data)",
    "aten._unique2": "unique (output size depends on the data)",
    "aten.unique_consecutive": "unique_consecutive (output size depends on the data)",
}


def sync_reason(graph: OpGraph, op) -> str | None:
    """Why `op` waits for the GPU, or None when it does not (no GPU input, or not a syncing op)."""
    base = ".".join(op.name.split(".")[:2])
    on_gpu = [graph.values[v].device == "cuda" for v in op.inputs]
    if not any(on_gpu):
        return None
    if base in SYNCING:
        return SYNCING[base]
    if base in ("aten._to_copy", "aten.copy_") and any(
        graph.values[v].device == "cpu" for v in op.outputs
    ):
        return "a copy to the CPU (.cpu(), .tolist(), .numpy(): blocking unless non_blocking)"
    return None
