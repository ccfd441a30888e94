"""LayerNorm, RMSNorm and add + RMSNorm: one fused pass forward, one backward, over rows of any
width (kernels.py -> launch.py -> op.py; reference.py the eager oracle, cost.py the byte model).
Importing the family registers its cost model for the recorded custom ops and its fix."""

from ... import cost as _cost
from ... import fixes as _fixes
from . import cost
from .op import add_rms_norm, layer_norm, rms_norm

_cost.register_op("fusewise.norm_fwd.", cost.recorded)
_cost.register_op("fusewise.norm_bwd.", cost.recorded)
_fixes.register(
    "fusion-chain",
    "norm",
    "fusewise.ops.layer_norm / rms_norm / add_rms_norm (or fusewise.nn.LayerNorm / RMSNorm): "
    "one pass over the activations forward and one backward",
    api="fusewise.ops.layer_norm",
    origin=__name__,
)

__all__ = ["layer_norm", "rms_norm", "add_rms_norm"]
