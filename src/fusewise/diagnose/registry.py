"""The analyzers, registered: each is `(Observation, Ceilings) -> list[Finding]`, stateless,
never printing, never importing another analyzer. An analysis that cannot run on what was
observed raises Skip with the reason; one that fails is listed as failed. Either way the report
says so under "skipped" and the other analyzers still run.

Adding an analyzer: a module in diagnose/ with a function decorated `@analyzer("name")`; the
driver imports every module of this package, so nothing else changes (docs/DESIGN.md).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from ..report import Finding, Skipped

_ANALYZERS: dict[str, Callable] = {}
# the modules of this package that are not analyzers
_NOT_ANALYZERS = {"driver", "registry", "thresholds"}


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
    from . import __name__ as package
    from . import __path__ as path

    for mod in pkgutil.iter_modules(path):
        if mod.name not in _NOT_ANALYZERS and not mod.name.startswith("_"):
            importlib.import_module(f"{package}.{mod.name}")
    return dict(_ANALYZERS)


def run_all(obs, ceilings) -> tuple[list[Finding], list[Skipped]]:
    """Every analyzer on one observation: the findings by predicted saving, and what did not
    run (or failed: one analyzer's bug must not cost the user the whole report)."""
    findings, skipped = [], []
    for name, fn in analyzers().items():
        try:
            findings += fn(obs, ceilings)
        except Skip as why:
            skipped.append(Skipped(name, str(why)))
        except Exception as e:
            skipped.append(Skipped(name, f"failed: {type(e).__name__}: {e}"))
    findings.sort(key=lambda f: -f.est_saving_ms)
    return findings, skipped
