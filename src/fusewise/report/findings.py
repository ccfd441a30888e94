"""Finding: what every analyzer returns (the report renders them; analyzers never print). Its
dict is one entry of the report JSON's "findings" (docs/DESIGN.md, Report JSON)."""

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
    "matmul-precision",
    "matmul-shape",
)
PATTERNS = (
    "norm",
    "optimizer",
    "grad-clip",
    "cross-entropy",
    "attention",
    "rotary",
    "gated-activation",
    "elementwise",
    "other",
)


@dataclass
class Finding:
    kind: str  # one of KINDS
    title: str  # one line, in words
    where: str  # path:line in the user's code ("?" when no line can be named)
    est_saving_ms: float  # predicted saving per step if fixed
    bytes_avoidable: float  # per step
    fix: str  # what to do (fusewise.fixes.text)
    pattern: str | None = None  # fusion-chain only: one of PATTERNS
    evidence: dict = field(default_factory=dict)  # the numbers behind it, per kind

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}")
        if self.pattern is not None and self.pattern not in PATTERNS:
            raise ValueError(f"unknown pattern {self.pattern!r}")

    def as_dict(self) -> dict:
        return asdict(self)
