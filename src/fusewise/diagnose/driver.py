"""fusewise.diagnose(step): the seed's procedure on a user's step, as data.

The one orchestrator: `diagnose(step)` drives the step schedule (capture/schedule.py: warmup
untouched, `steps` timed, `steps` profiled, one recorded; warmup + 2·steps + 1 calls in all)
and `analyze(observation, ceilings)` turns any Observation (from here or from the script runner,
capture/script.py) into a Report: every registered analyzer (diagnose/registry.py), the
breakdown, and the memory-scaling fit when the observation has a second size.
"""

from __future__ import annotations

from .. import hardware
from ..capture.observation import Observation
from ..capture.schedule import StepSchedule
from ..capture.snapshot import Snapshot, restorable
from ..report import Device, Report, StepSummary
from . import registry, scaling
from .breakdown import top_ops


def diagnose(
    step,
    steps: int = 5,
    warmup: int = 2,
    *,
    restore=(),
    ceilings=None,
    top: int = 10,
    tokens_per_step: int | None = None,
):
    """Run `step` (a zero-argument callable doing one training or inference step) and return a
    Report: baseline, top ops with roofline, and findings ranked by predicted saving. With
    `restore=[model, optimizer, ...]` their state, their parameters' gradients and the random
    state are put back afterwards (capture/snapshot.py). tokens_per_step (a decode step: the
    batch) puts launches and tokens/s per token into the launch-overhead finding."""
    if tokens_per_step is not None and (
        not isinstance(tokens_per_step, int)
        or isinstance(tokens_per_step, bool)
        or tokens_per_step < 1
    ):
        raise ValueError(f"tokens_per_step must be a positive int, got {tokens_per_step!r}")
    schedule = StepSchedule(steps, warmup)
    saved = Snapshot(restorable(restore))
    try:
        ceil = ceilings or hardware.ceilings("cuda" if schedule.cuda else "cpu")
        schedule.start()
        done = False
        while not done:
            step()
            done = schedule.step_ended()
    finally:
        schedule.close()
        saved.put_back()
    obs = schedule.observation()
    # read by the timeline analyzer; Observation has no field for it yet (capture/ is not this
    # change's to edit), so it rides as an attribute until it gets one
    obs.tokens_per_step = tokens_per_step
    return analyze(obs, ceil, top=top)


def analyze(obs: Observation, ceil, *, top: int = 10) -> Report:
    """The Report of an observation: findings of every analyzer, by predicted saving; what could
    not run, and why; the top ops against the roofline."""
    findings, skipped = registry.run_all(obs, ceil)
    median_ms = obs.median_ms
    lost, lost_ms = kernels_without_op(obs)
    return Report(
        device=Device(
            name=ceil.device_name,
            type=ceil.device_type,
            bandwidth_GBps=ceil.bandwidth_GBps,
            matmul_TFLOPs=ceil.matmul_TFLOPs,
            ridge=ceil.ridge,
            matmul_dtype=ceil.headline_key,
            matmul_by_dtype=dict(ceil.matmul_by_dtype),
        ),
        step=StepSummary(
            median_ms=median_ms,
            peak_memory_bytes=obs.peak_memory_bytes,
            steps_measured=len(obs.times_ms),
            capture_overhead_ratio=obs.captured_ms / median_ms if median_ms else None,
            ops_recorded=len(obs.graph.ops),
            kernels_without_op=lost,
            kernels_without_op_ms=lost_ms,
            memory_scaling=_memory_scaling(obs),
        ),
        top=top_ops(
            obs.op_ms, obs.graph, ceil, median_ms, n=top, matmul_settings=obs.matmul_settings
        ),
        findings=findings,
        skipped=skipped,
    )


def kernels_without_op(obs: Observation) -> tuple[int, float]:
    """(count, device ms) of the recorded step's kernels launched by an op event the graph's walk
    never reached (capture/_trace.py, unwalked_kernels): ops the graph lacks. On the H200 the
    walk now and then lost the rest of a step from some point on (1-3 of 8 recorded demo steps,
    112-406 of 1,386 ops) and every finding in that part of the step predicted too little; the
    report warns of it (report.incomplete_graph) rather than stay silent. Kernels of an op the
    walk reached that is no graph op (an autograd Function's own launches) do not count."""
    trace = getattr(obs, "trace", None)
    if trace is None:
        return 0, 0.0
    return getattr(trace, "unwalked_kernels", 0), getattr(trace, "unwalked_us", 0.0) / 1e3


def _memory_scaling(obs: Observation) -> dict | None:
    """The fitted exponent for the step summary; a fit that fails is already listed under
    skipped by the memory-scaling analyzer (same fit), so here it only leaves the field out."""
    try:
        return scaling.fit_observations(obs)
    except Exception:
        return None
