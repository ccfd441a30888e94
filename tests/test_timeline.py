"""Timeline gaps: every idle stretch of the GPU under one cause (launch overhead, a host sync,
the DataLoader, other host work), costed per step. Synthetic timelines (microseconds) keep the
classification exact on the CPU; a GPU-only test profiles a real step."""

import dataclasses

import pytest
import torch

from fusewise.capture import profiler
from fusewise.capture.observation import Observation
from fusewise.capture.opgraph import OpGraph, OpRecord, Value
from fusewise.capture.timeline import Timeline, timeline_from_profiler
from fusewise.diagnose import registry, syncs, timeline
from fusewise.diagnose import thresholds as T
from fusewise.diagnose._gaps import classify
from fusewise.diagnose.timeline import find_gaps
from fusewise.report import Finding


def gap_findings(tl, graph, sync_findings, step_ms=None, loader_lines=None):
    """What the two analyzers that read the timeline find together: the gaps, and the host-sync
    findings with their share of the idle after a sync."""
    return find_gaps(tl, graph, step_ms, loader_lines) + syncs.share_sync_idle(
        sync_findings, tl, step_ms
    )


def kernels(start, n, dur, gap):
    return [(start + i * (dur + gap), start + i * (dur + gap) + dur, "k") for i in range(n)]


def synthetic(steps=2):
    """Per step, laid end to end: 100 kernels of 5 us with 15 us launch gaps, then a sync that
    returns as the GPU drains and a 300 us gap, a 400 us gap mostly inside a DataLoader
    __next__, a 250 us gap while the host runs an aten op."""
    device, syncs, loader, host = [], [], [], []
    t = 0.0
    for _ in range(steps):
        ks = kernels(t, 100, 5.0, 15.0)
        device += ks
        t = ks[-1][1]
        syncs.append((t - 50, t + 2, "cudaStreamSynchronize"))
        device.append((t + 300, t + 310, "k"))
        t += 310
        loader.append((t + 5, t + 395))
        device.append((t + 400, t + 410, "k"))
        t += 410
        host.append((t + 10, t + 240, "aten::copy_"))
        device.append((t + 250, t + 260, "k"))
        t += 260
    return Timeline((0.0, t), device, syncs, loader, host, steps)


def graph_with_syncs():
    """Two .item() calls of a GPU tensor on one line."""
    values = {0: Value(0, (), "float32", 4, device="cuda"), 1: Value(1, (), "float32", 4)}
    ops = [
        OpRecord(i, "aten._local_scalar_dense.default", "forward", [0], [1], 1.0, 8.0, "train.py:3")
        for i in range(2)
    ]
    return OpGraph(ops, values)


def graph_with_short_ops():
    values = {0: Value(0, (8,), "float32", 32, device="cuda")}
    ops = [
        OpRecord(
            i,
            "aten.add.Tensor",
            "forward",
            [0],
            [0],
            8.0,
            96.0,
            "train.py:7" if i < 5 else "train.py:9",
        )
        for i in range(8)
    ]
    for op in ops:
        op.ms = 0.004
    return OpGraph(ops, values)


def test_every_gap_gets_its_cause():
    causes = classify(synthetic(steps=2))
    total = {k: sum(g1 - g0 for g0, g1 in v) for k, v in causes.items()}
    assert len(causes["launch-overhead"]) == 2 * 99 and total["launch-overhead"] == 2 * 99 * 15
    assert total["host-sync"] == 2 * 300  # the whole gap: the sync drained the queue
    assert total["data-loading"] == 2 * 400
    assert total["idle-gap"] == 2 * 250


def test_findings_cost_the_idle_time_per_step_and_name_lines():
    sync = Finding(
        kind="host-sync",
        title="1 sync",
        where="train.py:20",
        est_saving_ms=0.0,
        bytes_avoidable=0.0,
        fix="...",
        evidence={"syncs_per_step": 1},
    )
    found = {f.kind: f for f in gap_findings(synthetic(), graph_with_short_ops(), [sync])}
    assert set(found) == {"launch-overhead", "host-sync", "data-loading", "idle-gap"}
    assert found["launch-overhead"].est_saving_ms == pytest.approx(99 * 15 / 1e3)
    assert found["launch-overhead"].where == "train.py:7"  # most short ops
    assert found["host-sync"].where == "train.py:20"
    assert found["host-sync"].est_saving_ms == pytest.approx(0.300)
    assert found["data-loading"].est_saving_ms == pytest.approx(0.400)
    assert found["idle-gap"].evidence["host_during_largest"][0] == "aten::copy_"
    assert found["launch-overhead"].evidence["profiled_step_ms"] == pytest.approx(
        synthetic().window[1] / 2e3
    )


def launch_overhead_where(graph) -> tuple[str, str]:
    (f,) = [f for f in find_gaps(synthetic(), graph) if f.kind == "launch-overhead"]
    return f.where, f.evidence["ops_counted"]


def test_the_launch_overhead_line_is_named_when_no_op_is_short():
    # short ops: the line with most of them, though another line launches more long ones
    graph = graph_with_short_ops()  # train.py:7 5 ops, train.py:9 3, of 4 us
    for i in range(8, 14):
        graph.ops.append(dataclasses.replace(graph.ops[0], index=i, where="train.py:11", ms=0.05))
    assert launch_overhead_where(graph) == ("train.py:7", "ops under 10 us on the device")
    # every kernel stretched past SHORT_OP_US (another process on the GPU): the line that
    # launches most on the device, never "?"
    for op in graph.ops:
        op.ms = 0.05
    assert launch_overhead_where(graph) == ("train.py:11", "ops on the device")
    # no op timed: the line of most ops
    for op in graph.ops:
        op.ms = 0.0
    assert launch_overhead_where(graph) == ("train.py:11", "ops (none was timed on the device)")


def test_ops_of_no_known_line_are_not_named_and_views_not_counted():
    graph = graph_with_short_ops()  # train.py:7 5 ops, train.py:9 3
    for i in range(8, 14):
        graph.ops.append(dataclasses.replace(graph.ops[0], index=i, where="?"))
    for i in range(14, 20):
        graph.ops.append(dataclasses.replace(graph.ops[0], index=i, where="v.py:1", is_view=True))
    assert launch_overhead_where(graph) == ("train.py:7", "ops under 10 us on the device")
    # the short ops of no known line: none named, not the line of a few long ops instead
    for op in graph.ops:
        op.where = "?"
    graph.ops.append(dataclasses.replace(graph.ops[0], index=20, where="train.py:20", ms=0.5))
    assert launch_overhead_where(graph) == (
        "?",
        "ops under 10 us on the device, none of a known line",
    )


def test_idle_time_is_scaled_to_the_plain_step():
    """The profiled step ran slower than the plain one: idle times shrink by the ratio."""
    tl = synthetic()
    window_ms = tl.window[1] / 2e3
    plain = {f.kind: f.est_saving_ms for f in gap_findings(tl, graph_with_short_ops(), [])}
    half = {f.kind: f for f in gap_findings(tl, graph_with_short_ops(), [], step_ms=window_ms / 2)}
    assert set(half) == set(plain)
    for kind, ms in plain.items():
        assert half[kind].est_saving_ms == pytest.approx(ms / 2)
        assert half[kind].evidence["idle_scaled_by"] == 0.5
    faster = gap_findings(tl, graph_with_short_ops(), [], step_ms=2 * window_ms)
    assert {f.kind: f.est_saving_ms for f in faster} == pytest.approx(plain)  # never scaled up


def test_data_loading_is_named_at_the_line_that_takes_batches():
    from torch.utils.data import DataLoader, dataloader

    from fusewise.capture.loader import loader_lines

    original = dataloader._BaseDataLoaderIter.__next__
    with loader_lines() as lines:
        batches = iter(DataLoader(list(range(6)), batch_size=2))
        for _ in range(3):
            next(batches)  # the line to be named
    assert dataloader._BaseDataLoaderIter.__next__ is original  # the patch is undone
    ((where, n),) = lines.items()
    assert n == 3 and "test_timeline.py" in where
    (f,) = [
        f
        for f in gap_findings(synthetic(), graph_with_short_ops(), [], loader_lines=lines)
        if f.kind == "data-loading"
    ]
    assert f.where == where and f.evidence["batches_taken_at"] == {where: 3}
    with pytest.raises(ZeroDivisionError), loader_lines():
        _ = 1 / 0
    assert dataloader._BaseDataLoaderIter.__next__ is original


def test_sync_idle_is_shared_by_syncs_per_step_and_unseen_syncs_get_a_finding():
    def mk(where, n):
        return Finding(
            kind="host-sync",
            title="",
            where=where,
            est_saving_ms=0.0,
            bytes_avoidable=0.0,
            fix="",
            evidence={"syncs_per_step": n},
        )

    out = {
        f.where: f
        for f in gap_findings(
            synthetic(), graph_with_short_ops(), [mk("a.py:1", 3), mk("b.py:2", 1)]
        )
    }
    assert out["a.py:1"].est_saving_ms == pytest.approx(3 * out["b.py:2"].est_saving_ms)
    assert out["a.py:1"].est_saving_ms + out["b.py:2"].est_saving_ms == pytest.approx(0.3)
    unseen = [
        f for f in gap_findings(synthetic(), graph_with_short_ops(), []) if f.kind == "host-sync"
    ]
    assert len(unseen) == 1 and "cudaStreamSynchronize" in unseen[0].title


def test_small_idle_is_not_a_finding_and_no_timeline_changes_nothing():
    tl = Timeline((0.0, 10_000.0), kernels(0.0, 10, 990.0, 10.0) + [(9990.0, 10_000.0, "k")])
    assert sum(g1 - g0 for g in classify(tl).values() for g0, g1 in g) == 90.0
    assert gap_findings(tl, graph_with_short_ops(), []) == []  # 0.1 ms of 10: under GAP_MIN_SHARE
    assert 0.09 < T.GAP_MIN_SHARE * 10
    # without a timeline (a CPU step) the host-sync analyzer returns the op graph's syncs as
    # they are, and the timeline analyzer says why it cannot run
    obs = Observation(graph_with_syncs(), [1.0], {}, 2.0, "cpu", timeline=None)
    assert syncs.analyze(obs, None) == syncs.find_syncs(obs.graph) != []
    assert all(f.est_saving_ms == 0.0 for f in syncs.analyze(obs, None))
    with pytest.raises(registry.Skip, match="no device activity"):
        timeline.analyze(obs, None)


@pytest.mark.gpu
def test_a_real_step_shows_launch_overhead_sync_idle_and_loader_waits():
    import time

    from fusewise.capture.opgraph import Recorder

    class SlowData(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.randn(256)

    it = iter(torch.utils.data.DataLoader(SlowData(), batch_size=1))
    x = torch.randn(256, device="cuda")

    def step():
        y = next(it).cuda() + x
        for _ in range(200):
            y = y * 1.0001 + 1e-4  # tiny kernels: launch-bound
        y.sum().item()  # a sync
        torch.cuda._sleep(2_000_000)  # ~1 ms of device work after it

    step()
    prof = profiler.start(cuda=True)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    profiler.stop(prof)
    tl = timeline_from_profiler(prof, 3)
    profiler.release(prof)  # before the recorder's session (capture/profiler.py says why)
    with Recorder() as rec:
        step()
    found = {f.kind: f for f in gap_findings(tl, rec.graph, syncs.find_syncs(rec.graph))}
    assert {"launch-overhead", "data-loading"} <= set(found)
    assert found["data-loading"].est_saving_ms > 1.0  # 2 ms of sleep per batch
    assert "test_timeline.py" in found["launch-overhead"].where


def test_a_released_profile_still_answers():
    """profiler.release frees kineto's results at once (a profile sits in a reference cycle and
    would otherwise be freed at a later garbage collection: a crash on the H200 once another
    session had started), keeping the parsed events."""
    x = torch.randn(64, 64)
    prof = profiler.start(cuda=False)
    (x @ x).sum()
    profiler.stop(prof)
    profiler.release(prof)
    assert prof.profiler.kineto_results is None
    assert any(e.key == "aten::mm" for e in prof.key_averages())
