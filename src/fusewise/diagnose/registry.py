"""The analyzers, registered: each is `(Observation, Ceilings) -> list[Finding]`, stateless,
never printing, never importing another analyzer. An analysis that cannot run on what was
observed raises Skip with the reason; one that fails is listed as failed. Either way the report
says so under "skipped" and the other analyzers still run.

Adding an analyzer: a module in diagnose/ with a function decorated `@analyzer("name")`; the
driver imports every module of this package but driver, registry, thresholds, breakdown and
the shared helpers (_*.py), so nothing else changes (docs/DESIGN.md). A module that fails to
import, or registers no analyzer, is listed under "skipped" too.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable

from ..report import Finding, Skipped

_ANALYZERS: dict[str, Callable] = {}
# the modules of this package that are not analyzers (shared helpers are named _*.py)
_NOT_ANALYZERS = {"driver", "registry", "thresholds", "breakdown"}


class Skip(Exception):
    """Raised by an analyzer that cannot run on this observation; its text is the reason."""


def analyzer(name: str):
    """Register fn(obs, ceilings) -> list[Finding] under `name` (shown under "skipped")."""

    def register(fn):
        if _ANALYZERS.get(name, fn) is not fn:
            raise ValueError(f"two analyzers named {name!r}")
        _ANALYZERS[name] = fn
        return fn

    return register


def analyzers() -> dict[str, Callable]:
    """Every analyzer of diagnose/, by name (their modules imported on first use)."""
    _load()
    return dict(_ANALYZERS)


def _load() -> list[Skipped]:
    """Import every analyzer module; what could not be loaded, or registers no analyzer, is
    said (never an analysis left out without a word)."""
    problems = []
    for mod in pkgutil.iter_modules([os.path.dirname(__file__)]):
        if mod.name in _NOT_ANALYZERS or mod.name.startswith("_"):
            continue
        name = f"{__package__}.{mod.name}"
        try:
            module = importlib.import_module(name)
        except Exception as e:
            problems.append(Skipped(f"module {mod.name}", f"failed to import: {_said(e)}"))
            continue
        if not any(fn.__module__ == module.__name__ for fn in _ANALYZERS.values()):
            problems.append(
                Skipped(
                    f"module {mod.name}",
                    "registers no analyzer (decorate its entry point with @analyzer, or name a "
                    "shared helper module _*.py)",
                )
            )
    return problems


def _said(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


def run_all(obs, ceilings) -> tuple[list[Finding], list[Skipped]]:
    """Every analyzer on one observation: the findings by predicted saving (ties in a fixed
    order), and what did not run (or failed: one analyzer's bug must not cost the user the
    whole report)."""
    skipped = _load()
    findings = []
    for name, fn in sorted(_ANALYZERS.items()):
        try:
            findings += fn(obs, ceilings)
        except Skip as why:
            skipped.append(Skipped(name, str(why)))
        except Exception as e:
            skipped.append(Skipped(name, f"failed: {_said(e)}"))
    findings.sort(key=lambda f: (-f.est_saving_ms, f.kind, f.pattern or "", f.where))
    return findings, skipped
