"""Predicted savings from measured times (diagnose/_measured.py): the removed ops' time, their
launch gaps from the profiled steps, less the fused kernel; the byte model only when the graph
holds no times. Also the kernel -> launching-op join of capture/timeline.kernel_gaps."""

import dataclasses
import types

import pytest
import torch

from fusewise.capture.graph import OpGraph, OpRecord, Value
from fusewise.capture.timeline import Timeline, kernel_gaps
from fusewise.diagnose import _measured
from fusewise.diagnose import thresholds as T
from fusewise.diagnose.chains import find_chains
from fusewise.hardware import Ceilings

H200 = Ceilings("NVIDIA H200 (PERF.md)", "cuda", 4274.0, 686.0, "test")
MB = 1 << 20


def _chain_graph(ms: float, phase: str = "forward") -> OpGraph:
    """x -> mul -> add -> exp -> y, each value 64 MiB: 3 ops write 6 x 64 MiB (read and write
    each); a fused kernel reads x and writes y (2 x 64 MiB)."""
    values = {v: Value(v, (16 * MB,), "float32", 64 * MB, device="cuda") for v in range(4)}
    ops = [
        OpRecord(i, name, phase, [i], [i + 1], 16 * MB, 128 * MB, "model.py:7", ms=ms)
        for i, name in enumerate(("aten.mul.Tensor", "aten.add.Tensor", "aten.exp.default"))
    ]
    return OpGraph(ops, values)


def _obs(graph, timeline=None, median_ms=10.0, op_ms=None):
    return types.SimpleNamespace(
        graph=graph, timeline=timeline, median_ms=median_ms, op_ms=op_ms or {}
    )


def test_without_times_the_byte_model_is_the_prediction():
    g = _chain_graph(ms=0.0)
    assert _measured.timing(_obs(g)) is None
    (f,) = find_chains(g, H200, None)
    avoidable = 6 * 64 * MB - 2 * 64 * MB
    assert f.est_saving_ms == pytest.approx(avoidable / (H200.bandwidth_GBps * 1e6))
    assert f.evidence["estimate"].startswith("byte model")


def test_measured_times_predict_removed_time_less_the_fused_kernel():
    g = _chain_graph(ms=0.5)
    t = _measured.timing(_obs(g))  # no timeline: a CPU step, host times as measured
    assert t.scale == 1.0 and t.gap_ms == {}
    (f,) = find_chains(g, H200, t)
    fused = 2 * 64 * MB / (H200.bandwidth_GBps * 1e9 * T.FUSED_KERNEL_EFFICIENCY) * 1e3
    assert f.est_saving_ms == pytest.approx(1.5 - fused)
    assert f.evidence["removed_ops"] == 3
    assert f.evidence["fused_kernel_ms"] == pytest.approx(fused, abs=1e-4)
    # far above the byte model: the ops ran well below the ceiling
    assert f.est_saving_ms > 2 * f.evidence["byte_model_ms"]


def _timeline(busy_us_per_kernel: float, gaps: dict, steps: int = 2) -> Timeline:
    """Kernels back to back, each busy_us long: 3 per step."""
    device, t = [], 0.0
    for _ in range(3 * steps):
        device.append((t, t + busy_us_per_kernel, "k"))
        t += busy_us_per_kernel
    return Timeline((0.0, t), device, steps=steps, kernel_gaps=gaps)


def test_recorded_times_scaled_to_the_profiled_steps_and_launch_gaps_added():
    g = _chain_graph(ms=0.5)  # 1.5 ms recorded
    # profiled: 3 kernels of 400 us per step = 1.2 ms busy -> scale 0.8; the mul's kernel
    # waited 30 us (and once 500 us: not a launch gap) in each of the 2 steps
    gaps = {("forward", "aten::mul"): [30.0, 500.0, 30.0], ("forward", "aten::add"): [0.0, 0.0]}
    t = _measured.timing(_obs(g, _timeline(400.0, gaps), median_ms=1.2))
    assert t.scale == pytest.approx(0.8)
    assert t.gap_ms == {("forward", "aten::mul"): pytest.approx(0.03)}
    (f,) = find_chains(g, H200, t)
    fused = 2 * 64 * MB / (H200.bandwidth_GBps * 1e9 * T.FUSED_KERNEL_EFFICIENCY) * 1e3
    assert f.est_saving_ms == pytest.approx(1.2 + 0.03 - fused)
    assert f.evidence["launch_gaps_ms"] == pytest.approx(0.03)


def test_a_scale_out_of_range_keeps_the_recorded_times():
    g = _chain_graph(ms=0.5)
    t = _measured.timing(_obs(g, _timeline(100.0, {}), median_ms=0.3))  # 0.3 / 1.5 = 0.2
    assert t.scale == 1.0


def test_matmuls_stay_out_of_the_removed_ops():
    g = _chain_graph(ms=0.5)
    mm = dataclasses.replace(g.ops[0], name="aten.mm.default", flops=1e6)
    t = _measured.Timing()
    s = _measured.saving([mm, *g.ops[1:]], 0.0, H200.bandwidth_GBps, t)
    assert s.removed_ms == pytest.approx(1.5)  # what the caller passed: it picks the ops
    assert "aten.mm.default" in _measured.MATMULS


def _written_out_attention(ms: float = 0.5) -> OpGraph:
    """q @ k^T -> div -> masked_fill -> softmax -> @ v: q, k, v and the output 4 MiB each,
    the scores and probabilities 256 MiB; each matmul 20 GFLOP; every op takes `ms`."""
    small, big = 4 * MB, 256 * MB
    sizes = {0: small, 1: small, 2: big, 3: big, 4: big, 5: big, 6: small, 7: small}
    values = {v: Value(v, (n // 2,), "bfloat16", n, device="cuda") for v, n in sizes.items()}
    op = OpRecord
    ops = [
        op(0, "aten.bmm.default", "forward", [0, 1], [2], 2e10, 2 * small + big, "m.py:9", ms=ms),
        op(1, "aten.div.Tensor", "forward", [2], [3], big / 2, 2 * big, "m.py:9", ms=ms),
        op(2, "aten.masked_fill.Scalar", "forward", [3], [4], 0, 2 * big, "m.py:10", ms=ms),
        op(3, "aten._softmax.default", "forward", [4], [5], big, 2 * big, "m.py:11", ms=ms),
        op(4, "aten.bmm.default", "forward", [5, 6], [7], 2e10, 2 * small + big, "m.py:11", ms=ms),
    ]
    return OpGraph(ops, values)


def test_a_fused_attention_kernel_takes_the_scores_matmuls_with_it():
    # scaled_dot_product_attention computes q @ k^T and probs @ v inside its kernel: the two
    # bmms go with the memory-bound ops, and the fused kernel pays their FLOPs at its share
    # of the matmul ceiling (here longer than its bytes)
    g = _written_out_attention()
    t = _measured.timing(_obs(g))
    (f,) = find_chains(g, H200, t)
    assert f.pattern == "attention"
    assert f.evidence["removed_ops"] == 5
    compute = 4e10 / (H200.matmul_TFLOPs * 1e9 * T.ATTENTION_KERNEL_MATMUL_SHARE)  # ms
    fused_bytes = f.evidence["bytes_fused_minimum"]
    by_bytes = fused_bytes / (H200.bandwidth_GBps * 1e9 * T.FUSED_KERNEL_EFFICIENCY) * 1e3
    assert compute > by_bytes
    assert f.evidence["fused_kernel_ms"] == pytest.approx(compute, abs=1e-4)
    assert f.est_saving_ms == pytest.approx(5 * 0.5 - compute)
    # any other chain keeps its matmuls: they stay out of the removed ops and the saving
    g.ops[3] = dataclasses.replace(g.ops[3], name="aten.exp.default")
    (other,) = find_chains(g, H200, _measured.timing(_obs(g)))
    assert other.pattern != "attention" and other.evidence["removed_ops"] == 3


class _Event:
    def __init__(self, name, start, end, device="cpu", corr=0, link=0, thread=1):
        self._v = (name, start, end, device, corr, link, thread)

    def name(self):
        return self._v[0]

    def start_ns(self):
        return self._v[1] * 1000

    def end_ns(self):
        return self._v[2] * 1000

    def device_type(self):
        cuda = torch.autograd.DeviceType.CUDA
        return cuda if self._v[3] == "cuda" else torch.autograd.DeviceType.CPU

    def correlation_id(self):
        return self._v[4]

    def linked_correlation_id(self):
        return self._v[5]

    def start_thread_id(self):
        return self._v[6]


def test_kernel_gaps_joins_kernels_to_their_op_and_phase():
    events = [
        _Event("aten::mul", 0, 5, corr=1, thread=1),
        _Event("aten::mul", 20, 25, corr=2, thread=2),  # the backward's thread
        # torch's range (its end is wrong when a session starts inside it): not used
        _Event("Optimizer.step#AdamW.step", 0, 10**6, thread=1),
        _Event("fusewise.optimizer.begin", 40, 40, thread=1),
        _Event("fusewise.optimizer.end", 90, 90, thread=1),
        _Event("aten::add", 50, 55, corr=3, thread=1),
        _Event("kernel_a", 10, 20, "cuda", link=1),
        _Event("kernel_b", 30, 35, "cuda", link=2),  # 10 us after kernel_a
        _Event("kernel_c", 60, 70, "cuda", link=3),  # 25 us after kernel_b
        _Event("kernel_d", 70, 80, "cuda", link=99),  # no op with that id: left out
        # kineto's device-side copy of the range, spanning the kernels: not a kernel
        _Event("Optimizer.step#AdamW.step", 41, 89, "cuda"),
    ]
    results = types.SimpleNamespace(events=lambda: events)
    prof = types.SimpleNamespace(profiler=types.SimpleNamespace(kineto_results=results))
    assert kernel_gaps(prof) == {
        ("forward", "aten::mul"): [0.0],
        ("backward", "aten::mul"): [10.0],
        ("optimizer", "aten::add"): [25.0],
    }


def test_kernel_gaps_without_kineto_results_is_empty():
    prof = types.SimpleNamespace(profiler=types.SimpleNamespace(kineto_results=None))
    assert kernel_gaps(prof) == {}


def test_cpu_times_are_scaled_per_op_name_to_the_profiled_steps():
    # on the CPU the recorder's per-op overhead inflated small ops 2-5x (a Llama's _log_softmax:
    # 8.8 ms recorded, 3.1 ms profiled) and the predicted saving exceeded its ops' time
    g = _chain_graph(ms=0.5)
    op_ms = {"aten::mul": 0.1, "aten::add": 0.25}  # no profiled aten::exp: kept as recorded
    t = _measured.timing(_obs(g, op_ms=op_ms))
    assert t.name_scale == {"aten::mul": pytest.approx(0.2), "aten::add": pytest.approx(0.5)}
    (f,) = find_chains(g, H200, t)
    fused = 2 * 64 * MB / (H200.bandwidth_GBps * 1e9 * T.FUSED_KERNEL_EFFICIENCY) * 1e3
    assert f.evidence["removed_ops_ms"] == pytest.approx(0.1 + 0.25 + 0.5, abs=1e-4)
    assert f.est_saving_ms == pytest.approx(0.85 - fused)
    # the "ops now" check is on the same clock: the prediction stays below it
    assert f.evidence["measured_ms_unfused"] == pytest.approx(0.85)


def test_a_scale_above_one_keeps_the_saving_below_the_ops_time_shown():
    g = _chain_graph(ms=0.5)  # 1.5 ms recorded; profiled 3 x 700 us per step: scale 1.4
    t = _measured.timing(_obs(g, _timeline(700.0, {}), median_ms=2.1))
    assert t.scale == pytest.approx(1.4)
    (f,) = find_chains(g, H200, t)
    assert f.evidence["measured_ms_unfused"] == pytest.approx(2.1)
    assert f.est_saving_ms < f.evidence["measured_ms_unfused"]


def test_busy_time_does_not_depend_on_the_order_of_the_kernels():
    tl = _timeline(400.0, {})
    shuffled = dataclasses.replace(tl, device=list(reversed(tl.device)))
    assert _measured._busy_ms(shuffled) == pytest.approx(_measured._busy_ms(tl)) == 1.2


def test_a_measured_chain_with_nothing_to_gain_is_not_reported():
    # 3 ops of 1 us each: the fused kernel (128 MiB at 60% of the ceiling) takes longer
    g = _chain_graph(ms=0.001)
    assert find_chains(g, H200, _measured.timing(_obs(g))) == []
    assert len(find_chains(g, H200, None)) == 1  # the byte model alone would report it


def test_broken_op_times_count_as_none():
    g = _chain_graph(ms=0.5)
    g.ops[1].ms = float("nan")
    g.ops[2].ms = -5.0
    t = _measured.timing(_obs(g))
    assert t.op_ms(g.ops[1]) == 0.0 and t.op_ms(g.ops[2]) == 0.0
    (f,) = find_chains(g, H200, t)
    assert f.evidence["removed_ops_ms"] == pytest.approx(0.5)


def test_a_math_path_attention_calls_forward_ops_are_not_a_chain_too():
    g = _chain_graph(ms=0.5)
    g.attention = [dict(where="model.py:7", ops=[0, 3], kernel=None)]
    assert find_chains(g, H200, _measured.timing(_obs(g))) == []
    g.attention[0]["kernel"] = "aten._flash_attention_forward.default"  # a fused call: no fallback
    assert len(find_chains(g, H200, _measured.timing(_obs(g)))) == 1


def test_cpu_name_scales_far_from_one_keep_the_recorded_times():
    g = _chain_graph(ms=0.5)
    # the profile puts mul's time elsewhere (ratio 0.01) and add's at 0.4 of the recording
    obs = types.SimpleNamespace(
        graph=g, timeline=None, median_ms=10.0, op_ms={"aten::mul": 0.005, "aten::add": 0.2}
    )
    t = _measured.timing(obs)
    assert t.name_scale == {"aten::add": pytest.approx(0.4)}
    assert t.op_ms(g.ops[0]) == pytest.approx(0.5) and t.op_ms(g.ops[1]) == pytest.approx(0.2)
