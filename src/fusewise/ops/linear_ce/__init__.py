"""Linear + cross-entropy without the logits: the loss from the last hidden state, one chunk of
tokens at a time (kernels.py -> launch.py -> op.py; args.py the argument checks, reference.py
the eager oracle, cost.py the FLOPs and bytes). Importing the family registers its cost model
for the recorded custom ops and its fix."""

from ... import cost as _cost
from ... import fixes as _fixes
from . import cost
from .op import linear_cross_entropy

_cost.register_op("fusewise.linear_ce_", cost.recorded)
_fixes.register(
    "fusion-chain",
    "cross-entropy",
    "fusewise.ops.linear_cross_entropy(hidden, lm_head.weight, targets): the loss from the last "
    "hidden state, the logits never materialised (or fusewise.nn.LinearCrossEntropyLoss)",
    api="fusewise.ops.linear_cross_entropy",
    origin=__name__,
)

__all__ = ["linear_cross_entropy"]
