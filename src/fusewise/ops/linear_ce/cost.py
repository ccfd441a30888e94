"""FLOPs and bytes of linear + cross-entropy, as functions of shape and dtype: the model of
benchmarks/bench_linear_ce.py and of the diagnosis (recorded, registered with fusewise.cost for
the custom ops fusewise::linear_ce_*).

hidden [n, d] and weight [v, d] in `dtype`, target [n] in target_dtype, bias [v]. FLOPs are the
GEMMs' (the row pass is O(n·v), d times fewer): the logits 2·n·d·v forward, dhidden and dweight
4·n·d·v backward. Bytes are the minimum traffic: each operand read once, each result written
once; the [n, v] logits never leave the chip (what the op is for). The loss is fp32: [n] per
token (reduction="none"), else one value.
"""

from __future__ import annotations

import torch

from ...cost import Cost, itemsize


def _operands(n, d, v, dtype, bias, target_dtype) -> float:
    return float(
        (n * d + v * d + (v if bias else 0)) * itemsize(dtype) + n * itemsize(target_dtype)
    )


def _grads(n, d, v, dtype, bias) -> float:
    return float((n * d + v * d + (v if bias else 0)) * itemsize(dtype))


def forward(n, d, v, dtype, *, bias=False, target_dtype=torch.int64, per_token=False) -> Cost:
    """The loss alone: reads hidden, weight, target (and bias), writes the loss."""
    loss = 4 * (n if per_token else 1)
    return Cost(2.0 * n * d * v, _operands(n, d, v, dtype, bias, target_dtype) + loss)


def backward(
    n, d, v, dtype, *, bias=False, target_dtype=torch.int64, per_token=False, recompute=False
) -> Cost:
    """The gradients from grad_output: reads hidden, weight, target (and bias) and grad_output,
    writes dhidden, dweight (and dbias). recompute: the logits are computed again (reduction
    "none"'s backward, 2·n·d·v more FLOPs)."""
    flops = (6.0 if recompute else 4.0) * n * d * v
    grad_out = 4 * (n if per_token else 1)
    reads = _operands(n, d, v, dtype, bias, target_dtype) + grad_out
    return Cost(flops, reads + _grads(n, d, v, dtype, bias))


def fwd_bwd(n, d, v, dtype, *, bias=False, target_dtype=torch.int64) -> Cost:
    """Loss and gradients in one step (reductions "mean"/"sum": the gradients are made in the
    forward): 6·n·d·v FLOPs, the three GEMMs' floor; the operands read once, the loss and the
    gradients written once."""
    nbytes = _operands(n, d, v, dtype, bias, target_dtype) + 4 + _grads(n, d, v, dtype, bias)
    return Cost(6.0 * n * d * v, nbytes)


def recorded(name: str, inputs: list, outputs: list) -> Cost | None:
    """The cost of a recorded fusewise::linear_ce_* call (fusewise.cost.register_op); None for
    linear_ce_scale (an elementwise pass: the generic count is right)."""
    op = name.split(".")[1] if name.count(".") >= 2 else ""
    if op not in ("linear_ce_fwd", "linear_ce_fused", "linear_ce_bwd"):
        return None
    if op == "linear_ce_bwd":
        grad_out, *inputs = inputs
    hidden, weight, target = inputs[:3]
    n, d, v = hidden.shape[0], hidden.shape[1], weight.shape[0]
    kw = dict(bias=len(inputs) > 3, target_dtype=target.dtype)
    if op == "linear_ce_fused":
        return fwd_bwd(n, d, v, hidden.dtype, **kw)
    if op == "linear_ce_fwd":
        return forward(n, d, v, hidden.dtype, per_token=outputs[0].dim() > 0, **kw)
    return backward(n, d, v, hidden.dtype, per_token=grad_out.dim() > 0, recompute=True, **kw)
