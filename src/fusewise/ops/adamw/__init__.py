"""Fused multi-tensor AdamW: one pass over each parameter's state, one launch per dtype bucket
(kernels.py -> launch.py -> op.py; reference.py the eager oracle, cost.py the bytes per
parameter). The public API is fusewise.optim.AdamW, which calls op.step_group. Importing the
family registers its fix; it has no custom op for the recorder to see, so no cost to register."""

from ... import fixes as _fixes
from . import cost
from .op import kernel_can_run, step_group

_fixes.register(
    "fusion-chain",
    "optimizer",
    "fusewise.optim.AdamW (one fused pass over each parameter; master_weights=True keeps fp32 "
    "masters for a bf16 model)",
    api="fusewise.optim.AdamW",
    origin=__name__,
)

__all__ = ["cost", "kernel_can_run", "step_group"]
