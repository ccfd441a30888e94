"""Observe the steps of a user's script, in-process, for `fusewise diagnose SCRIPT`.

A step ends at each optimizer.step() (torch's global optimizer hooks, so any torch Optimizer) or
at each fusewise.step() call (for scripts without an optimizer: inference, decode). Counting step
ends: `warmup` steps run untouched, the next `steps` are timed, the next `steps` run under
torch.profiler, the next one under the op-graph recorder; then the script is stopped (a
BaseException raised from the hook, so a script's `except Exception` does not swallow it) and
the observations are returned. A script that ends sooner is reported with what it reached.
"""

from __future__ import annotations

import runpy
import sys
import time

import torch

from . import profiler
from .loader import loader_lines
from .opgraph import Recorder


class StopScript(BaseException):
    """Raised at a step end once the diagnosis has seen enough steps."""


_active = None  # the StepObserver of the script being run, if any


def step() -> None:
    """Mark the end of a step (for scripts without an optimizer). A no-op outside a diagnosis."""
    if _active is not None:
        _active.boundary()


class StepObserver:
    def __init__(self, steps: int, warmup: int):
        self.steps, self.warmup = steps, warmup
        self.cuda = torch.cuda.is_available()
        self.ends = 0
        self.times_ms: list[float] = []
        self.peak = None
        self.prof = None
        self.op_ms, self.timeline = None, None
        self._loader_cm, self.loader_lines = None, None
        self.recorder = None
        self.captured_ms = None
        self._t = None

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def boundary(self) -> None:
        self._sync()
        now = time.perf_counter()
        self.ends += 1
        k, w, s = self.ends, self.warmup, self.steps
        if w < k <= w + s:
            self.times_ms.append((now - self._t) * 1e3)
        if k == w + s and self.cuda:
            self.peak = torch.cuda.max_memory_allocated()
        if k == w + s:
            self.prof = profiler.start(self.cuda)
            self._loader_cm = loader_lines()  # the lines that take batches meanwhile
            self.loader_lines = self._loader_cm.__enter__()
        if k == w + 2 * s:
            profiler.stop(self.prof)
            self._loader_cm.__exit__(None, None, None)
            self._read_profile()
            self.recorder = Recorder().__enter__()
        if k == w + 2 * s + 1:
            self.recorder.__exit__(None, None, None)
            self.captured_ms = (now - self._t) * 1e3
            raise StopScript
        if k == w and self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self._t = time.perf_counter()

    def _read_profile(self) -> None:
        """Op times and the timeline, read from the profile as soon as it stops, and its results
        freed before the next profiler session starts (capture/profiler.py says why)."""
        from ..diagnose.driver import op_times
        from ..diagnose.timeline import timeline_from_profiler

        self.op_ms = op_times(self.prof, self.steps, self.cuda)
        self.timeline = timeline_from_profiler(self.prof, self.steps)
        profiler.release(self.prof)
        self.prof = None

    def run(self, path: str, argv: list[str]) -> None:
        global _active
        from torch.optim.optimizer import register_optimizer_step_post_hook

        hook = register_optimizer_step_post_hook(lambda *_: self.boundary())
        old_argv, _active = sys.argv, self
        sys.argv = [path, *argv]
        self._t = time.perf_counter()
        try:
            runpy.run_path(path, run_name="__main__")
        except StopScript:
            pass
        finally:
            sys.argv, _active = old_argv, None
            hook.remove()
            for ctx in (self.recorder, self.prof, self._loader_cm):  # ended mid-way: close
                if ctx is not None and self.captured_ms is None:
                    try:
                        ctx.__exit__(None, None, None)
                    except Exception:  # already closed
                        pass
            if self.prof is not None:
                profiler.release(self.prof)
                self.prof = None

    @property
    def complete(self) -> bool:
        return self.captured_ms is not None
