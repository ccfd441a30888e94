"""The step schedule of every diagnosis, whoever drives it.

Counting step ends: the first `warmup` steps run untouched, the next `steps` are timed (median =
the baseline; the allocator's peak on a GPU), the next `steps` run under torch.profiler (time per
op; on a GPU the timeline of idle gaps; the lines that take DataLoader batches), and the next one
under the op-graph capture (dataflow, bytes, FLOPs, source lines, each GPU op's device time):
warmup + 2·steps + 1 steps in all. A step is timed from the end of the one before (after a
device sync), so it includes whatever the loop does between steps. The profiled steps run back
to back, without a sync between them, as in the user's loop.

Drivers: fusewise.diagnose(step) calls step_ended() after each call of step(); the script runner
(capture/script.py) calls it at each optimizer.step() or fusewise.step(). step_ended() returns
True once the Observation is complete.
"""

from __future__ import annotations

import os
import time

import torch

from ..hardware import matmul_settings
from . import _deferred, profiler
from .loader import loader_lines
from .observation import Observation
from .opgraph import Recorder
from .profiled import ProfiledCapture
from .timeline import op_times, timeline_from_profiler

# How the recorded step becomes an op graph: "profiler" (one torch.profiler session, light enough
# to leave on: capture/profiled.py) or "recorder" (the Python dispatch-mode recorder:
# capture/opgraph.py). FUSEWISE_CAPTURE overrides the default.
CAPTURES = {"profiler": ProfiledCapture, "recorder": Recorder}
DEFAULT_CAPTURE = "profiler"


def capture_kind(capture: str | None = None) -> str:
    kind = capture or os.environ.get("FUSEWISE_CAPTURE") or DEFAULT_CAPTURE
    if kind not in CAPTURES:
        raise ValueError(f"capture must be one of {sorted(CAPTURES)}, got {kind!r}")
    return kind


class StepSchedule:
    def __init__(
        self, steps: int, warmup: int, *, cuda: bool | None = None, capture: str | None = None
    ):
        if steps < 1 or warmup < 0:
            raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
        self.capture = capture_kind(capture)
        self.steps, self.warmup = steps, warmup
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self.ends = 0
        self.times_ms: list[float] = []
        self.peak = None
        self.op_ms, self.timeline, self.loader_lines = None, None, None
        self.graph, self.captured_ms, self.matmul_settings = None, None, None
        self.trace = None
        self.marks_ms: list = []
        self._prof = self._loader_cm = self._recorder = None
        self._marks: list = []  # optimizer-step marker hooks while the profiled steps run
        self._t = None

    @property
    def needed(self) -> int:
        """Step ends the schedule needs."""
        return self.warmup + 2 * self.steps + 1

    @property
    def complete(self) -> bool:
        return self.captured_ms is not None

    def phase(self, step: int) -> str:
        """What the schedule does in step `step` (1-based)."""
        w, s = self.warmup, self.steps
        if step <= w:
            return "a warm-up step"
        if step <= w + s:
            return "a timed step"
        return "a profiled step" if step <= w + 2 * s else "the recorded step"

    def start(self) -> None:
        """The first step starts now (timed from here when warmup is 0)."""
        # optimizer steps marked for the timeline's phases, from now until close(): taken here,
        # before any step, so that the hooks are in place before a script's first
        # optimizer.step() (profiler.mark_optimizer_steps says why that matters)
        self._unmark()
        self._marks = profiler.mark_optimizer_steps()
        if self.warmup == 0:
            self._begin_timing()
        self._t = time.perf_counter()

    def step_ended(self, *, inside_optimizer_step: bool = False) -> bool:
        """A step ended: advance the schedule. True once the observation is complete.
        inside_optimizer_step: called from optimizer.step()'s hook (the script runner); the
        recorded step's profiler session then starts once that step has returned
        (capture/_deferred.py says why)."""
        if self.complete:
            raise RuntimeError("the schedule is complete; no more steps are observed")
        ended = time.perf_counter()  # the step's host work, before any sync
        k, w, s = self.ends + 1, self.warmup, self.steps
        if not w + s < k < w + 2 * s:
            # Not between profiled steps: a sync there would put a host wait and the GPU's idle
            # after it into the profile (a host-sync finding of the diagnosis' own making)
            self._sync()
        now = time.perf_counter()
        self.ends = k
        if w < k <= w + s:
            self.times_ms.append((now - self._t) * 1e3)
            marks = profiler.note_host_marks(k < w + s)  # collecting for the next one too
            if marks and marks[0][0] == profiler.OPT_END:
                marks = marks[1:]  # the last step's optimizer, whose hook ran after its end
            self.marks_ms.append(
                [(label, (t - self._t) * 1e3) for label, t in marks]
                + [("end", (ended - self._t) * 1e3)]
            )
        if k == w + s:
            if self.cuda:
                self.peak = torch.cuda.max_memory_allocated()
            self._prof = profiler.start(self.cuda)
            self._loader_cm = loader_lines()  # the lines that take batches meanwhile
            self.loader_lines = self._loader_cm.__enter__()
        if k == w + 2 * s:
            profiler.stop(self._prof)
            self._loader_cm.__exit__(None, None, None)
            self._loader_cm = None
            self._read_profile()
            if not (
                inside_optimizer_step
                and self.capture == "profiler"
                and _deferred.after_optimizer_step(self._start_recording)
            ):
                self._start_recording()
        if k == w + 2 * s + 1:
            if self._recorder is None:  # still waiting for a Python call to start it
                _deferred.disarm()
                raise RuntimeError(
                    "the recorded step ended before its capture started (no Python call "
                    "after optimizer.step() returned); run it with FUSEWISE_CAPTURE=recorder"
                )
            self._recorder.__exit__(None, None, None)
            self.graph, self.trace = self._recorder.graph, getattr(self._recorder, "trace", None)
            self._recorder = None
            self.captured_ms = (now - self._t) * 1e3  # the recorded step alone
            self.matmul_settings = matmul_settings()  # as the step ran (TF32 or not)
            return True
        if k == w:
            self._begin_timing()
        self._t = time.perf_counter()
        return False

    def _start_recording(self) -> None:
        self._recorder = CAPTURES[self.capture]().__enter__()

    def observation(self, *, size: tuple[str, float] | None = None) -> Observation:
        if not self.complete:
            raise RuntimeError(f"the schedule saw {self.ends} of the {self.needed} steps it needs")
        return Observation(
            graph=self.graph,
            times_ms=self.times_ms,
            op_ms=self.op_ms,
            captured_ms=self.captured_ms,
            device="cuda" if self.cuda else "cpu",
            peak_memory_bytes=self.peak,
            timeline=self.timeline,
            loader_lines=self.loader_lines,
            size=size,
            matmul_settings=self.matmul_settings,
            trace=self.trace,
            marks_ms=self.marks_ms,
        )

    def close(self) -> None:
        """Close what an unfinished schedule left open (the step raised, the script ended)."""

        def exit_(ctx):
            ctx.__exit__(None, None, None)

        _deferred.disarm()  # a recorded step whose session never started
        profiler.note_host_marks(False)

        # the profiler through profiler.stop: its warning filter applies to an aborted run too
        for ctx, stop in (
            (self._recorder, exit_),
            (self._prof, profiler.stop),
            (self._loader_cm, exit_),
        ):
            if ctx is not None:
                try:
                    stop(ctx)
                except Exception:  # already closed
                    pass
        if self._prof is not None:
            profiler.release(self._prof)
        self._unmark()
        self._prof = self._loader_cm = self._recorder = None
        profiler.collect()

    def _unmark(self) -> None:
        for h in self._marks:
            h.remove()
        self._marks = []

    def _begin_timing(self) -> None:
        profiler.note_host_marks(True)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _read_profile(self) -> None:
        """Op times and the timeline, read as soon as the profile stops, and its results freed
        before the next profiler session starts (capture/profiler.py says why)."""
        self.op_ms = op_times(self._prof, self.steps, self.cuda)
        self.timeline = timeline_from_profiler(self._prof, self.steps)
        profiler.release(self._prof)
        self._prof = None
        profiler.collect()  # before the recorder's session starts
