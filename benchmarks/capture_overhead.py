"""Capture overhead: a step under each op-graph capture against the plain step, and the seconds
the graph takes to build afterwards. Captures: "recorder" (capture/opgraph.py, Python dispatch
modes), "profiler" (capture/profiled.py, one torch.profiler session: the default) and, to price
with_stack, "profiler-nostack" (the same session without stacks; no graph); with --options also
the session without profile_memory, without record_shapes, with none of the three, and with all
three but no CUDA activity.

    PYTHONPATH=src python benchmarks/capture_overhead.py            # GPU: the two cases below
    PYTHONPATH=src python benchmarks/capture_overhead.py --cpu      # CPU: small real models

GPU cases (bf16, naive variant of fusewise.examples.gpt, per-parameter AdamW loop):
  demo: GPTConfig(vocab=32768, seq=1024, d_model=1024, heads=16, layers=4, batch=8), the demo's;
  1b:   GPTConfig(vocab=32768, seq=2048, d_model=2048, heads=16, layers=16, batch=4), 0.94e9
        parameters.
Each round runs a plain step, a recorder step and a profiler step, interleaved; the step times
are medians over the rounds (each step timed from its start to a device sync after it; the
capture's start is inside, the graph build after it is reported apart as build_s). start_ms is
the capture's start alone (for the profiler: kineto's set-up and CUPTI's attach, paid again by
every session since fusewise detaches CUPTI at each stop), and step_ratio the step under the
capture without it, as the diagnosis times its recorded step (capture/schedule.py starts the
session before the step's clock). The table is printed last; CSV rows go to
$OUT/capture_overhead.csv when OUT is set.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _rows import commit  # noqa: E402

from fusewise.capture import profiler  # noqa: E402
from fusewise.capture.opgraph import Recorder  # noqa: E402
from fusewise.capture.profiled import ProfiledCapture  # noqa: E402
from fusewise.examples.gpt import GPTConfig, make_step  # noqa: E402

GPU_CASES = {
    "demo": (GPTConfig(vocab=32768, seq=1024, d_model=1024, heads=16, layers=4, batch=8), 5),
    "1b": (GPTConfig(vocab=32768, seq=2048, d_model=2048, heads=16, layers=16, batch=4), 3),
}
CPU_CASES = {
    "cpu-small": (GPTConfig(), 5),  # the golden graphs' step
    "cpu-medium": (GPTConfig(vocab=8192, seq=256, d_model=256, heads=8, layers=4, batch=4), 3),
}


class _Bare:
    """A torch.profiler session as the profiler capture's, with some of its options off (no
    graph is built): what each option costs. `options`: the profile's keyword arguments."""

    options: dict = {}
    cuda = True  # trace CUDA (when there is a GPU)

    def __enter__(self):
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda and torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = profiler.enter(torch.profiler.profile(activities=acts, **self.options))
        self.graph = None
        return self

    def __exit__(self, *exc):
        profiler.stop(self._prof)
        self._prof.profiler.kineto_results = None
        profiler.collect()


def _session(cuda: bool = True, **options):
    return type("_Session", (_Bare,), {"options": options, "cuda": cuda})


CAPTURES = {
    "recorder": Recorder,
    "profiler": ProfiledCapture,
    "profiler-nostack": _session(record_shapes=True, profile_memory=True),
}
# with --options: one option off at a time, and none (CPU and CUDA activities only)
OPTION_SESSIONS = {
    "profiler-nomemory": _session(record_shapes=True, with_stack=True),
    "profiler-noshapes": _session(profile_memory=True, with_stack=True),
    "profiler-bare": _session(),
    # every option, CPU activity only: what tracing CUDA (CUPTI's runtime callbacks and kernel
    # records) adds to a launch-bound step
    "profiler-nocuda": _session(
        cuda=False, record_shapes=True, profile_memory=True, with_stack=True
    ),
}


_phases: dict[str, list] = {}  # ops by phase in each round's graph, by capture (--phases)


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _captured(capture, step, cuda: bool) -> tuple[float, float, float, int]:
    """(seconds of the capture's start, of the step under it, of the graph's build; ops in the
    graph)."""
    _sync(cuda)
    t0 = time.perf_counter()
    cap = capture().__enter__()
    t1 = time.perf_counter()
    step()
    _sync(cuda)
    t2 = time.perf_counter()
    cap.__exit__(None, None, None)
    t3 = time.perf_counter()
    if cap.graph is not None:
        _phases.setdefault(type(cap).__name__, []).append(
            dict(collections.Counter(op.phase for op in cap.graph.ops))
        )
    return t1 - t0, t2 - t1, t3 - t2, len(cap.graph.ops) if cap.graph else 0


def measure(name: str, cfg: GPTConfig, rounds: int, cuda: bool) -> list[dict]:
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    step, model, _ = make_step(cfg, variant="naive", device=device, dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    for _ in range(3):
        step()
    _sync(cuda)
    plain, starts, under = [], {k: [] for k in CAPTURES}, {k: [] for k in CAPTURES}
    builds, ops = {k: [] for k in CAPTURES}, {}
    for _ in range(rounds):
        t = time.perf_counter()
        step()
        _sync(cuda)
        plain.append(time.perf_counter() - t)
        for kind, capture in CAPTURES.items():
            a, s, b, n = _captured(capture, step, cuda)
            starts[kind].append(a)
            under[kind].append(s)
            builds[kind].append(b)
            ops[kind] = n
    base = statistics.median(plain)
    rows = []
    for kind in CAPTURES:
        with_start = [a + s for a, s in zip(starts[kind], under[kind])]
        ms = statistics.median(with_start)
        step_ms = statistics.median(under[kind])
        # each round's step under the capture against that round's plain step: the spread the
        # host's speed, which moves within a process, leaves on the ratio
        per_round = sorted(s / p for s, p in zip(under[kind], plain))
        rows.append(
            dict(
                case=name,
                capture=kind,
                params=params,
                ops=ops[kind],
                plain_ms=round(base * 1e3, 2),
                captured_ms=round(ms * 1e3, 2),
                ratio=round(ms / base, 2),
                start_ms=round(statistics.median(starts[kind]) * 1e3, 2),
                step_ms=round(step_ms * 1e3, 2),
                step_ratio=round(step_ms / base, 2),
                round_ratio_min=round(per_round[0], 2),
                round_ratio_median=round(statistics.median(per_round), 2),
                round_ratio_max=round(per_round[-1], 2),
                build_s=round(statistics.median(builds[kind]), 2),
                rounds=rounds,
                device=torch.cuda.get_device_name() if cuda else "cpu",
                torch=torch.__version__,
                commit=commit(),
            )
        )
    del step, model
    if cuda:
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="small real models on the CPU")
    ap.add_argument("--cases", nargs="*", help="a subset of the cases, by name")
    ap.add_argument("--phases", action="store_true", help="ops by phase in every round's graph")
    ap.add_argument("--rounds", type=int, help="rounds per case (default: the case's own)")
    ap.add_argument(
        "--options", action="store_true", help="also sessions with one option off, and none"
    )
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    cuda = torch.cuda.is_available() and not args.cpu
    cases = GPU_CASES if cuda else CPU_CASES
    if args.options:
        CAPTURES.update(OPTION_SESSIONS)
    rows = []
    for name, (cfg, rounds) in cases.items():
        if args.cases and name not in args.cases:
            continue
        _phases.clear()
        rows += measure(name, cfg, args.rounds or rounds, cuda)
        print(f"{name} done", flush=True)
        if args.phases:
            for kind, rounds_seen in _phases.items():
                print(f"  {kind}: ops by phase, round by round: {rounds_seen}")
    if os.environ.get("OUT"):
        import csv

        path = os.path.join(os.environ["OUT"], "capture_overhead.csv")
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print(
        f"\n{'case':<11}{'capture':<17}{'params':>9}{'ops':>7}{'plain ms':>10}"
        f"{'captured ms':>13}{'ratio':>7}{'start ms':>10}{'step ratio':>12}{'build s':>9}"
        "  per round [min, max]"
    )
    for r in rows:
        print(
            f"{r['case']:<11}{r['capture']:<17}{r['params'] / 1e9:>8.2f}B{r['ops']:>7}"
            f"{r['plain_ms']:>10.1f}{r['captured_ms']:>13.1f}{r['ratio']:>7.2f}"
            f"{r['start_ms']:>10.1f}{r['step_ratio']:>12.2f}{r['build_s']:>9.2f}"
            f"  {r['round_ratio_median']:.2f} [{r['round_ratio_min']:.2f},"
            f" {r['round_ratio_max']:.2f}]"
        )


if __name__ == "__main__":
    main()
