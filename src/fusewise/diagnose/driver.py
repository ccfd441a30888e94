"""fusewise.diagnose(step): the seed's procedure on a user's step, as data.

What runs, in order: `warmup` calls of step(); `steps` timed calls (median = the baseline; peak
memory on a GPU); `steps` calls under torch.profiler (time per op; on a GPU the timeline of idle
gaps; DataLoader `__next__` callers counted meanwhile); one call under the op-graph recorder
(dataflow, bytes, FLOPs, source lines, each GPU op's device time). That is warmup + 2·steps + 1
calls in all. With
`restore=[model, optimizer, ...]` the state_dict of each, the gradients of their parameters and
the random state (torch's CPU and CUDA generators, Python's random, NumPy's) are saved first and
put back at the end, so a diagnosis can sit inside a real run without changing it: the next step
is the one an undiagnosed run would take (batches the step took from an iterator stay taken).
"""

from __future__ import annotations

import copy
import random
import statistics
import time

import torch

from .. import hardware
from ..capture import profiler
from ..capture.loader import loader_lines
from ..capture.opgraph import Recorder
from ..report import Report
from .attention import find_attention_fallback
from .breakdown import top_ops
from .chains import find_chains
from .quadratic import find_quadratic
from .syncs import find_syncs
from .timeline import find_gaps, timeline_from_profiler


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def diagnose(
    step, steps: int = 5, warmup: int = 2, *, restore=(), ceilings=None, top: int = 10
) -> Report:
    """Run `step` (a zero-argument callable doing one training or inference step) and return a
    Report: baseline, top ops with roofline, and findings ranked by predicted saving."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    saved = _Snapshot(_restorable(restore))
    cuda = torch.cuda.is_available()
    try:
        ceil = ceilings or hardware.ceilings("cuda" if cuda else "cpu")
        for _ in range(warmup):
            step()
        _sync(cuda)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            _sync(cuda)
            times.append((time.perf_counter() - t0) * 1e3)
        peak = torch.cuda.max_memory_allocated() if cuda else None
        prof = profiler.start(cuda)
        try:
            with loader_lines() as batch_lines:
                for _ in range(steps):
                    step()
                _sync(cuda)
        finally:
            profiler.stop(prof)
        op_ms = op_times(prof, steps, cuda)
        timeline = timeline_from_profiler(prof, steps)
        profiler.release(prof)  # before the recorder's profiler starts (capture/profiler.py)
        with Recorder() as rec:
            t0 = time.perf_counter()  # the recorded step itself: not the profiler's start/stop
            step()
            _sync(cuda)
            captured_ms = (time.perf_counter() - t0) * 1e3
    finally:
        saved.put_back()
    return build_report(
        rec.graph,
        op_ms,
        times,
        peak,
        ceil,
        captured_ms,
        top=top,
        timeline=timeline,
        loader_lines=batch_lines,
    )


def _restorable(restore) -> list:
    """restore= as a list of objects with state_dict() and load_state_dict() (one such object
    alone is taken as a list of one)."""
    if restore is None:
        return []
    if isinstance(restore, dict):
        raise TypeError(
            "restore= takes a list of objects, not a dict: pass list(your_dict.values())"
        )
    objs = [restore] if hasattr(restore, "state_dict") else restore
    try:
        objs = list(objs)
    except TypeError:
        objs = [objs]
    for obj in objs:
        if not (
            callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))
        ):
            raise TypeError(
                f"restore= takes the objects whose state the diagnosis must put back "
                f"(model, optimizer, LR scheduler, GradScaler: anything with "
                f"state_dict() and load_state_dict()), as a list; got "
                f"{type(obj).__name__}"
            )
    return objs


class _Snapshot:
    """What the diagnosis' extra steps change, saved before them: the state_dicts, the gradients
    of the parameters they hold (a run that accumulates gradients, or zeroes them in place,
    reads them), and the random state (a step with dropout, or a cold ceilings measurement)."""

    def __init__(self, objs: list):
        self.states = [(obj, copy.deepcopy(obj.state_dict())) for obj in objs]
        params: dict[int, torch.Tensor] = {}
        for obj in objs:
            if isinstance(obj, torch.nn.Module):
                found = obj.parameters()
            else:
                found = (p for g in getattr(obj, "param_groups", ()) for p in g["params"])
            params.update((id(p), p) for p in found)
        # (the gradient tensor itself too: references to it, e.g. DDP's bucket views, stay good)
        self.grads = [
            (p, p.grad, None if p.grad is None else p.grad.detach().clone())
            for p in params.values()
        ]
        self.rng = _rng_state() if objs else None

    def put_back(self) -> None:
        for obj, state in self.states:
            obj.load_state_dict(state)
        for p, grad, values in self.grads:
            if grad is not None:
                grad.detach().copy_(values)
            p.grad = grad
        if self.rng is not None:
            _set_rng_state(self.rng)


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():  # (initialises CUDA, as the diagnosis' syncs would anyway)
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])


def op_times(prof, steps: int, cuda: bool) -> dict[str, float]:
    """ms per step for each profiler op name: device time when the step ran on the GPU; CPU
    time for a CPU step (also when a GPU is present but the step never used it)."""
    events = prof.key_averages()
    on_device = cuda and sum(e.device_time_total for e in events) > 0
    return {
        e.key: (e.device_time_total if on_device else e.self_cpu_time_total) / 1e3 / steps
        for e in events
    }


def build_report(
    graph,
    op_ms: dict[str, float],
    times_ms: list[float],
    peak,
    ceil,
    captured_ms: float,
    *,
    top: int = 10,
    extra_findings=(),
    scaling_ran: bool = False,
    timeline=None,
    loader_lines=None,
) -> Report:
    """Run the analyzers on what was observed and assemble the Report (also used by the CLI's
    script runner, which observes steps differently and may add the memory-scaling findings)."""
    median_ms = statistics.median(times_ms)
    steps = len(times_ms)
    skipped = (
        []
        if scaling_ran
        else [
            {
                "analysis": "memory-scaling",
                "reason": "needs the step at two sizes: "
                "fusewise diagnose SCRIPT --sizes NAME=V1,V2",
            },
        ]
    )
    findings = list(extra_findings)
    for name, analyzer in (
        ("fusion-chains", lambda: find_chains(graph, ceil)),
        ("quadratic-intermediates", lambda: find_quadratic(graph)),
        ("attention-fallback", lambda: find_attention_fallback(graph, ceil)),
        (
            "host-syncs and timeline gaps",
            lambda: find_gaps(timeline, graph, find_syncs(graph), median_ms, loader_lines),
        ),
    ):
        try:
            findings += analyzer()
        except Exception as e:  # one analyzer's bug must not cost the user the whole report
            skipped.append({"analysis": name, "reason": f"failed: {type(e).__name__}: {e}"})
    findings.sort(key=lambda f: -f.est_saving_ms)
    if timeline is None:
        skipped.append(
            {
                "analysis": "timeline gaps (launch overhead, sync idle, data loading, idle host)",
                "reason": "no device activity in the profile (a CPU step)",
            }
        )
    return Report(
        device={
            "name": ceil.device_name,
            "type": ceil.device_type,
            "bandwidth_GBps": ceil.bandwidth_GBps,
            "matmul_TFLOPs": ceil.matmul_TFLOPs,
            "ridge": ceil.ridge,
        },
        step={
            "median_ms": median_ms,
            "peak_memory_bytes": peak,
            "steps_measured": steps,
            "capture_overhead_ratio": captured_ms / median_ms if median_ms else None,
            "ops_recorded": len(graph.ops),
        },
        top=top_ops(op_ms, graph, ceil, median_ms, n=top),
        findings=findings,
        skipped=skipped,
    )
