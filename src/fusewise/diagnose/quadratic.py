"""Quadratic intermediates from the op graph alone: an [.., S, S] tensor made by a matmul,
softmax or mask is attention materialised in full, so memory grows with the square of the
sequence length. Stateless: (OpGraph) -> list[Finding]."""

from __future__ import annotations

from .. import fixes
from ..capture.graph import OpGraph
from ..report import Finding
from . import thresholds as T
from .registry import analyzer

# Only ops that make scores or probabilities: an elementwise op on a [B, S, d] activation would
# match when d == S (seen on the H200 demo: d_model = seq = 1024 flagged the embedding add).
_MAKERS = (
    "aten.bmm",
    "aten.mm",
    "aten.baddbmm",
    "aten._softmax",
    "aten.softmax",
    "aten.masked_fill",
)


@analyzer("quadratic-intermediates")
def analyze(obs, ceilings) -> list[Finding]:
    return find_quadratic(obs.graph)


def find_quadratic(graph: OpGraph) -> list[Finding]:
    # one finding per shape, named by the first line that made it (the scores); the lines that
    # then mask and softmax the same [S, S] tensor are the same problem
    worst: dict[str, tuple[int, tuple]] = {}
    shapes_seen: set[tuple] = set()
    for op in graph.ops:
        if op.phase != "forward" or not op.name.startswith(_MAKERS):
            continue
        for vid in op.outputs:
            v = graph.values[vid]
            if (
                len(v.shape) >= 3
                and v.shape[-1] == v.shape[-2] >= T.QUADRATIC_MIN_SEQ
                and v.nbytes >= T.QUADRATIC_MIN_BYTES
                and (v.shape[-1], v.nbytes) not in shapes_seen
            ):
                # bmm sees [B*H, S, S] where softmax sees [B, H, S, S]: the same tensor
                shapes_seen.add((v.shape[-1], v.nbytes))
                worst[op.where] = (v.nbytes, v.shape)
    return [
        Finding(
            kind="quadratic-memory",
            where=where,
            est_saving_ms=0.0,
            bytes_avoidable=float(nbytes),
            title=f"a {list(shape)} tensor ({nbytes / 1e6:,.1f} MB) grows with the square of the "
            f"sequence length ({shape[-1]})",
            fix=fixes.text("quadratic-memory"),
            evidence=dict(shape=list(shape), bytes=nbytes),
        )
        for where, (nbytes, shape) in sorted(worst.items(), key=lambda kv: -kv[1][0])
    ]
