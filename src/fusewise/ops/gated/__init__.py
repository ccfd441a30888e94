"""Gated activations, SwiGLU (silu(gate) * up) and GeGLU (gelu(gate) * up): one fused pass
forward, one backward that recomputes the activation, so autograd keeps only gate and up
(kernels.py -> launch.py -> op.py; reference.py the eager oracle, cost.py the byte model).
Importing the family registers its cost model for the recorded custom ops and its fix."""

from ... import cost as _cost
from ... import fixes as _fixes
from . import cost
from .op import geglu, swiglu

_cost.register_op("fusewise.gated_fwd.", cost.recorded)
_cost.register_op("fusewise.gated_bwd.", cost.recorded)
_fixes.register(
    "fusion-chain",
    "gated-activation",
    "fusewise.ops.swiglu / geglu (act(gate) * up in one pass forward and one backward that "
    "recomputes the activation, so autograd keeps only gate and up), or fusewise.patch(model) "
    "on a Hugging Face model",
    api="fusewise.ops.swiglu",
    origin=__name__,
)

__all__ = ["swiglu", "geglu"]
