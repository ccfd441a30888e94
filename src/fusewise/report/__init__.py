"""Report: the diagnosis as data (JSON schema of DESIGN.md), text (rich) and HTML."""

from .report import Report

__all__ = ["Report"]
