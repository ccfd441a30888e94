"""Step times of two (or more) variants measured so that noise cannot flip the sign.

The variants run interleaved, never one block after the other: in rounds, each round's order
reversed from the last (A B, B A, A B, ...), so a slow drift (clock boosting, thermal, a noisy
neighbour) lands on both. The comparison is the difference of the medians with a bootstrap
interval over the samples; a difference is claimed only when the interval excludes zero and the
rounds agree on its sign (all of them up to 4 rounds, 80% from 5 on: a drift that lands on one
round of many must not hide a difference every other round shows), else it is "no measurable
difference".
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

import torch

FASTER, SLOWER, SAME = "faster", "slower", "no measurable difference"


@dataclass
class Samples:
    """One variant's measurements: step times (ms), the loss of each step where known, per-round
    medians, peak memory (bytes, GPU), tokens per step where known."""

    name: str
    ms: list[float] = field(default_factory=list)
    round_ms: list[float] = field(default_factory=list)  # median of each round
    losses: list[list[float]] = field(default_factory=list)  # per run (script) or round
    peak_bytes: int | None = None
    tokens_per_step: int | None = None

    @property
    def median_ms(self) -> float:
        return statistics.median(self.ms) if self.ms else float("nan")

    def add_round(self, ms: list[float]) -> None:
        self.ms += ms
        if ms:
            self.round_ms.append(statistics.median(ms))


@dataclass
class Comparison:
    """before -> after: saving = median(before) - median(after), ms per step, with its 95%
    bootstrap interval; verdict FASTER / SLOWER / SAME (SAME unless the interval excludes zero
    and enough rounds' medians agree on the sign: agreeing())."""

    before: str
    after: str
    saving_ms: float
    low_ms: float
    high_ms: float
    speedup: float
    verdict: str
    rounds_agreeing: int
    rounds: int

    def to_dict(self) -> dict:
        return dict(vars(self))

    def describe(self) -> str:
        interval = f"95% interval {self.low_ms:+.2f} to {self.high_ms:+.2f} ms"
        if self.verdict == SAME:
            return (
                f"{self.after} vs {self.before}: no measurable difference "
                f"({self.saving_ms:+.2f} ms per step, {interval}; "
                f"{self.rounds_agreeing} of {self.rounds} rounds agree on the sign)"
            )
        word = "saves" if self.verdict == FASTER else "costs"
        return (
            f"{self.after} {word} {abs(self.saving_ms):.2f} ms per step against {self.before} "
            f"({self.speedup:.2f}x; {interval}; {self.rounds_agreeing} of {self.rounds} rounds "
            f"agree)"
        )


def compare(before: Samples, after: Samples, *, resamples: int = 2000, seed: int = 0):
    """The Comparison of two variants' samples (see the module's docstring)."""
    if not before.ms or not after.ms:
        raise ValueError("compare needs step times of both variants")
    saving = before.median_ms - after.median_ms
    rng = random.Random(seed)  # the user's random state is not touched
    boot = sorted(
        statistics.median(rng.choices(before.ms, k=len(before.ms)))
        - statistics.median(rng.choices(after.ms, k=len(after.ms)))
        for _ in range(resamples)
    )
    low, high = boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1]
    pairs = list(zip(before.round_ms, after.round_ms))
    sign = 1 if saving > 0 else -1
    agreeing = sum(1 for b, a in pairs if (b - a) * sign > 0)
    if low > 0 and enough(agreeing, len(pairs)):
        verdict = FASTER
    elif high < 0 and enough(agreeing, len(pairs)):
        verdict = SLOWER
    else:
        verdict = SAME
    speedup = before.median_ms / after.median_ms if after.median_ms > 0 else float("inf")
    return Comparison(
        before.name, after.name, saving, low, high, speedup, verdict, agreeing, len(pairs)
    )


def enough(agreeing: int, rounds: int) -> bool:
    """Rounds agreeing on the sign: all of them up to 4 rounds, at least 80% from 5 on."""
    return agreeing == rounds if rounds <= 4 else agreeing >= 0.8 * rounds


def round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """Each round's order of the variants: forwards, then backwards, alternating."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def _as_loss(value) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach())
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _keep_loss(samples: Samples, value) -> None:
    loss = _as_loss(value)
    if loss is not None:
        samples.losses[0].append(loss)


def interleave_steps(
    steps: dict,
    *,
    warmup: int = 3,
    per_round: int = 5,
    rounds: int = 6,
    device: torch.device | str | None = None,
) -> dict[str, Samples]:
    """Run each zero-argument step callable `warmup` times, then `rounds` rounds of `per_round`
    steps each, interleaved (round_orders). Each step is timed from a device sync to a device
    sync. A step's return value, when it is a one-element tensor or a number, is its loss (the
    warm-up steps' too, in order: losses[0] is the variant's trajectory from its first step).
    Returns {name: Samples}; peak_bytes is left None (the variants share one process, so their
    peaks are not theirs alone)."""
    if warmup < 1 or per_round < 1 or rounds < 2:
        raise ValueError("interleave_steps needs warmup >= 1, per_round >= 1 and rounds >= 2")
    device = torch.device(device) if device is not None else None
    out = {name: Samples(name, losses=[[]]) for name in steps}
    for name, step in steps.items():
        for _ in range(warmup):  # their losses count: a trajectory is compared from its start
            _keep_loss(out[name], step())
    for order in round_orders(list(steps), rounds):
        for name in order:
            ms = []
            for _ in range(per_round):
                _sync(device)
                t0 = time.perf_counter()
                value = steps[name]()
                _sync(device)
                ms.append((time.perf_counter() - t0) * 1e3)
                _keep_loss(out[name], value)
            out[name].add_round(ms)
    return out


@dataclass
class LossCheck:
    """Two loss trajectories compared step by step: the largest relative difference against the
    tolerance, and the reference noise (the same variant run twice) where there is one."""

    steps: int
    max_rel_diff: float
    rtol: float
    noise_rel_diff: float | None = None

    @property
    def equal(self) -> bool:
        return self.steps > 0 and self.max_rel_diff <= self.rtol

    def describe(self) -> str:
        if self.steps == 0:
            return "losses: none seen (the step returns no loss and calls no .backward())"
        noise = ""
        if self.noise_rel_diff is not None:
            noise = f"; the unpatched run against itself: {self.noise_rel_diff:.1e}"
        verdict = "equal" if self.equal else "NOT equal"
        return (
            f"losses {verdict} over {self.steps} values (each loss given to .backward(), or "
            f"returned by the step): largest relative difference "
            f"{self.max_rel_diff:.1e} (tolerance {self.rtol:.0e}{noise})"
        )


def rel_diff(a: list[float], b: list[float]) -> tuple[int, float]:
    n = min(len(a), len(b))
    if n == 0:
        return 0, float("nan")
    worst = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a[:n], b[:n]))
    return n, worst


def check_losses(before: list[float], after: list[float], rtol: float, noise=None) -> LossCheck:
    n, worst = rel_diff(before, after)
    noise_diff = rel_diff(before, noise)[1] if noise else None
    return LossCheck(n, worst, rtol, noise_diff)
