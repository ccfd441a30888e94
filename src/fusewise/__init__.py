"""fusewise: find, fix and verify the memory traffic a PyTorch step does not need."""

from . import cost, graphs, hardware, nn, ops, optim
from ._version import __version__
from .capture.script import step

# The function takes the name of its subpackage on purpose (fw.diagnose(step), as DESIGN.md
# fixes); the analyzers stay importable as fusewise.diagnose.chains etc. through sys.modules.
from .diagnose.driver import diagnose
from .patch import PatchReport, patch, patch_optimizer, unpatch, unpatch_optimizer
from .report import Report

__all__ = [
    "diagnose",
    "step",
    "patch",
    "unpatch",
    "patch_optimizer",
    "unpatch_optimizer",
    "PatchReport",
    "Report",
    "ops",
    "nn",
    "optim",
    "hardware",
    "cost",
    "graphs",
    "__version__",
]
