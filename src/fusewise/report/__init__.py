"""Report: the diagnosis as data (typed dataclasses; their dict is the JSON schema of
docs/DESIGN.md), text (rich) and HTML. Imports nothing above report/."""

from .findings import KINDS, PATTERNS, Finding
from .report import Device, Report, Skipped, StepSummary, TopOp

__all__ = ["Device", "Finding", "KINDS", "PATTERNS", "Report", "Skipped", "StepSummary", "TopOp"]
