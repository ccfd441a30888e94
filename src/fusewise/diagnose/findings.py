"""Finding: what every analyzer returns (the report renders them; analyzers never print)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

KINDS = (
    "fusion-chain",
    "quadratic-memory",
    "attention-fallback",
    "host-sync",
    "launch-overhead",
    "data-loading",
    "idle-gap",
)
PATTERNS = ("norm", "optimizer", "cross-entropy", "attention", "elementwise", "other")


@dataclass
class Finding:
    kind: str
    title: str
    where: str
    est_saving_ms: float
    bytes_avoidable: float
    fix: str
    pattern: str | None = None
    evidence: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}")
        if self.pattern is not None and self.pattern not in PATTERNS:
            raise ValueError(f"unknown pattern {self.pattern!r}")

    def as_dict(self) -> dict:
        return asdict(self)
