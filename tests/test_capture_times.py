"""Per-op times that add up: the recorder times the op alone (not its own bookkeeping), and the
profiler's per-name times are self times, so they partition the step instead of counting a
child's work again under its parent."""

import time
from types import SimpleNamespace

import torch

from fusewise.capture import opgraph, profiler
from fusewise.capture.timeline import op_times, self_times


def test_recorded_op_time_leaves_out_the_recorders_bookkeeping(monkeypatch):
    real = opgraph.cost.aten_op

    def slow_cost(*a, **kw):  # bookkeeping of 5 ms per op, after the op ran
        time.sleep(0.005)
        return real(*a, **kw)

    monkeypatch.setattr(opgraph.cost, "aten_op", slow_cost)
    x = torch.randn(64)
    x * 1.5 + 1.0  # warm (first calls initialise lazily)
    with opgraph.Recorder(profile=False) as rec:
        for _ in range(5):
            x = x * 1.5 + 1.0
    assert len(rec.graph.ops) == 10
    # 50 ms of bookkeeping in all; the ops themselves take microseconds (a loaded machine may
    # stall one of them, so the bound is on the sum, not on each)
    ms = [op.ms for op in rec.graph.ops]
    assert all(m > 0 for m in ms) and sum(ms) < 25.0, ms


def _ev(key, cpu_self, dev_total, dev_self):
    return SimpleNamespace(
        key=key,
        self_cpu_time_total=cpu_self,
        device_time_total=dev_total,
        self_device_time_total=dev_self,
    )


def test_device_times_are_self_times():
    """aten::linear launches nothing itself: its addmm child's kernel is not counted twice."""
    events = [_ev("aten::linear", 5.0, 1000.0, 0.0), _ev("aten::addmm", 20.0, 1000.0, 1000.0)]
    ms = self_times(events, steps=2, cuda=True)
    assert ms == {"aten::linear": 0.0, "aten::addmm": 0.5}
    # no device time at all (a CPU step on a GPU machine): CPU self time
    cpu = [_ev("aten::linear", 4000.0, 0.0, 0.0), _ev("aten::addmm", 2000.0, 0.0, 0.0)]
    assert self_times(cpu, steps=2, cuda=True) == {"aten::linear": 2.0, "aten::addmm": 1.0}


def test_cpu_op_shares_sum_to_at_most_the_step():
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 8))
    x = torch.randn(64, 256)

    def step():
        model(x).square().mean().backward()

    step()
    t = time.perf_counter()
    prof = profiler.start(cuda=False)
    for _ in range(3):
        step()
    profiler.stop(prof)
    wall_ms = (time.perf_counter() - t) * 1e3 / 3
    ms = op_times(prof, 3, cuda=False)
    profiler.release(prof)
    profiler.collect()
    aten = sum(v for k, v in ms.items() if k.startswith("aten::"))
    assert ms["aten::addmm"] > 0 and ms.get("aten::linear", 0.0) < ms["aten::addmm"]
    assert 0 < aten <= 1.05 * wall_ms, (aten, wall_ms)
