"""What the breakdown and the matmul analyzer share about a recorded matmul: which ops are
matmuls, their operand shapes, the dtype they computed in (the rate key of hardware/matmul.py,
TF32 when fp32 and allowed) and which ops are not kernels at all. Not an analyzer itself."""

from __future__ import annotations

from ..capture.graph import OpGraph, OpRecord
from ..hardware import rate_key, tf32_allowed

# [.., m, k] @ [.., k, n]: the operands are the last two inputs (addmm/baddbmm's bias first)
MATMULS = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.")
# compute-bound ops judged against their dtype's matmul rate too (tensor-core kernels)
TENSOR_CORE = MATMULS + (
    "aten._scaled_mm.",
    "aten._flash_attention",
    "aten._efficient_attention",
    "aten._scaled_dot_product_flash",
    "aten._scaled_dot_product_efficient",
    "aten._scaled_dot_product_cudnn",
    "aten.convolution.",
    "aten.cudnn_convolution",
)
# ops that launch no kernel and move no data though their schema returns a new tensor (views are
# recognised by the recorder: OpRecord.is_view)
NOT_KERNELS = (
    "aten.empty",
    "aten.new_empty",
    "aten.resize_",
    "aten.set_",
    "aten.lift_fresh",
    "aten.sym_",
    "aten.is_",
)


def is_kernel(op: OpRecord) -> bool:
    """False for views and metadata ops: they have no bytes, no FLOPs and no kernel to judge."""
    return not op.is_view and not op.name.startswith(NOT_KERNELS)


def is_matmul(op: OpRecord) -> bool:
    return op.name.startswith(MATMULS) and len(op.inputs) >= 2


def operands(op: OpRecord, graph: OpGraph):
    """(a, b) Values of a matmul: [.., m, k] and [.., k, n]."""
    return graph.values[op.inputs[-2]], graph.values[op.inputs[-1]]


def mnk(op: OpRecord, graph: OpGraph) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of a matmul (batch 1 for mm/addmm)."""
    a, b = operands(op, graph)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = 1
    for d in a.shape[:-2]:
        batch *= d
    return batch, m, n, k


def input_dtype(op: OpRecord, graph: OpGraph) -> str | None:
    """The dtype a tensor-core op computes in: its matmul operand's, else its first floating
    input's ("float32", "bfloat16", ...); None when it has no input recorded."""
    if is_matmul(op):
        return operands(op, graph)[1].dtype
    for vid in op.inputs:
        v = graph.values.get(vid)
        if v is not None and (v.dtype.startswith(("float", "bfloat")) or "float8" in v.dtype):
            return v.dtype
    return None


def compute_key(op: OpRecord, graph: OpGraph, settings: dict | None) -> str | None:
    """The rate key a tensor-core op ran at ("fp32", "tf32", "bf16", "fp16", "fp8"); None for
    any other op (judged against the bandwidth and the headline ridge). Settings not recorded
    count as torch's default: fp32 matmuls without TF32, convolutions with it."""
    if not op.name.startswith(TENSOR_CORE):
        return None
    conv = "convolution" in op.name
    tf32 = tf32_allowed(settings, convolution=conv)
    if tf32 is None:
        tf32 = conv
    return rate_key(input_dtype(op, graph), tf32)
