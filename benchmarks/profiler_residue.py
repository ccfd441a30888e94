"""Does a profiler session leave the process slower? Host time per step of two launch-bound steps
before and after profiler sessions, one process per mode, the modes alternated:

- kept:      fusewise.diagnose() of each step with TEARDOWN_CUPTI=0 (CUPTI stays attached after
             a session: torch's default, and fusewise's before b4cc608);
- fusewise:  the same with TEARDOWN_CUPTI unset (fusewise sets it to 1, and syncs after a stop);
- nolazy:    the same with DISABLE_CUPTI_LAZY_REINIT=1 too (kineto re-attaches CUPTI at once
             after finalizing it, rather than at the next session's start);
- lastonly:  TEARDOWN_CUPTI=1 but 0 around the stop of a session that is not a diagnosis' last
             (the last, the recorded step's, records shapes): CUPTI detached once a diagnosis;
- userfirst: as fusewise, after a plain torch.profiler session of the user's (CUDA traced, the
             variable unset: CUPTI left attached when fusewise's first session starts).

A diagnosis must come out the same in every mode: each one's recorded graph is summed (the GPU
time of its ops, and the largest op's share: at b4cc608 a session started while CUPTI was being
finalized gave the embedding 12 of 28 ms) and its top findings listed.

Each process times both steps twice before any session (the second pair is the host's drift
without a session), runs the sessions, times them twice after, captures the decode step in a
CUDA graph and replays it against the eager step's tokens (CUPTI re-attached and detached around
graphs crashed on CUDA < 12.6), runs the sessions again and times once more. A CPU-only Python
loop is timed beside each step as the host's own speed. GPU only.

python benchmarks/profiler_residue.py [--rounds 2] [--csv FILE]   (the child: --mode M)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings

MODES = ("kept", "fusewise", "nolazy", "lastonly", "userfirst")


def _steps():
    import torch
    from _pairs_build import build

    from fusewise.examples.decode import looping, make_decoder
    from fusewise.examples.gpt import GPTConfig

    model, cache, step = make_decoder(batch=1, device="cuda", dtype=torch.bfloat16)
    token = torch.zeros(1, dtype=torch.long, device="cuda")
    decode = looping(step, cache, token)
    small = GPTConfig(vocab=16384, seq=512, d_model=512, heads=8, layers=6, batch=8)
    gpt = build(small, set(), sync=False, device="cuda", dtype=torch.bfloat16)
    # name: (zero-argument step, what diagnose restores, the decoder's parts for the graph check)
    return {
        "decode": (decode, [model], (model, cache, step)),
        "gpt": (gpt[0], list(gpt[1:]), None),
    }


def _host_ms(step, n: int = 40) -> float:
    """Median host time per step, each from a device sync to a device sync."""
    import torch

    ms = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def _python_ms() -> float:
    """A CPU-only loop: what the host's own speed did meanwhile."""
    ms = []
    for _ in range(9):
        t0 = time.perf_counter()
        sum(i * i for i in range(20000))
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def _sessions(steps: dict, seen: list) -> float:
    """A diagnosis of every step; returns their wall seconds. Each diagnosis' recorded graph and
    top findings go into `seen`."""
    import importlib

    import fusewise

    driver = importlib.import_module("fusewise.diagnose.driver")
    analyze, kept = driver.analyze, []

    def keep(obs, ceil, **kw):  # the observation the report is made of
        kept.append(obs)
        return analyze(obs, ceil, **kw)

    t0 = time.perf_counter()
    for name, (step, restore, _) in steps.items():
        driver.analyze = keep
        try:
            report = fusewise.diagnose(step, steps=5, warmup=2, restore=restore)
        finally:
            driver.analyze = analyze
        ops = kept[-1].graph.ops
        ms = [o.ms or 0.0 for o in ops]
        top = max(ops, key=lambda o: o.ms or 0.0)
        findings = " ".join(
            f"{f.kind}/{f.pattern or '-'}:{f.est_saving_ms:.2f}" for f in report.findings[:4]
        )
        op_ms = sum((kept[-1].op_ms or {}).values())  # the profiled steps' session
        seen.append(
            f"{name},ops {len(ops)},gpu_ms {sum(ms):.2f},largest {top.name} {top.ms or 0:.2f},"
            f"profiled op_ms {op_ms:.2f},{findings}"
        )
    return time.perf_counter() - t0


def _graph_check(steps: dict) -> str:
    """The decode step captured in a CUDA graph after the sessions: same tokens as eager?"""
    import torch

    from fusewise import graphs

    _, cache, step = steps["decode"][2]
    token = torch.zeros(1, dtype=torch.long, device="cuda")
    cache.reset()
    eager = [token]
    for _ in range(8):
        eager.append(step(eager[-1]))
    cache.reset()
    captured = graphs.capture(step, token.clone())
    cache.reset()
    out = [token]
    for _ in range(8):
        out.append(captured(out[-1]).clone())
    same = all(torch.equal(a, b) for a, b in zip(eager, out))
    cache.reset()
    return "same" if same else "DIFFERENT"


def _last_only() -> None:
    """TEARDOWN_CUPTI=0 around the stop of a session that records no shapes (not the recorded
    step's); 1 otherwise, so that a later session re-attaches CUPTI (kineto's lazy re-init)."""
    from fusewise.capture import profiler

    stop = profiler.stop

    def stop_last(prof):
        if not getattr(prof, "record_shapes", False):
            os.environ["TEARDOWN_CUPTI"] = "0"
        try:
            stop(prof)
        finally:
            os.environ["TEARDOWN_CUPTI"] = "1"

    profiler.stop = stop_last


def _users_session(steps: dict) -> None:
    """A plain torch.profiler session over each step, as a user's own before the diagnosis."""
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts):
        for step, _, _ in steps.values():
            step()
        torch.cuda.synchronize()


def child(mode: str) -> None:
    warnings.simplefilter("ignore")
    if mode == "lastonly":
        _last_only()
    steps = _steps()
    for step, _, _ in steps.values():
        for _ in range(10):
            step()
    rows = []

    def time_all(phase: str) -> None:
        for name, (step, _, _) in steps.items():
            rows.append((phase, name, _host_ms(step), _python_ms()))

    time_all("before")
    time_all("before2")
    if mode == "userfirst":
        _users_session(steps)
    seen: list = []
    s1 = _sessions(steps, seen)
    time_all("after")
    time_all("after2")
    graph = _graph_check(steps)
    s2 = _sessions(steps, seen)
    time_all("after_again")
    env = os.environ.get("TEARDOWN_CUPTI", "unset")
    for line in seen:
        print(f"DIAG,{mode},{line}")
    for phase, name, ms, py in rows:
        print(f"ROW,{mode},{phase},{name},{ms:.4f},{py:.4f}")
    print(f"META,{mode},sessions_s,{s1:.3f},{s2:.3f},graph,{graph},TEARDOWN_CUPTI,{env}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=MODES)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + str(MODES))
    ap.add_argument("--csv")
    a = ap.parse_args()
    if a.mode:
        return child(a.mode)
    from _rows import commit

    here = os.path.dirname(os.path.abspath(__file__))
    rows, meta = [], []
    modes = a.modes.split(",")
    if not set(modes) <= set(MODES):
        ap.error(f"--modes: each of {MODES}, got {a.modes!r}")
    for r in range(a.rounds):
        for mode in modes:
            env = dict(os.environ)
            env.pop("TEARDOWN_CUPTI", None)
            env.pop("DISABLE_CUPTI_LAZY_REINIT", None)
            if mode == "kept":
                env["TEARDOWN_CUPTI"] = "0"
            if mode == "lastonly":
                env["TEARDOWN_CUPTI"] = "1"
            if mode == "nolazy":
                env["DISABLE_CUPTI_LAZY_REINIT"] = "1"
            p = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--mode", mode],
                env=env,
                cwd=here,
                capture_output=True,
                text=True,
                timeout=300,
            )
            lines = p.stdout.splitlines()
            if p.returncode:
                print(f"# {mode} round {r}: exit {p.returncode}\n" + p.stderr[-2000:])
            rows += [line.split(",")[1:] + [str(r)] for line in lines if line.startswith("ROW,")]
            meta += [f"round {r} " + line for line in lines if line.startswith(("META,", "DIAG,"))]
    print("\n".join(meta))
    print(f"# host ms per step (median of 40), commit {commit()}; python = a CPU-only loop's ms")
    print(f"{'mode':9} {'step':7} {'phase':12} {'ms':>8} {'python':>7}  round")
    for mode, phase, name, ms, py, r in rows:
        print(f"{mode:9} {name:7} {phase:12} {float(ms):8.3f} {float(py):7.3f}  {r}")
    summary(rows)
    if a.csv:
        import csv

        new = not os.path.exists(a.csv)
        with open(a.csv, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(["mode", "phase", "step", "host_ms", "python_ms", "round", "commit"])
            w.writerows(row + [commit()] for row in rows)


def summary(rows) -> None:
    """after / before per mode and step: the medians over rounds of each phase's ratio."""
    by = {}
    for mode, phase, name, ms, _py, r in rows:
        by[(mode, name, phase, r)] = float(ms)
    print("# after / before (each round's 'after' and 'after_again' over its 'before')")
    for mode in MODES:
        for name in ("decode", "gpt"):
            ratios = []
            drift = []
            for r in {k[3] for k in by}:
                b = by.get((mode, name, "before", r))
                if b is None:
                    continue
                drift.append(by[(mode, name, "before2", r)] / b)
                ratios += [by[(mode, name, ph, r)] / b for ph in ("after", "after2", "after_again")]
            if ratios:
                print(
                    f"{mode:9} {name:7} after/before {min(ratios):.3f}-{max(ratios):.3f}"
                    f"   before2/before {min(drift):.3f}-{max(drift):.3f}"
                )


if __name__ == "__main__":
    main()
