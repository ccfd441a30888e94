"""torch.profiler sessions as the diagnosis runs them: started with the device's activities, and
their kineto results freed as soon as they have been read.

Why freed by hand: a torch.profiler.profile sits in a reference cycle (its action map holds its
own bound methods), so dropping it frees nothing until a garbage collection, which may come after
the next profiler session has started. Kineto's results freed then crashed the process on the
H200 (SIGSEGV in free() from MemoryTraceLogger's destructor, torch 2.11): at exit, and inside
the next run's parsing with `--sizes`.
"""

from __future__ import annotations

import gc
import warnings

import torch


def start(cuda: bool) -> torch.profiler.profile:
    """A started profiler session: CPU ops, and CUDA kernels when `cuda`."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=acts)
    with warnings.catch_warnings():
        # torch 2.11 warns on every session that events are not accumulated across cycles:
        # true, and nothing here accumulates them
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        prof.__enter__()
    return prof


def stop(prof: torch.profiler.profile) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        prof.__exit__(None, None, None)


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
    gc.collect()
