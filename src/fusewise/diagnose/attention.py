"""attention-fallback: a scaled_dot_product_attention call that torch ran on its math path (the
scores and probabilities written out, [.., S, S] in memory) instead of a fused kernel.
Stateless: (OpGraph, Ceilings) -> list[Finding].

The recorder notes each call and the aten op that ran it; no fused op (flash, memory-efficient,
cuDNN) means the math path. The arguments that commonly cause it are listed; torch gives its
exact reason when a fused backend is forced (the fix says how).
"""

from __future__ import annotations

from ..capture.opgraph import OpGraph
from .findings import Finding


def _suspects(call: dict) -> list[str]:
    out = []
    if call["dtype"] not in ("float16", "bfloat16"):
        out.append(f"{call['dtype']} inputs (flash needs fp16/bf16)")
    if call["mask"] is not None:
        out.append(f"an explicit attn_mask ({call['mask']}; flash takes none: use is_causal=True "
                   "for a causal mask)")  # fmt: skip
    head_dim = call["shape"][-1] if call["shape"] else 0
    if head_dim % 8 or head_dim > 256:
        out.append(f"head dim {head_dim} (fused kernels want a multiple of 8, at most 256)")
    if call["dropout"]:
        out.append(f"dropout_p={call['dropout']}")
    return out


def find_attention_fallback(graph: OpGraph, ceil) -> list[Finding]:
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
        suspects = _suspects(calls[0])
        findings.append(Finding(
            kind="attention-fallback", where=where,
            est_saving_ms=avoidable / (ceil.bandwidth_GBps * 1e6), bytes_avoidable=avoidable,
            title=f"scaled_dot_product_attention ran torch's math path ({len(calls)} call(s) per "
                  f"step): scores and probabilities written out"
                  + (f"; likely because of {', '.join(suspects)}" if suspects else ""),
            fix="make a fused backend possible (bf16/fp16, is_causal=True instead of a mask, head "
                "dim a multiple of 8); run once under torch.nn.attention.sdpa_kernel("
                "SDPBackend.FLASH_ATTENTION) to have torch say why it refuses",
            evidence=dict(calls_per_step=len(calls), shape=calls[0]["shape"],
                          dtype=calls[0]["dtype"], mask=calls[0]["mask"],
                          bytes_as_written=written, fused_minimum_bytes=minimum,
                          measured_ms=sum(op.ms for op in ops))))  # fmt: skip
    return findings


def _itemsize(dtype: str) -> int:
    return {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 4)
