"""Fusion chains: connected producer -> consumer runs of memory-bound ops whose traffic as written
is well above what one fused kernel needs (external inputs read once, external outputs written
once). The seed's signature: several ops in sequence, an intermediate larger than the endpoints,
few FLOPs per byte.

A chain never spans a compute-bound op (matmul) on a path between two of its members: every op
gets a depth, the number of compute ops on its longest path from the step's inputs, and only ops
of equal depth join (a fused kernel cannot run across a matmul that sits between its parts, as
attention sits between a block's LayerNorm and its residual add). A matmul may still open or
close a chain (attention scores, logits before a loss) when the tensor it shares with the chain
is much larger than its other operands; a chain whose avoidable traffic is small next to the time
its matmuls need (a feed-forward block) is not reported.

Stateless: (OpGraph, Ceilings) -> list[Finding]; registered as "fusion-chains".
"""

from __future__ import annotations

from collections import defaultdict

from .. import fixes
from ..capture.graph import OpGraph, OpRecord
from ..report import Finding
from . import _measured, _patterns
from . import thresholds as T
from ._measured import MATMULS
from .registry import analyzer

# bookkeeping ops that move no activation data worth fusing
_IGNORED = (
    "aten._local_scalar_dense",
    "aten.detach",
    "aten.lift_fresh",
    "aten.ones_like",
    "aten.zeros_like",
    "aten.empty",
    "aten.zeros",
    "aten.ones",
    "aten.full",
    "aten.scalar_tensor",
)


@analyzer("fusion-chains")
def analyze(obs, ceilings) -> list[Finding]:
    return find_chains(obs.graph, ceilings, _measured.timing(obs))


def _kind(op: OpRecord, ridge: float) -> str:
    if op.is_view or op.name.startswith(_IGNORED) or op.bytes == 0:
        return "skip"
    if op.name in MATMULS:
        return "matmul"
    return "membound" if op.intensity < ridge else "skip"


class _Graph:
    """Producer/consumer maps with views made transparent (a view's value is its base's)."""

    def __init__(self, g: OpGraph):
        self.g = g
        self.base = g.view_bases()
        # the last value of each tensor object: state updated in place (optimizer moments,
        # parameters) persists after the step, so its last write is an output of any chain
        self.last_of_obj: dict[int, int] = {}
        for v in g.values.values():
            self.last_of_obj[v.obj] = max(v.vid, self.last_of_obj.get(v.obj, -1))
        self.segment = _segments(g)
        self.producer: dict[int, int] = {}
        self.consumers: dict[int, set[int]] = defaultdict(set)
        for op in g.ops:
            if op.is_view:
                continue
            for v in op.outputs:
                self.producer[self.resolve(v)] = op.index
            for v in op.inputs:
                self.consumers[self.resolve(v)].add(op.index)

    def resolve(self, v: int) -> int:
        return self.base.get(v, v)

    def nbytes(self, v: int) -> int:
        return self.g.values[v].nbytes


def _segments(g: OpGraph) -> list[int]:
    """Each op's segment: its run of one phase in execution order. The forward before the
    backward and the ops after the optimizer step (labelled forward too) are two segments, as
    are the micro-batches of gradient accumulation; a view takes the segment it is in."""
    seg, current, phase = [0] * len(g.ops), 0, None
    for op in g.ops:
        if not op.is_view and op.phase != phase:
            current += phase is not None
            phase = op.phase
        seg[op.index] = current
    return seg


def _depths(gr: _Graph, kinds: dict[int, str]) -> list[int]:
    """Compute ops (anything not memory-bound) on the longest path to each op within its
    segment. A value made in another segment counts from 0: chains never cross segments, and
    the matmuls behind a gradient must not part an optimizer's update of a parameter
    (`p.mul_(1 - lr*wd)`, nothing computed before it in the optimizer) from the update that
    reads the gradient."""
    depth = [0] * len(gr.g.ops)
    seg = gr.segment
    for op in gr.g.ops:  # execution order is a topological order
        d = 0
        for v in op.inputs:
            p = gr.producer.get(gr.resolve(v))
            if p is not None and p != op.index and seg[p] == seg[op.index]:
                d = max(d, depth[p] + (kinds[p] != "membound" and not gr.g.ops[p].is_view))
        depth[op.index] = d
    return depth


def _components(gr: _Graph, kinds: dict[int, str]) -> list[set[int]]:
    """Union-find over memory-bound ops joined by a produced/consumed value, same segment and
    depth."""
    parent = {i: i for i, k in kinds.items() if k == "membound"}
    depth = _depths(gr, kinds)

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in parent:
        op = gr.g.ops[i]
        for v in op.inputs:
            p = gr.producer.get(gr.resolve(v))
            if p in parent and gr.segment[p] == gr.segment[i] and depth[p] == depth[i]:
                parent[find(p)] = find(i)
    groups: dict[int, set[int]] = defaultdict(set)
    for i in parent:
        groups[find(i)].add(i)
    return list(groups.values())


def _attach_matmuls(gr: _Graph, comp: set[int], kinds: dict[int, str]) -> set[int]:
    """Add a matmul that opens or closes the chain through a tensor much larger than its other
    operands (attention scores, logits); a feed-forward matmul stays out."""
    out = set(comp)
    for i in comp:
        op = gr.g.ops[i]
        links = [(gr.producer.get(gr.resolve(v)), gr.resolve(v)) for v in op.inputs]
        links += [(c, gr.resolve(v)) for v in op.outputs for c in gr.consumers[gr.resolve(v)]]
        for j, v in links:
            if j is None or kinds.get(j) != "matmul" or gr.segment[j] != gr.segment[i]:
                continue
            others = sum(
                gr.nbytes(gr.resolve(u))
                for u in gr.g.ops[j].inputs + gr.g.ops[j].outputs
                if gr.resolve(u) != v
            )
            if gr.nbytes(v) >= T.MATMUL_JOIN_RATIO * max(others, 1):
                out.add(j)
    return out


def chain_cost(gr: _Graph, chain: set[int]) -> tuple[float, float, int | None]:
    """(bytes as written, fused minimum, largest internal value or None). Among equally large
    intermediates the one made by the line that writes most of the chain's bytes is named."""
    written = sum(gr.g.ops[i].bytes for i in chain)
    line_bytes: dict[str, float] = defaultdict(float)
    for i in chain:
        line_bytes[gr.g.ops[i].where] += gr.g.ops[i].bytes
    produced = {gr.resolve(v) for i in chain for v in gr.g.ops[i].outputs}
    read = {gr.resolve(v) for i in chain for v in gr.g.ops[i].inputs}
    ext_in = read - produced
    values = gr.g.values
    # an output: read after the chain, or the last write to a tensor the chain did not create
    ext_out = {
        v
        for v in produced
        if not gr.consumers[v]
        or gr.consumers[v] - chain
        or (
            values[v].obj != v
            and values[v].obj not in produced
            and gr.last_of_obj[values[v].obj] == v
        )
    }
    internal = produced - ext_out
    minimum = sum(gr.nbytes(v) for v in ext_in | ext_out)
    largest = max(
        internal,
        default=None,
        key=lambda v: (gr.nbytes(v), line_bytes[gr.g.ops[gr.producer[v]].where]),
    )
    return written, minimum, largest


def find_chains(graph: OpGraph, ceilings, timing: _measured.Timing | None = None) -> list[Finding]:
    """One finding per (pattern, source line), chains of the same line summed (an optimizer
    loop makes one chain per parameter), sorted by predicted saving. ceilings: a
    hardware.Ceilings (bandwidth_GBps, matmul_TFLOPs, ridge). timing: how the graph's measured
    op times map onto the plain step (_measured.timing); with it the saving is predicted from
    the measured times of the ops a fused kernel removes, without it from bytes alone."""
    bandwidth_GBps = ceilings.bandwidth_GBps
    gr = _Graph(graph)
    kinds = {op.index: _kind(op, ceilings.ridge) for op in graph.ops}
    # the forward ops of a scaled_dot_product_attention call run on torch's math path are the
    # attention-fallback finding's (fixed by a fused backend): not a chain's as well
    for call in graph.attention:
        if call.get("kernel") is None:
            for i in range(*call["ops"]):
                kinds[i] = "skip"
    merged: dict[tuple[str, str, str], dict] = {}
    for comp in _components(gr, kinds):
        chain = _attach_matmuls(gr, comp, kinds)
        if len(chain) < 2:
            continue
        written, minimum, largest = chain_cost(gr, chain)
        matmuls = [graph.ops[i] for i in chain if kinds[i] == "matmul"]
        bytes_saving_ms = (written - minimum) / (bandwidth_GBps * 1e6)
        ops = [graph.ops[i] for i in sorted(chain)]
        pattern = _patterns.pattern(ops, graph, gr.base, gr.producer)
        if timing is not None:
            # the fused kernel keeps the matmuls' FLOPs: only the memory-bound ops go; a fused
            # attention kernel does the scores' matmuls itself, so they go too and it pays
            # their FLOPs (measured on the H200 demo: the SDPA fix saved 9.8 ms where the
            # memory-bound ops alone predicted 6.7; its bmms took 2.0 ms)
            absorbed = matmuls if pattern == "attention" else []
            removed = [graph.ops[i] for i in chain if kinds[i] == "membound"] + absorbed
            efficiency = T.FUSED_KERNEL_EFFICIENCY_BY_PATTERN.get(
                pattern, T.FUSED_KERNEL_EFFICIENCY
            )
            compute_ms = sum(op.flops for op in absorbed) / (
                ceilings.matmul_TFLOPs * 1e9 * T.ATTENTION_KERNEL_MATMUL_SHARE
            )
            measured = _measured.saving(
                removed, minimum, bandwidth_GBps, timing, efficiency, compute_ms
            )
            kept = [] if absorbed else matmuls
            saving_ms, matmul_ms = measured.ms, sum(timing.op_ms(op) for op in kept)
        else:
            measured, saving_ms = None, bytes_saving_ms
            matmul_ms = sum(op.flops for op in matmuls) / (ceilings.matmul_TFLOPs * 1e9)
        if bytes_saving_ms <= 0 or saving_ms < T.CHAIN_MIN_SHARE_OF_MATMUL * matmul_ms:
            continue  # nothing to save, or the matmuls dominate (a feed-forward block)
        where_op = (
            graph.ops[gr.producer[largest]]
            if largest is not None
            else max(ops, key=lambda o: o.bytes)
        )
        key = (pattern, where_op.where, ops[0].phase)
        # on the clock of the prediction (the scaled times), so the two columns compare
        one = dict(
            written=written,
            minimum=minimum,
            chains=1,
            ops=len(ops),
            largest=gr.nbytes(largest) if largest is not None else 0,
            names={op.name.split(".")[1] for op in ops},
            ms=sum(timing.op_ms(op) if timing else op.ms for op in ops),
            saving_ms=saving_ms,
            parts=[measured] if measured is not None else [],
        )
        _add(merged, key, one)
    # a backward chain takes the pattern of the forward chain made by the same line (backward ops
    # of a norm are muls and sums; their line says what they are the gradient of)
    forward_pattern = {w: p for (p, w, ph) in merged if ph == "forward" and p != "other"}
    inherited: dict[tuple[str, str, str], dict] = {}
    for (pattern, where, phase), m in merged.items():
        if phase == "backward" and pattern in ("other", "elementwise"):
            pattern = forward_pattern.get(where, pattern)
        # chains of one line that differ only before the inheritance make one finding
        _add(inherited, (pattern, where, phase), m)
    findings = []
    for (pattern, where, phase), m in inherited.items():
        avoidable = m["written"] - m["minimum"]
        if (
            avoidable < T.CHAIN_MIN_AVOIDABLE_BYTES
            or m["written"] < T.CHAIN_MIN_RATIO * m["minimum"]
            or (timing is not None and m["saving_ms"] <= 0)  # measured: nothing to gain
        ):
            continue
        replayed_ms = _measured.replayed(m["parts"], timing)
        findings.append(
            Finding(
                kind="fusion-chain",
                pattern=pattern,
                where=where,
                title=f"{pattern} chain in the {phase}: {m['ops']} ops move "
                f"{m['written'] / 1e6:,.1f} MB where a fused kernel needs "
                f"{m['minimum'] / 1e6:,.1f} MB",
                est_saving_ms=m["saving_ms"] if replayed_ms is None else replayed_ms,
                bytes_avoidable=avoidable,
                fix=fixes.text("fusion-chain", pattern),
                evidence=dict(
                    phase=phase,
                    chains=m["chains"],
                    ops=m["ops"],
                    bytes_as_written=m["written"],
                    bytes_fused_minimum=m["minimum"],
                    largest_intermediate_bytes=m["largest"],
                    op_names=sorted(m["names"]),
                    # the check on the prediction: what the unfused ops take in the step (the
                    # recorded times, scaled as the prediction's), and the fused kernel's floor
                    measured_ms_unfused=m["ms"],
                    fused_floor_ms=m["minimum"] / (bandwidth_GBps * 1e9) * 1e3,
                    **_estimate(
                        m["parts"], timing, avoidable / (bandwidth_GBps * 1e6), replayed_ms
                    ),
                ),
            )
        )
    return sorted(findings, key=lambda f: -f.est_saving_ms)


def _add(merged: dict, key: tuple[str, str, str], part: dict) -> None:
    """Sum one chain's (or one merged group's) numbers into merged[key]."""
    m = merged.get(key)
    if m is None:
        merged[key] = dict(part, names=set(part["names"]), parts=list(part["parts"]))
        return
    for k in ("written", "minimum", "chains", "ops", "ms", "saving_ms"):
        m[k] += part[k]
    m["largest"] = max(m["largest"], part["largest"])
    m["names"] |= part["names"]
    m["parts"] += part["parts"]


def _estimate(parts: list, timing, bytes_ms: float, replayed_ms: float | None = None) -> dict:
    """How the saving was predicted, for the evidence: the step replayed without the removed
    ops where there is a trace, else the sums of the measured parts, or the byte model when the
    graph held no measured times. The parts' sums are shown in every measured case."""
    if timing is None:
        return dict(estimate="byte model: avoidable bytes at the copy ceiling (no op times)")
    total = {
        k: sum(getattr(p, k) for p in parts)
        for k in ("removed_ms", "launch_gap_ms", "fused_ms", "removed_ops")
    }
    out = dict(
        estimate=f"measured: removed ops' time + their launch gaps - fused kernel "
        f"({timing.source}, times x{timing.scale:.2f})",
        removed_ops=total["removed_ops"],
        removed_ops_ms=round(total["removed_ms"], 4),
        launch_gaps_ms=round(total["launch_gap_ms"], 4),
        fused_kernel_ms=round(total["fused_ms"], 4),
        byte_model_ms=round(bytes_ms, 4),
    )
    if replayed_ms is not None:
        out.update(
            _measured.replay_evidence(
                timing, total["removed_ms"] + total["launch_gap_ms"] - total["fused_ms"]
            )
        )
    return out
