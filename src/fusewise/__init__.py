"""fusewise: find, fix and verify the memory traffic a PyTorch step does not need."""

__version__ = "0.1.0"

from . import cost, hardware, nn, ops, optim  # noqa: E402
from .capture.script import step  # noqa: E402

# The function takes the name of its subpackage on purpose (fw.diagnose(step), as DESIGN.md
# fixes); the analyzers stay importable as fusewise.diagnose.chains etc. through sys.modules.
from .diagnose.driver import diagnose  # noqa: E402
from .patch import patch  # noqa: E402
from .report import Report  # noqa: E402

__all__ = [
    "diagnose",
    "step",
    "patch",
    "Report",
    "ops",
    "nn",
    "optim",
    "hardware",
    "cost",
    "__version__",
]
