"""matmul-precision, matmul-shape and the per-dtype roofline, on small synthetic op graphs (plain
data: capture/graph.py), exact; and one diagnosis end to end on the CPU."""

import json

import pytest
import torch

import fusewise
from fusewise import hardware
from fusewise.capture.graph import OpGraph, OpRecord, Value
from fusewise.capture.observation import Observation
from fusewise.diagnose import matmul
from fusewise.diagnose import thresholds as T
from fusewise.diagnose.breakdown import top_ops
from fusewise.diagnose.registry import Skip

RATES = {"fp32": 50.0, "tf32": 400.0, "bf16": 800.0, "fp16": 800.0, "fp8": 1600.0}
GPU = hardware.Ceilings("test GPU", "cuda", 4000.0, 800.0, "test", matmul_by_dtype=RATES)
TF32_OFF = {"float32_matmul_precision": "highest", "cuda.matmul.allow_tf32": False}
TF32_OFF["cudnn.allow_tf32"] = True
TF32_ON = dict(TF32_OFF, float32_matmul_precision="high", **{"cuda.matmul.allow_tf32": True})
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


class Builder:
    """An OpGraph written op by op: mm(a_shape, b_shape, dtype, ms, where)."""

    def __init__(self, device="cuda"):
        self.graph, self.device = OpGraph(), device

    def value(self, shape, dtype):
        vid = len(self.graph.values)
        n = 1
        for d in shape:
            n *= d
        self.graph.values[vid] = Value(
            vid, tuple(shape), dtype, n * ITEMSIZE[dtype], -1, self.device
        )
        return vid

    def op(
        self,
        name,
        inputs,
        out_shape,
        dtype,
        *,
        ms,
        where,
        flops=0.0,
        is_view=False,
        phase="forward",
    ):
        out = self.value(out_shape, dtype)
        nbytes = 0.0 if is_view else sum(self.graph.values[v].nbytes for v in [*inputs, out])
        rec = OpRecord(
            len(self.graph.ops), name, phase, list(inputs), [out], flops, nbytes, where, is_view, ms
        )
        self.graph.ops.append(rec)
        return out

    def mm(self, m, k, n, dtype="float32", *, ms=1.0, where="train.py:10", phase="forward"):
        a, b = self.value((m, k), dtype), self.value((k, n), dtype)
        return self.op(
            "aten.mm.default",
            [a, b],
            (m, n),
            dtype,
            ms=ms,
            where=where,
            flops=2.0 * m * n * k,
            phase=phase,
        )


def observation(graph, settings, device="cuda", step_ms=20.0):
    return Observation(graph, [step_ms], {}, 2 * step_ms, device, matmul_settings=settings)


# --- matmul-precision -------------------------------------------------------------------------


def test_fp32_matmuls_without_tf32_are_found_at_their_heaviest_line(monkeypatch):
    # the ceilings' ratio, as without a GPU (on one, the heaviest shapes would be timed)
    monkeypatch.setattr(matmul, "_time_on_gpu", None)
    g = Builder()
    g.mm(1024, 1024, 1024, ms=4.0, where="train.py:10")
    g.mm(1024, 1024, 1024, ms=4.0, where="train.py:10", phase="backward")
    g.mm(512, 1024, 1024, ms=2.0, where="train.py:20")
    g.mm(512, 1024, 1024, "bfloat16", ms=0.5, where="train.py:30")  # not fp32: not counted
    (f,) = matmul.analyze_precision(observation(g.graph, TF32_OFF), GPU)
    assert f.kind == "matmul-precision" and f.where == "train.py:10"
    measured = 10.0
    assert f.evidence["measured_ms"] == measured and f.evidence["matmuls"] == 3
    # the same fraction of the ceiling at the TF32 rate: 10 ms * 50 / 400
    assert f.est_saving_ms == pytest.approx(measured * (1 - 50.0 / 400.0))
    assert f.evidence["predicted_ms_tf32"] == pytest.approx(1.25)
    # bf16 autocast: 10 ms * 50 / 800 plus casting the forward operands (4 B read, 2 B written)
    fwd_elements = 2 * 1024 * 1024 + (512 * 1024 + 1024 * 1024)
    cast_ms = 6 * fwd_elements / 4000e9 * 1e3
    assert f.evidence["cast_ms_bf16_autocast"] == pytest.approx(cast_ms)
    assert f.evidence["saving_ms_bf16_autocast"] == pytest.approx(10 - (10 * 50 / 800 + cast_ms))
    flops = 2 * 2.0 * 1024**3 + 2.0 * 512 * 1024**2
    assert f.evidence["fraction_of_ceiling"] == pytest.approx(flops / 10e-3 / 50e12)
    assert 'set_float32_matmul_precision("high")' in f.fix and "autocast" in f.fix
    assert "fraction of the faster ceiling" in f.evidence["assumption"]


def test_with_tf32_on_only_autocast_is_offered(monkeypatch):
    monkeypatch.setattr(matmul, "_time_on_gpu", None)
    g = Builder()
    g.mm(2048, 2048, 2048, ms=4.0)
    (f,) = matmul.analyze_precision(observation(g.graph, TF32_ON), GPU)
    cast_ms = 6 * 2 * 2048 * 2048 / 4000e9 * 1e3
    assert f.est_saving_ms == pytest.approx(4.0 - (4.0 * 400 / 800 + cast_ms))
    assert "predicted_ms_tf32" not in f.evidence and f.evidence["ran_as"] == "tf32"
    assert "set_float32_matmul_precision" not in f.fix and "autocast" in f.fix


def test_no_precision_finding_on_the_cpu_for_bf16_or_below_the_threshold():
    g = Builder(device="cpu")
    g.mm(1024, 1024, 1024, ms=40.0)
    assert matmul.analyze_precision(observation(g.graph, TF32_OFF, device="cpu"), GPU) == []
    g = Builder()
    g.mm(1024, 1024, 1024, "bfloat16", ms=4.0)
    assert matmul.analyze_precision(observation(g.graph, TF32_OFF), GPU) == []
    g = Builder()
    g.mm(64, 64, 64, ms=0.01)  # saves 0.009 ms: under MATMUL_MIN_SAVING_MS
    assert matmul.analyze_precision(observation(g.graph, TF32_OFF), GPU) == []


def test_precision_says_why_when_settings_or_rates_are_missing():
    g = Builder()
    g.mm(1024, 1024, 1024, ms=4.0)
    with pytest.raises(Skip, match="settings were not recorded"):
        matmul.analyze_precision(observation(g.graph, None), GPU)
    headline_only = hardware.Ceilings("old", "cuda", 4000.0, 800.0, "test")
    with pytest.raises(Skip, match="no fp32, tf32 matmul rate"):
        matmul.analyze_precision(observation(g.graph, TF32_OFF), headline_only)


# --- matmul-shape -----------------------------------------------------------------------------


def test_padded_dimensions():
    assert matmul.padded(50257, "float32") == 50304 == 786 * 64
    assert matmul.padded(100, "bfloat16") == 104 and matmul.padded(100, "float32") == 100
    assert matmul.padded(1000, "float16") == 1000  # under MATMUL_BIG_DIM: a multiple of 8 will do
    assert matmul.padded(4100, "bfloat16") == 4160


def test_unaligned_vocabulary_is_found_with_a_measured_saving():
    g = Builder()
    g.mm(4096, 768, 50257, "bfloat16", ms=3.0, where="model.py:99")  # logits
    g.mm(4096, 50257, 768, "bfloat16", ms=3.0, where="model.py:99", phase="backward")
    g.mm(4096, 768, 768, "bfloat16", ms=1.0, where="model.py:50")  # aligned: not listed
    timed = []

    def timer(batch, m, n, k, key):
        timed.append((batch, m, n, k, key))
        return 0.8 if 50304 in (n, k) else 1.0  # the padded shape is 20% faster

    (f,) = matmul.find_unaligned(g.graph, 20.0, False, timer)
    assert f.kind == "matmul-shape" and f.where == "model.py:99"
    assert f.evidence["dims_padded"] == [[50257, 50304]]
    assert f.est_saving_ms == pytest.approx(6.0 * 0.2) and f.evidence["saving_measured"]
    assert (1, 4096, 50257, 768, "bf16") in timed and (1, 4096, 50304, 768, "bf16") in timed
    assert "50304" in f.fix or "pad" in f.fix


def test_unaligned_without_a_gpu_to_measure_says_so_and_invents_nothing():
    g = Builder()
    g.mm(4096, 768, 50257, ms=3.0, where="model.py:99")
    (f,) = matmul.find_unaligned(g.graph, 20.0, True, None, "no CUDA device")
    assert f.est_saving_ms == 0.0 and not f.evidence["saving_measured"]
    assert f.evidence["why_not_measured"] == "no CUDA device"
    assert f.evidence["shapes_not_timed"] == ["[4096x768]@[768x50257] tf32"]


def test_aligned_shapes_and_cpu_steps_have_no_shape_finding():
    g = Builder()
    g.mm(4096, 768, 50304, "bfloat16", ms=3.0)
    assert matmul.find_unaligned(g.graph, 20.0, False, lambda *a: 1.0) == []
    g = Builder(device="cpu")
    g.mm(4096, 768, 50257, ms=30.0)
    assert matmul.analyze_shape(observation(g.graph, TF32_OFF, device="cpu"), GPU) == []


def test_many_tiny_matmuls_from_one_line_are_launch_bound():
    g = Builder()
    for _ in range(T.MATMUL_TINY_MIN_COUNT + 4):
        g.mm(16, 16, 16, ms=0.005, where="loop.py:7")
    for _ in range(T.MATMUL_TINY_MIN_COUNT - 1):  # too few from this line
        g.mm(16, 16, 16, ms=0.005, where="loop.py:9")
    (f,) = matmul.find_tiny(g.graph, 2.0)
    n = T.MATMUL_TINY_MIN_COUNT + 4
    assert f.where == "loop.py:7" and f.evidence["matmuls"] == n
    assert f.est_saving_ms == pytest.approx((n - 1) * 0.005)
    assert "bmm" in f.fix and "CUDA graph" in f.fix


# --- the roofline -----------------------------------------------------------------------------


def test_each_matmul_is_judged_against_its_dtype_and_views_are_not_kernels():
    g = Builder()
    a = g.mm(1024, 1024, 1024, ms=3.0)
    g.mm(1024, 1024, 1024, "bfloat16", ms=1.0)
    g.op("aten.t.default", [a], (1024, 1024), "float32", ms=0.2, where="x", is_view=True)
    g.op("aten.view.default", [a], (1024 * 1024,), "float32", ms=0.1, where="x", is_view=True)
    g.op("aten.empty.memory_format", [], (1024,), "float32", ms=0.1, where="x")
    op_ms = {"aten::mm": 8.0, "aten::t": 0.5, "aten::view": 0.3, "aten::empty": 0.2}
    rows = top_ops(op_ms, g.graph, GPU, 20.0, matmul_settings=TF32_OFF)
    assert [(r.name, r.ceiling, r.dtype) for r in rows] == [
        ("aten::mm", "fp32", "float32"),
        ("aten::mm", "bf16", "bfloat16"),
    ]
    fp32, bf16 = rows
    # the profiled 8 ms shared as the recorded 3 : 1
    assert (fp32.ms_per_step, bf16.ms_per_step) == (6.0, 2.0)
    flops = 2.0 * 1024**3
    assert fp32.pct_of_ceiling == pytest.approx(100 * flops / 6e-3 / 50e12)
    assert bf16.pct_of_ceiling == pytest.approx(100 * flops / 2e-3 / 800e12)
    tf32 = top_ops(op_ms, g.graph, GPU, 20.0, matmul_settings=TF32_ON)
    assert tf32[0].ceiling == "tf32"
    assert tf32[0].pct_of_ceiling == pytest.approx(100 * flops / 6e-3 / 400e12)
    # ceilings without a rate of the dtype: the headline, labelled so (a bandwidth that puts
    # the fp32 matmul above the headline's ridge)
    bare = hardware.Ceilings("old", "cuda", 40000.0, 800.0, "test")
    labels = {r.dtype: r.ceiling for r in top_ops(op_ms, g.graph, bare, 20.0)}
    assert labels == {"float32": "matmul", "bfloat16": "bf16"}


# --- end to end on the CPU ----------------------------------------------------------------------


def test_settings_are_recorded_with_the_step():
    from fusewise.capture.schedule import StepSchedule

    saved = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        s = StepSchedule(1, 0, cuda=False)
        s.start()
        x = torch.randn(8, 8)
        while not s.step_ended():
            x @ x
        assert s.observation().matmul_settings == hardware.matmul_settings()
        assert s.observation().matmul_settings["cuda.matmul.allow_tf32"] is True
    finally:
        torch.set_float32_matmul_precision(saved)


def test_diagnose_on_the_cpu_invents_no_gpu_finding(tmp_path, monkeypatch):
    """An fp32 step with a 50257-wide output on the CPU: no matmul finding (there is no TF32 and
    no tensor core to align for), nothing failed, and the device line says real numbers."""
    monkeypatch.setenv("FUSEWISE_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(30, 64), torch.nn.GELU(), torch.nn.Linear(64, 50257)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 30), torch.randint(0, 50257, (16,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    # the CPU's ceilings also where a GPU is present (the default would be the GPU's)
    ceil = hardware.ceilings("cpu")
    report = fusewise.diagnose(step, steps=2, warmup=1, restore=[model, opt], ceilings=ceil)
    d = json.loads(report.to_json())
    assert not {f["kind"] for f in d["findings"]} & {"matmul-precision", "matmul-shape"}
    assert not [s for s in d["skipped"] if "failed" in s["reason"]], d["skipped"]
    assert set(d["device"]["matmul_by_dtype"]) == {"fp32", "bf16"}
    assert d["device"]["matmul_dtype"] == "fp32"
    names = [row["name"] for row in d["top"]]
    assert not {"aten::t", "aten::view", "aten::detach", "aten::expand"} & set(names)
    assert all(row["intensity"] is not None for row in d["top"])  # nothing moving no bytes
    text = str(report)
    assert "0.0 TFLOP/s" not in text and "fp32" in text


def test_a_shape_that_cannot_be_timed_is_listed_untimed():
    g = Builder()
    g.mm(4096, 768, 50257, "bfloat16", ms=3.0, where="model.py:99")

    def out_of_memory(*shape):
        raise torch.cuda.OutOfMemoryError("no room beside the model")

    (f,) = matmul.find_unaligned(g.graph, 2.0, False, out_of_memory)
    assert f.est_saving_ms == 0.0 and f.evidence["shapes_not_timed"] == [
        "[4096x768]@[768x50257] bf16"
    ]


def test_precision_prediction_uses_the_timed_ratio_of_the_heaviest_shapes(monkeypatch):
    """Shapes timed on the GPU take their measured ratio; shapes beyond the ones timed (here one
    is timed) keep the ceilings' ratio."""
    monkeypatch.setattr(T, "MATMUL_PRECISION_SHAPES_TIMED", 1)
    g = Builder()
    g.mm(4096, 768, 2304, ms=6.0, where="model.py:1")  # the heaviest shape: timed
    g.mm(4096, 768, 768, ms=2.0, where="model.py:2")  # not timed
    seen = []

    def timer(batch, m, n, k, key):
        seen.append(((batch, m, n, k), key))
        return {"fp32": 10.0, "tf32": 2.5, "bf16": 1.25}[key]  # 4x and 8x faster

    (f,) = matmul.find_precision(g.graph, GPU, TF32_OFF, 20.0, timer)
    assert {shape for shape, _ in seen} == {(1, 4096, 2304, 768)}
    tf32 = 6.0 / 4 + 2.0 * 50 / 400
    assert f.evidence["predicted_ms_tf32"] == pytest.approx(tf32)
    assert f.est_saving_ms == pytest.approx(8.0 - tf32)
    cast = f.evidence["cast_ms_bf16_autocast"]
    assert f.evidence["predicted_ms_bf16_autocast"] == pytest.approx(
        6.0 / 8 + 2.0 * 50 / 800 + cast
    )
    assert f.evidence["timed_share"] == pytest.approx(6.0 / 8.0)
