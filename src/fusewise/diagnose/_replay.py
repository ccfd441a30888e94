"""What a step would take without some of its ops: the recorded step's trace (capture/_trace.py)
replayed on one host clock and one device queue. Shared by the fusion-chain, attention-fallback
and host-sync analyzers. Not an analyzer: registers nothing.

The model: the host runs its events in order; each kernel starts when the host has issued it
and the device has finished the one before (one queue); a sync makes the host wait until the
device is done. Removing an op removes its host span and its kernels; a fused kernel replacing
a chain is issued where the chain began, with one op's host cost; an op whose sync is removed
no longer waits. The saving is the step replayed as it is less the step replayed with the fix,
so a fix saves device time only where the device was the bottleneck, and host time only where
the device waited for the host.

Calibration: the recorded step ran under a profiler that records shapes and stacks, which slows
the host by a cost per op the plain step does not pay. That cost, k µs per aten op, is taken off
the host's time (from the time after each op, never below zero) with the k at which the replayed
step lasts as long as the median plain step (bisection: the replayed time falls as k grows).
Kernel times are the device's own and are kept. Assumed: one device queue (side streams are
serialized), one host timeline (the backward's thread runs while the main thread waits in it).
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass

from ..capture._trace import StepTrace

# the largest profiler cost per op the calibration considers (µs); a with_stack session costs
# tens of µs per op on a fast host
K_MAX_US = 500.0
_BISECTIONS = 32
_FUSED, _SYNC, _LAUNCH, _OP = range(4)  # order of events at one instant


@dataclass
class Fused:
    """A kernel the fix adds: issued at `at_us` (the host clock of the recorded step), running
    `device_us`, costing the host `host_us` (on the plain step's clock)."""

    at_us: float
    device_us: float
    host_us: float


class _Cut:
    """The host time taken out of the step (removed ops' spans, sync waits): free(t) is the
    time before t outside them."""

    def __init__(self, intervals):
        merged: list[list[float]] = []
        for a, b in sorted(intervals):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            elif b > a:
                merged.append([a, b])
        self.starts = [a for a, _ in merged]
        self.ends = [b for _, b in merged]
        self.before = [0.0]  # cut time before interval i
        for a, b in merged:
            self.before.append(self.before[-1] + b - a)

    def free(self, t: float) -> float:
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0:
            return t
        return t - self.before[i] - min(t, self.ends[i]) + self.starts[i]

    def inside(self, t: float) -> bool:
        i = bisect.bisect_right(self.starts, t) - 1
        return i >= 0 and t < self.ends[i]


class Replay:
    """The recorded step's trace, calibrated against the plain step's median time (ms)."""

    def __init__(self, trace: StepTrace, plain_ms: float):
        self.trace, self.plain_ms = trace, plain_ms
        self._events = sorted(
            [(t, _OP, None) for t in trace.op_starts]
            + [(k.issue_us, _LAUNCH, k) for k in trace.kernels]
            + [(s, _SYNC, (s, e)) for s, e in trace.syncs],
            key=_order,  # stable: kernels of one instant stay in issue order
        )
        self.k_us = self._calibrate()
        self.base_ms = self.step_ms()
        spans = [e - s for s, e in trace.spans.values()]
        # a fused op's host cost: a typical op's, less the profiler's share
        self.op_host_us = max(0.0, statistics.median(spans) - self.k_us) if spans else 0.0

    def _calibrate(self) -> float:
        if self.step_ms(k_us=0.0) <= self.plain_ms:
            return 0.0  # the profiled host was no slower than the plain step
        if self.step_ms(k_us=K_MAX_US) >= self.plain_ms:
            return K_MAX_US  # the device alone takes longer: the host cost does not matter
        low, high = 0.0, K_MAX_US
        for _ in range(_BISECTIONS):
            mid = (low + high) / 2
            low, high = (mid, high) if self.step_ms(k_us=mid) > self.plain_ms else (low, mid)
        return (low + high) / 2

    def fused(self, ops, device_ms: float) -> Fused:
        """The fused kernel replacing `ops` (op-graph indices): issued where the first began."""
        starts = [self.trace.spans[i][0] for i in ops if i in self.trace.spans]
        return Fused(min(starts, default=0.0), device_ms * 1e3, self.op_host_us)

    def covers(self, ops) -> bool:
        """Whether the trace knows the host span of every op (an op graph from another session
        does not match it)."""
        return all(i in self.trace.spans for i in ops)

    def saving_ms(self, removed=(), fused=(), unsynced=()) -> float:
        """The step replayed as it is, less the step replayed with the fix."""
        return self.base_ms - self.step_ms(removed, fused, unsynced)

    def step_ms(self, removed=(), fused=(), unsynced=(), *, k_us: float | None = None) -> float:
        """The replayed step (ms) without the `removed` ops (indices into the op graph), with
        the `fused` kernels added and the syncs inside the `unsynced` ops' spans not waiting."""
        tr, k = self.trace, self.k_us if k_us is None else k_us
        removed = set(removed)
        cut = _Cut([tr.spans[i] for i in removed if i in tr.spans] + tr.syncs)
        kept_waits = _waits_kept(tr, unsynced)
        events = self._events
        if fused:
            events = sorted(events + [(f.at_us, _FUSED, f) for f in fused], key=_order)
        host = extra = debt = device = last = 0.0
        for t, kind, x in events:
            f = cut.free(t)
            # the profiler's cost of the ops so far comes off the host time that followed them
            pay = min(debt, f - last)
            host, debt, last = host + f - last - pay, debt - pay, f
            now = host + extra
            if kind == _LAUNCH:
                if x.op not in removed:
                    device = max(device, now) + x.duration_us
            elif kind == _OP:
                if not cut.inside(t):
                    debt += k
            elif kind == _SYNC:
                if x in kept_waits:
                    extra += max(0.0, device - now)
            else:  # a fused kernel
                device = max(device, now) + x.device_us
                extra += x.host_us
        f = cut.free(tr.end_us)
        host += max(0.0, f - last - debt)
        return max(host + extra, device) / 1e3

    def evidence(self) -> dict:
        return dict(
            replayed_step_ms=round(self.base_ms, 3),
            plain_step_ms=round(self.plain_ms, 3),
            profiler_cost_per_op_us=round(self.k_us, 2),
        )


def _order(event):
    return event[0], event[1]


def _waits_kept(tr: StepTrace, unsynced) -> set:
    spans = [tr.spans[i] for i in unsynced if i in tr.spans]
    return {(s, e) for s, e in tr.syncs if not any(a <= s and e <= b for a, b in spans)}
