"""Run a user's script for `fusewise diagnose SCRIPT`, in-process, as `python SCRIPT ARGS` would,
and drive the step schedule (capture/schedule.py) from where its steps end.

A step ends at each optimizer.step() (torch's global optimizer hooks, so any torch Optimizer) or
at each fusewise.step() call (for scripts without an optimizer: inference, decode). Once the
schedule is complete the script is stopped (a BaseException raised from the hook, so a script's
`except Exception` does not swallow it). A script that ends sooner is said with what it reached.
"""

from __future__ import annotations

import contextlib
import functools
import os
import runpy
import site
import sys
import sysconfig
import traceback

from .opgraph import _FUSEWISE_DIR, _TORCH_DIR, shown_path
from .schedule import StepSchedule

_SKIP_DIRS = (_TORCH_DIR, _FUSEWISE_DIR)


class StopScript(BaseException):
    """Raised at a step end once the diagnosis has seen enough steps."""


_active = None  # the ScriptRun of the script being run, if any


def step() -> None:
    """Mark the end of a step (for scripts without an optimizer, or with several). A no-op
    outside a diagnosis. Once a script calls it, optimizer steps no longer end steps."""
    if _active is not None:
        _active.explicit_end()


class ScriptRun:
    """One run of a script under a StepSchedule; `schedule.observation()` once `complete`."""

    def __init__(self, steps: int, warmup: int, *, schedule=StepSchedule, on_step_end=None):
        """schedule: the schedule's class (called with steps, warmup), StepSchedule for a
        diagnosis; on_step_end(n, optimizers): called at each step end before the schedule
        advances, with the optimizers seen ending steps so far (fusewise verify patches there)."""
        self.steps, self.warmup = steps, warmup
        self._schedule_cls, self._on_step_end = schedule, on_step_end
        self.schedule = schedule(steps, warmup)
        self.optimizers: list = []  # the optimizers whose step() ended steps, in order seen
        self.ended, self.exit_code, self.error = None, None, None
        self._stepping: list = []  # optimizers inside step(), outermost first
        self._explicit, self._optimizers = False, {}

    # --- what ends a step ---------------------------------------------------------------------

    def optimizer_start(self, opt, *_) -> None:
        if opt in self._stepping:  # its last step() raised before returning: forget it
            del self._stepping[self._stepping.index(opt) :]
        self._stepping.append(opt)

    def optimizer_end(self, opt, *_) -> None:
        """An optimizer's step() returned: a step ends there, unless it ran inside another
        optimizer's step() (a wrapper such as ZeroRedundancyOptimizer) or the script marks its
        steps with fusewise.step(). Several optimizers in one iteration would cut it in pieces:
        the others' steps end nothing, and if the first one steps again before fusewise.step()
        was called (a whole iteration without it), the run stops with the way out."""
        if opt in self._stepping:
            del self._stepping[self._stepping.index(opt) :]
        if self._stepping or self._explicit:
            return
        if id(opt) not in self._optimizers:
            self.optimizers.append(opt)
        self._optimizers.setdefault(id(opt), type(opt).__name__)
        if len(self._optimizers) > 1:
            if id(opt) == next(iter(self._optimizers)):
                self.ended = "optimizers"
                raise StopScript
            return
        self._end_step(inside_optimizer_step=True)

    def explicit_end(self) -> None:
        """fusewise.step(): from its first call on, only it ends steps; the steps counted from
        optimizer.step() before then are forgotten and the schedule starts again."""
        if not self._explicit:
            self._explicit = True
            self.schedule.close()
            self.schedule = self._schedule_cls(self.steps, self.warmup)
            self.schedule.start()
        self._end_step()

    def _end_step(self, inside_optimizer_step: bool = False) -> None:
        if self._on_step_end is not None:
            self._on_step_end(self.schedule.ends + 1, self.optimizers)
        if self.schedule.step_ended(inside_optimizer_step=inside_optimizer_step):
            raise StopScript

    @property
    def complete(self) -> bool:
        return self.schedule.complete

    def run(self, path: str, argv: list[str]) -> None:
        """Run the script as `python path *argv` would, in this process (see _as_python_would).
        How it ended is kept in `self.ended`: "stopped" (enough steps), "finished", "exit"
        (SystemExit, code in `self.exit_code`), "raised" (the exception in `self.error`, in step
        `schedule.ends + 1`) or "optimizers" (several optimizers end steps)."""
        global _active
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        hooks = [
            register_optimizer_step_pre_hook(self.optimizer_start),
            register_optimizer_step_post_hook(self.optimizer_end),
        ]
        _active = self
        try:
            with _as_python_would(path, argv):
                self.schedule.start()
                runpy.run_path(os.path.abspath(path), run_name="__main__")
            self.ended = "finished"
        except StopScript:
            self.ended = self.ended or "stopped"
        except SystemExit as e:
            self.ended, self.exit_code = "exit", e.code
        except Exception as e:  # noqa: BLE001  (the user's error, reported with its step)
            self.ended, self.error = "raised", e
        finally:
            _active = None
            for h in hooks:
                h.remove()
            self.schedule.close()

    def shortfall(self, script: str) -> str:
        """Why an incomplete run gave no diagnosis, in words: how the script ended, after how
        many steps, how many were needed, and (for an exception) the traceback with the
        runner's own frames left out."""
        need = (
            f"the diagnosis needs {self.schedule.needed} (--warmup {self.warmup} + 2 x --steps "
            f"{self.steps} + 1). A step ends at each optimizer.step() or "
            f"fusewise.step()"
        )
        n = self.schedule.ends
        if self.ended == "optimizers":
            names = ", ".join(self._optimizers.values())
            return (
                f"{script}: {len(self._optimizers)} optimizers ({names}) each ended steps, "
                f"so each optimizer.step() would end a diagnosis step and cut an iteration "
                f"in pieces. Call fusewise.step() at the end of each iteration: once a "
                f"script calls it, only it ends steps."
            )
        if self.ended == "raised":
            e = self.error
            when = (
                f"in step {n + 1} ({self.schedule.phase(n + 1)})"
                if n
                else "before its first step ended (in start-up or step 1)"
            )
            said = f": {e}" if str(e) else ""
            hint = ""
            if _profiler_clash(e):
                hint = (
                    "\nThe script runs torch.profiler itself, which cannot nest with the "
                    "diagnosis' own profiler: diagnose it with its profiler off."
                )
            return (
                f"{script} raised {type(e).__name__} {when}{_innermost_user_frame(e)}"
                f"{said}{hint}\n\n{_traceback(e)}"
            )
        if self.ended == "exit":
            head = f"{script} exited (sys.exit({self.exit_code!r})) after {n} step(s); {need}."
            if n == 0 and self.exit_code not in (0, None):
                head += (
                    " It stopped before its first step: check the arguments it was given "
                    "(the script's own arguments go after --)."
                )
            return head
        return (
            f"{script} ended after {n} step(s); {need}; lower --steps/--warmup or run the "
            f"script longer."
        )


@contextlib.contextmanager
def _as_python_would(path: str, argv: list[str]):
    """What `python path *argv` sets up, for the duration of a run: sys.argv, sys.path with the
    script's folder first (symlinks resolved, so its sibling modules import); `__file__` is
    absolute (runpy). Put back afterwards: sys.argv, all of sys.path, the working directory (a
    script may chdir), and the modules of the user's own code imported meanwhile, unloaded so
    a second run (--sizes) imports them again and they read its arguments."""
    old_argv, old_path, old_cwd = sys.argv, list(sys.path), os.getcwd()
    old_modules = set(sys.modules)
    sys.argv = [path, *argv]
    folder = os.path.dirname(os.path.realpath(path))
    sys.path[:1] = [folder]
    try:
        yield
    finally:
        sys.argv = old_argv
        sys.path[:] = old_path
        os.chdir(old_cwd)
        for name in set(sys.modules) - old_modules:
            if _is_user_module(sys.modules.get(name)):
                del sys.modules[name]


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    paths = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(site.getsitepackages() + [site.getusersitepackages()])
    paths.add(_FUSEWISE_DIR)
    return tuple(os.path.realpath(p) + os.sep for p in paths if p)


def _is_user_module(module) -> bool:
    """A pure-Python module of the user's code: not the standard library, not an installed
    package, not fusewise (extension modules cannot be imported twice)."""
    file = getattr(module, "__file__", None)
    if not file or not file.endswith(".py"):
        return False
    return not os.path.realpath(file).startswith(_library_dirs())


def _profiler_clash(e: BaseException) -> bool:
    """A RuntimeError raised inside torch's profiler (its text varies: "Profiler is already
    enabled on this thread", "Can't disable Kineto profiler when it's not running", ...)."""
    profiler_code = (
        os.path.join(_TORCH_DIR, "profiler"),
        os.path.join(_TORCH_DIR, "autograd", "profiler"),
    )
    frames = traceback.extract_tb(e.__traceback__)
    return isinstance(e, RuntimeError) and any(f.filename.startswith(profiler_code) for f in frames)


_PLUMBING = (os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>")


def _is_plumbing(filename: str) -> bool:
    """A frame of this runner or of runpy (frozen runpy has no real path)."""
    return filename in _PLUMBING or os.path.abspath(filename) in _PLUMBING


def _traceback(e: BaseException) -> str:
    """The exception as Python prints it, without the frames of this runner and runpy (the
    script's frames then come first)."""
    te = traceback.TracebackException.from_exception(e)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if not _is_plumbing(f.filename)]
    )
    return "".join(te.format()).rstrip()


def _innermost_user_frame(e: BaseException) -> str:
    """' at path:line' of the innermost frame outside torch and fusewise, or ''."""
    for f in reversed(traceback.extract_tb(e.__traceback__)):
        if _is_plumbing(f.filename):
            continue
        shown = shown_path(f.filename, _SKIP_DIRS)
        if shown is not None:
            return f" at {shown}:{f.lineno}"
    return ""
