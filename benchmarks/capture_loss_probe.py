"""Does the recorded step's op graph keep every op? On the H200 1-3 of every 8 recorded demo
steps lost the rest of the step's ops from ~27 ms into the session on: their kernels were in the
profile, joined to no op of the graph (results README, 2026-12-03 night). This records the demo's
naive step (and a 0.94e9-parameter one) several times and prints, per capture, the graph's ops,
the kernels that joined no op, and every event of the profiler's tree that is neither an op nor
a Python call yet holds ops below it (what capture/_event_graph.py did not walk into before it
walked into events of every kind).

    PYTHONPATH=src python benchmarks/capture_loss_probe.py [--captures demo:12,1b:3]
"""

from __future__ import annotations

import argparse
import collections
import warnings

import torch
from torch._C._profiler import _EventType

from fusewise.capture import profiled, profiler
from fusewise.examples.gpt import GPTConfig, make_step

CASES = {  # capture_overhead.py's: the demo's step and a 0.94e9-parameter one
    "demo": GPTConfig(vocab=32768, seq=1024, d_model=1024, heads=16, layers=4, batch=8),
    "1b": GPTConfig(vocab=32768, seq=2048, d_model=2048, heads=16, layers=16, batch=4),
}
PYTHON = (_EventType.PyCall, _EventType.PyCCall)


def holders(roots, t0: int) -> list[tuple]:
    """(kind, name, start ms, length ms, ops below) of each event that is neither an op nor a
    Python call and has ops below it."""
    found = []

    def ops_below(e) -> int:
        return sum((c.tag == _EventType.TorchOp) + ops_below(c) for c in e.children)

    stack = list(roots)
    while stack:
        e = stack.pop()
        if e.tag not in PYTHON and e.tag != _EventType.TorchOp:
            n = ops_below(e)
            if n:
                start = (e.start_time_ns - t0) / 1e6
                length = (e.end_time_ns - e.start_time_ns) / 1e6
                found.append((str(e.tag), e.name, round(start, 2), round(length, 2), n))
        stack.extend(e.children)
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--captures", default="demo:12,1b:3", help="case:captures,...")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    for item in args.captures.split(","):
        name, n = item.split(":")
        probe(name, int(n))


def probe(name: str, captures: int) -> None:
    cuda = torch.cuda.is_available()  # on the CPU: the golden graphs' small step, a dry run
    if cuda:
        step, _, _ = make_step(CASES[name], variant="naive", device="cuda", dtype=torch.bfloat16)
    else:
        step, _, _ = make_step(GPTConfig(), variant="naive", device="cpu", dtype=torch.float32)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        step()
    sync()
    incomplete = 0
    for i in range(captures):
        hooks = profiler.mark_optimizer_steps()
        prof = profiled.start(cuda)
        step()
        sync()
        for h in hooks:
            h.remove()
        profiler.stop(prof)
        roots = prof.profiler.kineto_results.experimental_event_tree()
        t0 = min(r.start_time_ns for r in roots)
        held = holders(roots, t0)
        graph = profiled.graph_from_profile(prof, cuda)
        trace = profiled.graph_from_profile.trace
        lost = [k for k in trace.kernels if k.op < 0] if trace else []
        unwalked = trace.unwalked_kernels if trace else 0
        phases = dict(collections.Counter(op.phase for op in graph.ops))
        prof.profiler.kineto_results = None
        profiler.collect()
        incomplete += bool(lost)
        print(
            f"{name} capture {i}: {len(graph.ops)} ops {phases}, {len(lost)} kernels without an "
            f"op ({unwalked} of ops the walk never reached)"
            + (f" (first issued at {min(k.issue_us for k in lost) / 1e3:.2f} ms)" if lost else "")
            + f"; events of another kind holding ops: {held or 'none'}",
            flush=True,
        )
    print(f"# {name}: {incomplete} of {captures} captures lost kernels' ops")
    del step
    if cuda:
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
