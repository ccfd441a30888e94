"""What a step would take without some of its ops: the recorded step's trace (capture/_trace.py)
replayed on one host clock and one device queue. Shared by the fusion-chain, attention-fallback
and host-sync analyzers. Not an analyzer: registers nothing.

The model: the host runs its events in order; each kernel starts when the host has issued it
and the device has finished the one before (one queue); a sync makes the host wait until the
device is done. Removing an op removes its host span and its kernels; a fused kernel replacing
a chain is issued where the chain began, with one op's host cost; an op whose sync is removed
no longer waits. The saving is the step replayed as it is less the step replayed with the fix,
so a fix saves device time only where the device was the bottleneck, and host time only where
the device waited for the host; and never more than the device time it removes plus the idle
the device had in the plain step (saving_ms says why).

Calibration: the recorded step ran under a profiler that records shapes and stacks, which slows
the host by a cost per op the plain step does not pay. That cost, k µs per aten op, is taken off
the host's time (from the time after each op, never below zero) with the k at which the replayed
step lasts as long as the median plain step (bisection: the replayed time falls as k grows). A
phase's cost not paid by its end is dropped there, never taken off the next phase's time.
Kernel times are the device's own and are kept. The device also pays a gap before each kernel
even when it is queued (the H200: about 1 µs between back-to-back kernels, a quarter of a
per-parameter AdamW loop's device time); kernel_gap_us, measured on the trace's queued kernels
(device_gap_us), is that gap. Assumed: one device queue (side streams are serialized), one
host timeline (the backward's thread runs while the main thread waits in it).
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
# queued kernel pairs needed to measure the device's gap between kernels (device_gap_us)
MIN_QUEUED = 16
# a replayed wait for the device longer than this makes a phase's end the device's (µs)
WAIT_MIN_US = 50.0


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
    """The recorded step's trace, calibrated against the plain steps: their host time at each
    mark (plain_marks: per step, (label, ms from its start), as Observation.marks_ms) where
    their labels match the trace's, else their median time (ms) alone."""

    def __init__(self, trace: StepTrace, plain_ms: float, plain_marks=None, kernel_gap_us=0.0):
        self.trace, self.plain_ms, self.kernel_gap_us = trace, plain_ms, kernel_gap_us
        self._events = sorted(
            [(t, _OP, None) for t in trace.op_starts]
            + [(k.issue_us, _LAUNCH, k) for k in trace.kernels]
            + [(s, _SYNC, (s, e)) for s, e in trace.syncs],
            key=_order,  # stable: kernels of one instant stay in issue order
        )
        self._spans = [e - s for s, e in trace.spans.values()]
        self.bounds: list[float] = []  # each phase's end on the trace's clock
        self.ks: list[float] = []  # the profiler's cost per op (µs) in each phase
        self.calibrated_on = "the plain step's median time"
        targets = _plain_targets(plain_marks, [m for m, _ in trace.marks] + ["end"])
        if targets is not None:
            self.bounds = [t for _, t in trace.marks] + [trace.step_end_us]
            self.ks = self._calibrate_phases(targets)
            self.calibrated_on = "the plain steps' host time at each backward/optimizer mark"
        else:
            self.ks = [self._calibrate_total()]
        self.base_ms = self.step_ms()

    @property
    def k_us(self) -> float:
        """The profiler's cost per op: the mean over the phases."""
        return sum(self.ks) / len(self.ks)

    def _k_at(self, t: float, ks) -> float:
        # an op starting at a mark belongs to the phase the mark begins
        return ks[min(bisect.bisect_right(self.bounds, t), len(ks) - 1)]

    def _calibrate_total(self) -> float:
        if self.step_ms(k_us=0.0) <= self.plain_ms:
            return 0.0  # the profiled host was no slower than the plain step
        if self.step_ms(k_us=K_MAX_US) >= self.plain_ms:
            return K_MAX_US  # the device alone takes longer: the host cost does not matter
        return _bisect(lambda k: self.step_ms(k_us=k) > self.plain_ms)

    def _calibrate_phases(self, targets_us) -> list[float]:
        """Phase by phase, the cost per op at which the host reaches the phase's end when the
        plain steps' host did. A phase whose host waits for the device (a sync the replay keeps,
        .item() after the optimizer) is not fitted: its end is the replayed device's end plus
        the host work after the wait, so the fit would take the device's error (a replayed
        device 1-2 ms late on the H200: the profiled step's first op alone took 0.6-1.2 ms of
        host time, against ~9 µs for a median op) off the host work after it, and removing
        the sync would then save nothing. It takes the fitted phases' median cost per op."""
        ks: list[float] = []
        start = 0.0
        for bound, target in zip(self.bounds, targets_us):

            def late(k, bound=bound, target=target):
                return self._walk(ks + [k], until=bound)[0] > target

            fitted = [k for k in ks if 0.0 < k < K_MAX_US]
            if fitted and self._waits_between(ks, statistics.median(fitted), start, bound):
                ks.append(statistics.median(fitted))
            elif not late(0.0):
                ks.append(0.0)
            elif late(K_MAX_US):
                ks.append(K_MAX_US)
            else:
                ks.append(_bisect(late))
            start = bound
        return ks

    def _waits_between(self, ks, k: float, start: float, end: float) -> bool:
        """Whether the replayed host waits for the device (over WAIT_MIN_US) between `start`
        and `end` (trace clock), with the phase's cost per op at `k`."""
        waits = self._walk(ks + [k], until=end, waits=True)[2]
        return any(start <= t and w > WAIT_MIN_US for t, w in waits)

    def fused(self, ops, device_ms: float) -> Fused:
        """The fused kernel replacing `ops` (op-graph indices): issued where the first began,
        costing the host a typical op's time less the profiler's share there."""
        at = min((self.trace.spans[i][0] for i in ops if i in self.trace.spans), default=0.0)
        host = statistics.median(self._spans) - self._k_at(at, self.ks) if self._spans else 0.0
        return Fused(at, device_ms * 1e3, max(0.0, host))

    def covers(self, ops) -> bool:
        """Whether the trace knows the host span of every op (an op graph from another session
        does not match it)."""
        return all(i in self.trace.spans for i in ops)

    def saving_ms(self, removed=(), fused=(), unsynced=()) -> float:
        """The step replayed as it is, less the step replayed with the fix; at most the device
        time the fix takes away plus the idle the device had in the plain step (the most that
        a faster host can give back). The cap matters where the replayed host is too slow:
        its profiler cost per op is a phase's mean, and an op removed from a region the replay
        thinks host-bound saves host time the plain step never spent waiting (the H200's demo
        step: 25.6 ms of kernels in a 27.3 ms step, the replay 1.8 ms idle in the forward)."""
        replayed = self.base_ms - self.step_ms(removed, fused, unsynced)
        gone = set(removed)
        gap = self.kernel_gap_us
        device_saving = sum(k.duration_us + gap for k in self.trace.kernels if k.op in gone)
        device_saving -= sum(f.device_us + gap for f in fused)
        return min(replayed, (device_saving + self.plain_idle_us) / 1e3)

    @property
    def plain_idle_us(self) -> float:
        """The plain step's time beyond its kernels and their gaps: what the device idled."""
        busy = sum(k.duration_us + self.kernel_gap_us for k in self.trace.kernels)
        return max(0.0, self.plain_ms * 1e3 - busy)

    def step_ms(self, removed=(), fused=(), unsynced=(), *, k_us: float | None = None) -> float:
        """The replayed step (ms) without the `removed` ops (indices into the op graph), with
        the `fused` kernels added and the syncs inside the `unsynced` ops' spans not waiting.
        k_us: one cost per op for the whole step instead of the calibrated ones."""
        ks = self.ks if k_us is None else [k_us] * max(1, len(self.bounds))
        host, device = self._walk(ks, removed, fused, unsynced)
        return max(host, device) / 1e3

    def _walk(self, ks, removed=(), fused=(), unsynced=(), until=None, waits=False):
        """(host clock, device free) in µs at `until` on the trace's clock (the step's end when
        None); see the module's docstring for the model. waits: also the (trace time, µs) of
        each wait for the device, as a third item."""
        tr = self.trace
        removed = set(removed)
        cut = _Cut([tr.spans[i] for i in removed if i in tr.spans] + tr.syncs)
        kept_waits = _waits_kept(tr, unsynced)
        events = self._events
        if fused:
            events = sorted(events + [(f.at_us, _FUSED, f) for f in fused], key=_order)
        end = tr.end_us if until is None else until
        host = extra = debt = device = last = 0.0
        gap = self.kernel_gap_us
        waited = []
        bounds, passed = self.bounds, 0
        for t, kind, x in events:
            if t >= end:
                break
            while passed < len(bounds) and t >= bounds[passed]:
                # a phase's profiler cost stays in its phase: what its host time could not pay
                # by the phase's end is dropped, not taken off the next phase's host time (a
                # launch-bound forward fitted at K_MAX_US ate the whole backward's host time)
                f = cut.free(bounds[passed])
                pay = min(debt, f - last)
                host, debt, last = host + f - last - pay, 0.0, f
                passed += 1
            f = cut.free(t)
            # the profiler's cost of the ops so far comes off the host time that followed them
            pay = min(debt, f - last)
            host, debt, last = host + f - last - pay, debt - pay, f
            now = host + extra
            if kind == _LAUNCH:
                if x.op not in removed:
                    device = max(device + gap, now) + x.duration_us
            elif kind == _OP:
                if not cut.inside(t):
                    debt += self._k_at(t, ks)
            elif kind == _SYNC:
                if x in kept_waits:
                    extra += max(0.0, device - now)
                    if waits:
                        waited.append((t, max(0.0, device - now)))
            else:  # a fused kernel
                device = max(device + gap, now) + x.device_us
                extra += x.host_us
        host += max(0.0, cut.free(end) - last - debt)
        return (host + extra, device, waited) if waits else (host + extra, device)

    def evidence(self) -> dict:
        return dict(
            replayed_step_ms=round(self.base_ms, 3),
            plain_step_ms=round(self.plain_ms, 3),
            profiler_cost_per_op_us=[round(k, 2) for k in self.ks],
            kernel_gap_us=round(self.kernel_gap_us, 3),
            plain_idle_ms=round(self.plain_idle_us / 1e3, 3),
            calibrated_on=self.calibrated_on,
        )


def device_gap_us(kernels) -> float:
    """The gap the device leaves between kernels it has queued: the median idle before a kernel
    issued while the one before it still ran (it waited in the queue, not for the host).
    Kernels overlapping their predecessor (another stream) are left out. 0 with fewer than
    MIN_QUEUED such pairs (a host-bound step, or no device start times): a host-bound step's
    idle is the host's, never the device's own gap."""
    ks = sorted((k for k in kernels if k.start_us is not None), key=lambda k: k.start_us)
    gaps = []
    for a, b in zip(ks, ks[1:]):
        end = a.start_us + a.duration_us
        if b.issue_us < end <= b.start_us:
            gaps.append(b.start_us - end)
    return statistics.median(gaps) if len(gaps) >= MIN_QUEUED else 0.0


def _bisect(too_slow) -> float:
    """The smallest cost per op in [0, K_MAX_US] at which too_slow(k) turns false."""
    low, high = 0.0, K_MAX_US
    for _ in range(_BISECTIONS):
        mid = (low + high) / 2
        low, high = (mid, high) if too_slow(mid) else (low, mid)
    return (low + high) / 2


def _plain_targets(plain_marks, labels) -> list[float] | None:
    """µs from the step's start to each of `labels`, the median over the plain steps whose
    marks carry exactly those labels in that order; None when there are none, or the trace
    has no marks (its one phase is calibrated on the median step time)."""
    if not plain_marks or len(labels) < 2:
        return None
    same = [[ms for _, ms in step] for step in plain_marks if [lb for lb, _ in step] == labels]
    if not same:
        return None
    return [statistics.median(col) * 1e3 for col in zip(*same)]


def _order(event):
    return event[0], event[1]


def _waits_kept(tr: StepTrace, unsynced) -> set:
    spans = [tr.spans[i] for i in unsynced if i in tr.spans]
    return {(s, e) for s, e in tr.syncs if not any(a <= s and e <= b for a, b in spans)}
