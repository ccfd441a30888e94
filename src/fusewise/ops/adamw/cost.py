"""FLOPs and bytes of one AdamW step, per parameter element, as functions of the dtypes: the byte
model of benchmarks/bench_adamw.py. (The step is one Triton launch per dtype bucket outside the
dispatcher, so the diagnosis' recorder sees no op of it to cost.)

Per element the kernel reads the gradient, both moments and the weight it updates (the
parameter, or its fp32 master) and writes the moments and that weight back, plus the rounded
parameter when a master is kept, and the running maximum of v with amsgrad:

    fp32 layout         reads param, grad, m, v (16 B); writes param, m, v (12 B)      28 B
    bf16 + fp32 master  reads grad 2, m 4, v 4, master 4; writes m, v, master 4 each,
                        param 2                                                        28 B
"""

from __future__ import annotations

import torch

from ...cost import Cost, itemsize

# Arithmetic per element of the update (kernels.py, _update_block): decay 1, first moment 3,
# second moment 4, sqrt, bias correction and eps 3, step 3; unscaling and amsgrad's max add one.
FLOPS_PER_PARAM = 14.0


def bytes_per_param(
    param_dtype: torch.dtype,
    *,
    grad_dtype: torch.dtype | None = None,
    state_dtype: torch.dtype | None = None,
    master: bool = False,
    amsgrad: bool = False,
) -> int:
    """Minimum bytes one step moves per parameter element (see the module docstring). grad_dtype
    defaults to the parameter's; state_dtype, the moments', to fusewise.optim.AdamW's: fp32 with
    master weights, else the parameter's (as torch keeps them)."""
    p = itemsize(param_dtype)
    s = itemsize(state_dtype or (torch.float32 if master else param_dtype))
    g = itemsize(grad_dtype or param_dtype)
    w = 4 if master else p  # the weight the update reads and writes
    moments = (3 if amsgrad else 2) * s
    reads = g + moments + w
    writes = moments + w + (p if master else 0)
    return reads + writes


def step(numel: int, param_dtype: torch.dtype, **layout) -> Cost:
    """One step over `numel` parameter elements; layout: bytes_per_param's keywords."""
    flops = FLOPS_PER_PARAM + (1.0 if layout.get("amsgrad") else 0.0)
    return Cost(flops * numel, float(bytes_per_param(param_dtype, **layout) * numel))
