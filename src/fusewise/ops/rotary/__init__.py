"""Rotary position embedding (RoPE) of q and k: one fused pass forward over both, one backward
(the transposed rotation) that keeps only cos and sin (kernels.py -> launch.py -> op.py;
reference.py the eager oracle, cost.py the byte model). Importing the family registers its cost
model for the recorded custom ops and its fix."""

from ... import cost as _cost
from ... import fixes as _fixes
from . import cost
from .op import apply_rotary

_cost.register_op("fusewise.rotary_fwd.", cost.recorded)
_cost.register_op("fusewise.rotary_bwd.", cost.recorded)
_fixes.register(
    "fusion-chain",
    "rotary",
    "fusewise.ops.apply_rotary(q, k, cos, sin) for a rotary position embedding (HF's "
    "apply_rotary_pos_emb, q * cos + rotate_half(q) * sin and the same for k), or "
    "fusewise.patch(model) on a Hugging Face model: q and k rotated in one pass that reads them "
    "and cos / sin once, and a backward that keeps only cos and sin",
    api="fusewise.ops.apply_rotary",
    origin=__name__,
)

__all__ = ["apply_rotary"]
