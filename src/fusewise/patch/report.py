"""What fusewise.patch did, as data: one Change per module (or optimizer) it looked at."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

SWAPPED = "swapped"
LEFT_ALONE = "left alone"  # recognised, not changed: `reason` says why
UNRECOGNISED = "not recognised"  # looks like a norm (or loss, optimizer), no rule for it


@dataclass
class Change:
    name: str  # module path in the model ("" for the model itself), or "optimizer"
    was: str  # the class, with its module: "transformers.models.llama.modeling_llama.LlamaRMSNorm"
    now: str | None  # what computes it now; None when left alone or not recognised
    reason: str = ""
    action: str = SWAPPED
    what: str = "norm"  # norm, activation, loss, optimizer

    def __post_init__(self):
        if self.now is None and self.action == SWAPPED:
            self.action = LEFT_ALONE


@dataclass
class PatchReport:
    """Printable (str), JSON-able (to_dict, to_json). Iterating gives the Changes in order."""

    changes: list[Change] = field(default_factory=list)

    def __iter__(self):
        return iter(self.changes)

    def __len__(self):
        return len(self.changes)

    def __getitem__(self, i):
        return self.changes[i]

    def __eq__(self, other):
        if isinstance(other, PatchReport):
            return self.changes == other.changes
        if isinstance(other, list):
            return self.changes == other
        return NotImplemented

    def _with(self, action: str) -> list[Change]:
        return [c for c in self.changes if c.action == action]

    @property
    def swapped(self) -> list[Change]:
        return self._with(SWAPPED)

    @property
    def left_alone(self) -> list[Change]:
        return self._with(LEFT_ALONE)

    @property
    def unrecognised(self) -> list[Change]:
        return self._with(UNRECOGNISED)

    def to_dict(self) -> dict:
        return {"changes": [asdict(c) for c in self.changes]}

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def __str__(self) -> str:
        if not self.changes:
            return "fusewise.patch: nothing recognised, nothing changed"
        counts = ", ".join(
            f"{len(self._with(a))} {a}"
            for a in (SWAPPED, LEFT_ALONE, UNRECOGNISED)
            if self._with(a)
        )
        lines = [f"fusewise.patch: {counts}"]
        for c in self.changes:
            target = f" -> {c.now}" if c.now else ""
            why = f" ({c.reason})" if c.reason else ""
            lines.append(
                f"  {c.action:<14} {c.what:<9} {c.name or '<model>'}: {c.was}{target}{why}"
            )
        return "\n".join(lines)

    __repr__ = __str__
