"""attention-fallback: a scaled_dot_product_attention call that torch ran on its math path (the
scores and probabilities written out, [.., S, S] in memory) instead of a fused kernel.
Stateless: (OpGraph, Ceilings) -> list[Finding]; registered as "attention-fallback".

The recorder notes each call and the aten op that ran it; no fused op (flash, memory-efficient,
cuDNN) means the math path. The arguments that commonly cause it are listed; torch gives its
exact reason when a fused backend is forced (the fix says how).
"""

from __future__ import annotations

from .. import fixes
from ..capture.graph import OpGraph
from ..report import Finding
from . import _measured
from .registry import analyzer


def _suspects(call: dict) -> list[tuple[str, str]]:
    """(likely cause, what to do) for the arguments that keep torch's fused kernels away. Only
    causes that hold for the call's device: fp32 is no cause (the memory-efficient kernel on a
    GPU and the CPU's flash kernel take it), dropout is one on the CPU only."""
    out = []
    if call["dtype"] not in ("float16", "bfloat16", "float32"):
        out.append((f"{call['dtype']} inputs", "fp16/bf16 (or fp32) inputs"))
    if call["mask"] is not None:
        causal = "" if call.get("is_causal") else " (is_causal=True for a causal one)"
        remedy = f"no attn_mask{causal}"
        out.append((f"an explicit attn_mask ({call['mask']}; the flash kernel takes none)", remedy))
    head_dim = call["shape"][-1] if call["shape"] else 0
    if head_dim % 8 or head_dim > 256:
        out.append(
            (
                f"head dim {head_dim} (fused kernels want a multiple of 8, at most 256)",
                "a head dim that is a multiple of 8",
            )
        )
    if call["dropout"] and call.get("device") == "cpu":
        out.append(
            (
                f"dropout_p={call['dropout']} (the CPU's fused kernel takes none)",
                "dropout_p=0 on the CPU",
            )
        )
    return out


@analyzer("attention-fallback")
def analyze(obs, ceilings) -> list[Finding]:
    return find_attention_fallback(obs.graph, ceilings, _measured.timing(obs))


def find_attention_fallback(graph: OpGraph, ceil, timing=None) -> list[Finding]:
    """One finding per line whose calls ran the math path. timing (_measured.timing): predict
    the saving from the measured times of the math path's memory-bound ops (a fused kernel
    still does the matmuls' FLOPs); without it, from bytes alone."""
    by_line: dict[str, list[dict]] = {}
    for call in graph.attention:
        if call["kernel"] is None:
            by_line.setdefault(call["where"], []).append(call)
    findings = []
    for where, calls in by_line.items():
        ops = [op for c in calls for op in graph.ops[c["ops"][0] : c["ops"][1]] if not op.is_view]
        written = sum(op.bytes for op in ops)
        # a fused kernel reads q, k, v and writes the output: 4 tensors of q's size
        n = 1
        for s in calls[0]["shape"]:
            n *= s
        minimum = 4 * n * _itemsize(calls[0]["dtype"]) * len(calls)
        avoidable = max(0.0, written - minimum)
        saving_ms = avoidable / (ceil.bandwidth_GBps * 1e6)
        estimate = {"estimate": "byte model: avoidable bytes at the copy ceiling (no op times)"}
        if timing is not None:
            removed = [op for op in ops if op.name not in _measured.MATMULS and op.bytes > 0]
            s = _measured.saving(removed, minimum, ceil.bandwidth_GBps, timing)
            saving_ms = s.ms
            estimate = dict(
                estimate=f"measured: removed ops' time + their launch gaps - fused kernel "
                f"({timing.source}, times x{timing.scale:.2f})",
                removed_ops_ms=round(s.removed_ms, 4),
                launch_gaps_ms=round(s.launch_gap_ms, 4),
                fused_kernel_ms=round(s.fused_ms, 4),
            )
            replayed_ms = _measured.replayed([s], timing, launches=len(calls))
            if replayed_ms is not None:
                saving_ms = replayed_ms
                estimate.update(_measured.replay_evidence(timing, s.ms))
        suspects = _suspects(calls[0])
        findings.append(
            Finding(
                kind="attention-fallback",
                where=where,
                est_saving_ms=saving_ms,
                bytes_avoidable=avoidable,
                title=f"scaled_dot_product_attention ran torch's math path ({len(calls)} "
                f"call(s) per step): scores and probabilities written out"
                + (f"; likely because of {', '.join(c for c, _ in suspects)}" if suspects else ""),
                # what this call needs first, then the way to have torch say why
                fix="; ".join([*(r for _, r in suspects), fixes.text("attention-fallback")]),
                evidence=dict(
                    calls_per_step=len(calls),
                    shape=calls[0]["shape"],
                    dtype=calls[0]["dtype"],
                    mask=calls[0]["mask"],
                    bytes_as_written=written,
                    fused_minimum_bytes=minimum,
                    measured_ms=sum(timing.op_ms(op) if timing else op.ms for op in ops),
                    **estimate,
                ),
            )
        )
    return findings


def _itemsize(dtype: str) -> int:
    return {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 4)
