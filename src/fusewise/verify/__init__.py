"""fusewise verify: measure a step before and after its fix, so that noise cannot flip the sign.

verify_script(script, argv): the user's unchanged script, unpatched and patched (run.py);
interleave_steps / compare: two step callables measured in alternation (measure.py), as the demo
does with its naive and fixed steps.
"""

from .measure import Comparison, LossCheck, Samples, check_losses, compare, interleave_steps
from .report import VerifyReport
from .run import VerifyError, verify_script

__all__ = [
    "verify_script",
    "VerifyReport",
    "VerifyError",
    "interleave_steps",
    "compare",
    "check_losses",
    "Comparison",
    "LossCheck",
    "Samples",
]
