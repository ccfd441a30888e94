"""torch.profiler sessions as the diagnosis runs them: started with the device's activities, and
their kineto results freed as soon as they have been read.

Why freed by hand: a torch.profiler.profile sits in a reference cycle (its action map holds its
own bound methods), so dropping it frees nothing until a garbage collection, which may come after
the next profiler session has started. Kineto's results freed then crashed the process on the
H200 (SIGSEGV in free() from MemoryTraceLogger's destructor, torch 2.11): at exit, and inside
the next run's parsing with `--sizes`.

Why TEARDOWN_CUPTI is set (enter()): kineto leaves NVIDIA's CUPTI attached to the process after a
session that traced CUDA unless that variable is "1", and an attached CUPTI slows every later
CUDA call of the process (pytorch/pytorch#144455: 10-20% of a training step). A diagnosis must
not leave the user's process slower than it found it, nor time its steps after its own sessions
on a slower host than during them (benchmarks/profiler_residue.py measures both ways).
"""

from __future__ import annotations

import functools
import gc
import os
import time
import warnings

import torch


def start(cuda: bool) -> torch.profiler.profile:
    """A started profiler session: CPU ops, and CUDA kernels when `cuda`."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return enter(torch.profiler.profile(activities=acts))


def enter(prof: torch.profiler.profile) -> torch.profiler.profile:
    """Start a session, with the garbage collector paused until stop(prof) (see pause_gc), and
    CUPTI detached when it stops (see let_cupti_go: after the start, so that a session that
    fails to start, another profiler running, leaves the variable as it was)."""
    pause_gc(prof)
    try:
        with warnings.catch_warnings():
            # torch 2.11 warns on every session that events are not accumulated across cycles:
            # true, and nothing here accumulates them
            warnings.filterwarnings("ignore", message=".*Profiler clears events")
            prof.__enter__()
    except BaseException:
        resume_gc(prof)
        raise
    let_cupti_go(prof)
    return prof


TEARDOWN = "TEARDOWN_CUPTI"
# CUPTI teardown with CUDA graphs crashed before CUDA 12.6 (torch/profiler/profiler.py, which
# turns teardown off there when inductor's CUDA graphs are on); fixed in 12.6 (pytorch#146604).
TEARDOWN_SAFE_FROM = (12, 6)


def let_cupti_go(prof) -> bool:
    """Ask kineto to detach CUPTI when a session that traces CUDA stops (TEARDOWN_CUPTI=1, for
    the process: kineto reads it at the stop and again when a later session re-attaches). Left
    alone when the variable is already set (the user's choice, any value), when the session
    traces no CUDA, and on CUDA older than 12.6. A later torch.profiler session of the user's
    re-attaches CUPTI at its start and detaches it at its stop, without the sync stop() makes
    (README). Returns whether the variable was set here."""
    if TEARDOWN in os.environ:
        return False
    if not _traces_cuda(prof):
        return False
    if _cuda_version(torch.version.cuda) < TEARDOWN_SAFE_FROM:
        return False
    os.environ[TEARDOWN] = "1"
    return True


def _traces_cuda(prof) -> bool:
    return torch.profiler.ProfilerActivity.CUDA in (getattr(prof, "activities", None) or ())


def _cuda_version(text: str | None) -> tuple[int, ...]:
    """ "12.6" -> (12, 6); None (a CPU or ROCm build) or anything unreadable -> ()."""
    try:
        return tuple(int(part) for part in (text or "").split(".")[:2])
    except ValueError:
        return ()


def stop(prof: torch.profiler.profile) -> None:
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Profiler clears events")
            prof.__exit__(None, None, None)
        if os.environ.get(TEARDOWN) == "1" and _traces_cuda(prof):
            # kineto finalizes CUPTI from the next CUDA runtime call after the stop. Made here,
            # before another session can start: at b4cc608 the recorded step's session started
            # first and CUPTI was finalized under it (on the H200 its kernels' times went to the
            # step's first op, the embedding: 12 of 28 ms).
            torch.cuda.synchronize()
    finally:
        resume_gc(prof)


# Sessions that hold the collector paused. A session's start collects the garbage left so far
# (other sessions' profiles among it, a script's own or a test's never freed by hand) and the
# collector stays off until it stops: a profile's kineto objects freed by a collection that runs
# inside a session crashed the process (the H200 above). A few steps' reference cycles wait for
# the session's end instead. (The CPU suite's segfaults at a session's stop had another cause:
# capture/_deferred.py.)
_GC_PAUSED = "_fusewise_gc_paused"
_gc_holds = 0
_gc_was_enabled = True
# Whether a session may have left garbage since the last collect() (unknown at first). A full
# collection walks every live object: ~100 ms in a process holding a model and its diagnosis
# (the H200's demo: the recorded step went from 1.2x to 4.9x its plain time with a collection
# at its session's start). The schedule collects once the profiled steps' session is read, so
# the recorded step's session need not collect again.
_garbage = True


def pause_gc(session) -> None:
    global _gc_holds, _gc_was_enabled
    if getattr(session, _GC_PAUSED, False):
        return
    if _gc_holds == 0:
        if _garbage:
            collect()
        _gc_was_enabled = gc.isenabled()
        gc.disable()
    _gc_holds += 1
    setattr(session, _GC_PAUSED, True)


def resume_gc(session) -> None:
    """Undo pause_gc(session); a second call (a session stopped twice) does nothing."""
    global _gc_holds, _garbage
    if not getattr(session, _GC_PAUSED, False):
        return
    setattr(session, _GC_PAUSED, False)
    _gc_holds -= 1
    _garbage = True  # the session's objects, once dropped
    if _gc_holds == 0 and _gc_was_enabled:
        gc.enable()


def release(prof) -> None:
    """Free a stopped session's kineto results now. Its events are parsed first (the profile
    caches them), so events() and key_averages() still answer afterwards."""
    inner = getattr(prof, "profiler", None) or prof  # torch.profiler wraps torch.autograd's
    if getattr(inner, "kineto_results", None) is not None:
        inner.function_events  # noqa: B018  (parses and caches the events)
        inner.kineto_results = None


def collect() -> None:
    """Collect the cyclic garbage of sessions already dropped, now, while no session runs: a
    profile's objects freed by a later, automatic collection crashed the H200 inside the next
    session (the recorder's; faulthandler showed "Garbage-collecting" in the segfaulting frame),
    in tests/test_cli.py about one run in two, at this commit's parent and before the refactor."""
    global _garbage
    gc.collect()
    _garbage = False


# Optimizer steps, marked through torch's global optimizer hooks as instants on the profiler's
# clock. torch's own "Optimizer.step#" ranges are not used: a session that starts or stops inside
# one (the script runner ends a step, and starts or stops a session, in optimizer.step()'s post
# hook) records it with a wrong end.
OPT_BEGIN, OPT_END = "fusewise.optimizer.begin", "fusewise.optimizer.end"


# loss.backward() marked as a range, on the profiler's clock and on the host's (below)
BACKWARD = "fusewise.backward"

_marking = 0  # sessions that want the markers now
_hooks_registered = False
# (label, time.perf_counter()) of each mark while a schedule times its plain steps, to set the
# recorded step's phases against (diagnose/_replay.py calibrates its host clock on them)
_host_marks: list | None = None


def note_host_marks(on: bool) -> list:
    """Start (on) or stop collecting the marks' host times; returns those collected so far."""
    global _host_marks
    taken, _host_marks = _host_marks or [], ([] if on else None)
    return taken


def _note(label: str) -> None:
    if _host_marks is not None:
        _host_marks.append((label, time.perf_counter()))


def _mark(name: str):
    def hook(*_):
        if _marking:
            _note(name)
            with torch.profiler.record_function(name):  # an instant on the profiler's clock
                pass

    return hook


def _marked_backward(backward):
    """torch.autograd.backward (what Tensor.backward calls), marked while a session wants it."""

    @functools.wraps(backward)
    def marked(*args, **kwargs):
        if not _marking:
            return backward(*args, **kwargs)
        _note(BACKWARD + ".begin")
        with torch.profiler.record_function(BACKWARD):
            out = backward(*args, **kwargs)
        _note(BACKWARD + ".end")
        return out

    marked.__fusewise_marked__ = True
    return marked


class _Marking:
    def remove(self) -> None:
        global _marking
        if self._on:
            self._on, _marking = False, _marking - 1

    def __init__(self):
        global _marking
        self._on, _marking = True, _marking + 1


def mark_optimizer_steps() -> list:
    """Mark optimizer steps and backward calls until .remove() is called on each handle
    returned. The two global hooks (and torch.autograd.backward's wrapper) are registered once
    per process and left in place, emitting only while some session wants them: registering
    or removing a global optimizer hook inside another one's call (a script's step ends in
    optimizer.step()'s post hook, where sessions start and stop) breaks torch's loop over them
    ("OrderedDict mutated during iteration")."""
    global _hooks_registered
    if not _hooks_registered:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        register_optimizer_step_pre_hook(_mark(OPT_BEGIN))
        register_optimizer_step_post_hook(_mark(OPT_END))
        if not getattr(torch.autograd.backward, "__fusewise_marked__", False):
            torch.autograd.backward = _marked_backward(torch.autograd.backward)
        _hooks_registered = True
    return [_Marking()]


def optimizer_ranges(marks) -> list[tuple[int, int, int]]:
    """(thread, start, end) of each optimizer step from (time, thread, is a begin) markers; a
    step still running when the session stopped lasts to the end."""
    ranges, open_at = [], {}
    for t, tid, begin in sorted(marks):
        if begin:
            open_at[tid] = t
        elif tid in open_at:
            ranges.append((tid, open_at.pop(tid), t))
    return ranges + [(tid, t, 2**63) for tid, t in open_at.items()]
