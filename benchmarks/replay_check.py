"""The launch-bound GPU test's step (tests/test_replay.py::_observe) replayed, with the numbers
behind its verdict: the trace's syncs, marks and phase bounds, each phase's cost per op, the
replayed waits, and the replay with the waiting-phase rule off. GPU only; a debugging aid."""

import importlib
import sys

sys.path.insert(0, "tests")

from test_replay import _observe  # noqa: E402

from fusewise.diagnose import _measured  # noqa: E402

replay_module = importlib.import_module("fusewise.diagnose._replay")

for attempt in range(3):
    obs = _observe("cuda")
    tr = obs.trace
    last_op = max(e for _, e in tr.spans.values())
    r = _measured.replay_of(obs)
    print(f"--- attempt {attempt}: plain {obs.median_ms:.3f} ms, replayed {r.base_ms:.3f}")
    print("syncs", [(round(a), round(b)) for a, b in tr.syncs], "last op end", round(last_op))
    print("end_us", round(tr.end_us), "step_end_us", round(tr.step_end_us))
    print("marks", [(m, round(t)) for m, t in tr.marks], "bounds", [round(b) for b in r.bounds])
    print("ks", [round(k, 1) for k in r.ks], "gap", round(r.kernel_gap_us, 2))
    print("plain marks", obs.marks_ms[:2])
    waits = r._walk(r.ks, waits=True)[2]
    print("replayed waits", [(round(t), round(w)) for t, w in waits])
    old = replay_module.WAIT_MIN_US
    replay_module.WAIT_MIN_US = float("inf")
    obs.__dict__.pop("_replay", None)
    r2 = _measured.replay_of(obs)
    replay_module.WAIT_MIN_US = old
    print("rule off: ks", [round(k, 1) for k in r2.ks], "replayed", round(r2.base_ms, 3))
