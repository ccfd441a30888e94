import json

import pytest
import torch

import fusewise
from fusewise import cost, hardware
from fusewise.ops.adamw import cost as adamw_cost
from fusewise.ops.linear_ce import cost as lce_cost
from fusewise.ops.norms import cost as norm_cost


def test_cpu_ceilings_are_measured_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEWISE_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(hardware, "measure_bandwidth", lambda d: calls.append("bw") or 12.5)
    rates = {"fp32": 0.5, "bf16": 0.25}
    monkeypatch.setattr(hardware, "measure_matmuls", lambda d: calls.append("mm") or rates)
    c = hardware.ceilings("cpu")
    assert (c.bandwidth_GBps, c.matmul_TFLOPs, c.source) == (12.5, 0.5, "measured")
    assert c.matmul_by_dtype == rates and c.headline_key == "fp32"
    assert c.ridge == pytest.approx(0.5e12 / 12.5e9)
    again = hardware.ceilings("cpu")  # from the cache: nothing measured twice
    assert calls == ["bw", "mm"] and again.bandwidth_GBps == 12.5
    assert again.matmul_by_dtype == rates
    cache = json.loads((tmp_path / "ceilings.json").read_text())
    assert any(torch.__version__ in key for key in cache)  # keyed by versions too
    hardware.ceilings("cpu", refresh=True)
    assert calls == ["bw", "mm", "bw", "mm"]


def test_a_cache_entry_without_per_dtype_rates_is_measured_again(tmp_path, monkeypatch):
    """An entry written by an older fusewise (headline only) is re-measured, not crashed on, and
    replaced by one with the per-dtype rates."""
    monkeypatch.setenv("FUSEWISE_CACHE_DIR", str(tmp_path))
    key = f"{hardware.device_name(torch.device('cpu'))} | {hardware.versions()}"
    old = {key: {"bandwidth_GBps": 3.0, "matmul_TFLOPs": 0.1, "measured_at": 0.0}}
    (tmp_path / "ceilings.json").write_text(json.dumps(old))
    monkeypatch.setattr(hardware, "measure_bandwidth", lambda d: 7.0)
    monkeypatch.setattr(hardware, "measure_matmuls", lambda d: {"fp32": 0.2, "bf16": 0.4})
    c = hardware.ceilings("cpu")
    assert (c.bandwidth_GBps, c.matmul_TFLOPs, c.rate("bf16")) == (7.0, 0.2, 0.4)
    entry = json.loads((tmp_path / "ceilings.json").read_text())[key]
    assert entry["schema"] == hardware.CACHE_SCHEMA and entry["matmul_by_dtype"]["bf16"] == 0.4


def test_corrupt_cache_is_remeasured(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEWISE_CACHE_DIR", str(tmp_path))
    (tmp_path / "ceilings.json").write_text("{not json")
    monkeypatch.setattr(hardware, "measure_bandwidth", lambda d: 3.0)
    monkeypatch.setattr(hardware, "measure_matmuls", lambda d: {"fp32": 0.1})
    assert hardware.ceilings("cpu").bandwidth_GBps == 3.0


def test_real_cpu_measurement_is_positive():
    bw = hardware.measure_bandwidth(torch.device("cpu"))
    mm = hardware.measure_matmul(torch.device("cpu"))
    assert 0.1 < bw < 10_000 and 1e-4 < mm < 1_000
    rates = hardware.measure_matmuls(torch.device("cpu"))
    assert set(rates) == {"fp32", "bf16"} and all(1e-5 < r < 1_000 for r in rates.values())


@pytest.mark.parametrize("api", ["precision", "legacy-flag"])
def test_measuring_restores_the_users_matmul_precision(api):
    """TF32 is switched on to measure it and the user's setting put back, whatever it was and
    however it was set (torch raises on reading a setting after a mix of its legacy and new
    APIs: the restore must not cause one)."""
    saved = torch.get_float32_matmul_precision()
    try:
        for users in ("medium", "highest", "high"):
            if api == "precision":
                torch.set_float32_matmul_precision(users)
            else:
                torch.backends.cuda.matmul.allow_tf32 = users != "highest"
            before = hardware.matmul_settings()
            hardware.measure_matmuls(torch.device("cpu"))
            with hardware.cuda_tf32(users == "highest"):
                assert hardware.matmul_settings()["cuda.matmul.allow_tf32"] == (users == "highest")
            assert hardware.matmul_settings() == before
            assert before["cuda.matmul.allow_tf32"] == (users != "highest")
            assert torch.backends.cuda.matmul.allow_tf32 == (users != "highest")  # no mix
        with pytest.raises(ZeroDivisionError), hardware.cuda_tf32(False):
            raise ZeroDivisionError
        assert hardware.matmul_settings()["cuda.matmul.allow_tf32"]  # put back after an error
    finally:
        torch.set_float32_matmul_precision(saved)


def test_matmul_for_picks_the_rate_of_the_dtype():
    rates = {"fp32": 60.0, "tf32": 400.0, "bf16": 800.0, "fp16": 810.0, "fp8": 1500.0}
    c = hardware.Ceilings("gpu", "cuda", 4000.0, 800.0, "test", matmul_by_dtype=rates)
    assert c.matmul_for(torch.float32) == 60.0
    assert c.matmul_for("float32", tf32=True) == 400.0
    assert c.matmul_for("torch.bfloat16") == 800.0 and c.matmul_for(torch.float16) == 810.0
    assert c.matmul_for(torch.float8_e4m3fn) == 1500.0
    assert c.matmul_for(torch.float64) is None and c.matmul_for("int8") is None
    assert c.ridge_for(60.0) == pytest.approx(60e12 / 4000e9)
    # ceilings that know their headline only: that rate for its dtype, nothing for the others
    bare = hardware.Ceilings("gpu", "cuda", 4000.0, 700.0, "test")
    assert bare.matmul_for(torch.bfloat16) == 700.0 and bare.matmul_for(torch.float32) is None
    cpu = hardware.Ceilings("cpu", "cpu", 20.0, 0.1, "test")
    assert cpu.matmul_for(torch.float32) == 0.1 and cpu.matmul_for(torch.bfloat16) is None


def test_datasheet_fallback_has_a_rate_per_dtype():
    sheet = hardware.datasheet_matmul("NVIDIA H200")
    assert sheet["fp32"] < sheet["tf32"] < sheet["bf16"] < sheet["fp8"]
    assert "fp8" not in hardware.datasheet_matmul("NVIDIA A100-SXM4-80GB")
    assert hardware.datasheet_matmul("NVIDIA H100 PCIe")["bf16"] == 756.0
    assert hardware.datasheet_matmul("Some CPU") is None


def test_datasheet_lookup_prefers_specific_names():
    assert hardware.datasheet("NVIDIA H100 PCIe") == (2000.0, 756.0)
    assert hardware.datasheet("NVIDIA H100 80GB HBM3") == (3350.0, 989.0)
    assert hardware.datasheet("NVIDIA H200") == (4800.0, 989.0)
    assert hardware.datasheet("Some CPU") is None
    with pytest.raises(ValueError, match="no datasheet"):
        hardware.ceilings("cpu", measure=False)


def test_norm_byte_model_matches_perf_md():
    m, n = 32768, 4096
    assert norm_cost.norm("layer_norm", m, n, torch.bfloat16).bytes == 2 * m * n * 2
    assert norm_cost.norm_fwd_bwd("rms_norm", m, n, torch.bfloat16).bytes == 5 * m * n * 2
    assert norm_cost.norm("add_rms_norm", m, n, torch.float32).bytes == 4 * m * n * 4
    full = norm_cost.norm("layer_norm", m, n, torch.bfloat16, activations_only=False)
    assert full.bytes == 2 * m * n * 2 + m * 2 * 4 + 2 * n * 2
    with pytest.raises(ValueError, match="kind must be one of"):
        norm_cost.norm("batch_norm", 1, 1, torch.float32)
    assert not hasattr(cost, "norm")  # declared once, by the family


def test_adamw_bytes_per_parameter_match_the_benchmark_model():
    """28 B per parameter in fp32 and in bf16 with fp32 masters (benchmarks/bench_adamw.py)."""
    assert adamw_cost.bytes_per_param(torch.float32) == 28
    assert adamw_cost.bytes_per_param(torch.bfloat16, master=True) == 2 + 4 + 4 + 4 + 4 * 3 + 2
    assert adamw_cost.bytes_per_param(torch.bfloat16) == 14  # all bf16: 4 read, 3 written
    assert adamw_cost.bytes_per_param(torch.bfloat16, state_dtype=torch.float32) == 12 + 10
    assert adamw_cost.bytes_per_param(torch.float32, amsgrad=True) == 28 + 8
    c = adamw_cost.step(1000, torch.float32)
    assert c.bytes == 28_000 and c.flops == 14_000


def test_linear_ce_flops_and_minimum_bytes():
    n, d, v = 16384, 4096, 128256
    f = lce_cost.forward(n, d, v, torch.bfloat16)
    b = lce_cost.backward(n, d, v, torch.bfloat16)
    both = lce_cost.fwd_bwd(n, d, v, torch.bfloat16)
    assert (f.flops, b.flops, both.flops) == (2 * n * d * v, 4 * n * d * v, 6 * n * d * v)
    operands = (n * d + v * d) * 2 + n * 8  # hidden, weight (bf16), int64 targets
    assert f.bytes == operands + 4
    assert both.bytes == operands + 4 + (n * d + v * d) * 2  # + dhidden, dweight
    assert b.bytes == operands + 4 + (n * d + v * d) * 2  # + grad_output; the same gradients
    with_bias = lce_cost.fwd_bwd(n, d, v, torch.bfloat16, bias=True, target_dtype=torch.int32)
    assert with_bias.bytes == both.bytes + 2 * v * 2 - n * 4
    assert lce_cost.backward(n, d, v, torch.bfloat16, recompute=True).flops == 6 * n * d * v


def test_registered_op_is_costed_by_its_family_first(monkeypatch):
    monkeypatch.setitem(cost._REGISTERED, "mylib.fused_", lambda name, i, o: cost.Cost(7.0, 9.0))
    monkeypatch.setitem(cost._REGISTERED, "mylib.other", lambda name, i, o: None)
    x = torch.ones(4)
    assert cost.aten_op("mylib.fused_thing.default", [x], [x]) == cost.Cost(7.0, 9.0)
    # None: the generic count (each tensor once, a FLOP per element of the largest)
    assert cost.aten_op("mylib.other.default", [x], [x.clone()]) == cost.Cost(4.0, 32.0)
    assert cost.aten_op("aten.add.Tensor", [x], [x.clone()]) == cost.Cost(4.0, 32.0)
    assert {"fusewise.norm_fwd.", "fusewise.norm_bwd.", "fusewise.linear_ce_"} <= set(
        cost._REGISTERED
    )


def _recorded(fn):
    from fusewise.capture.opgraph import Recorder

    with Recorder(profile=False) as rec:
        fn()
    return [op for op in rec.graph.ops if op.name.startswith("fusewise.")]


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm", "add_rms_norm"])
def test_recorded_norm_ops_get_the_family_cost(kind):
    """The recorder names a custom op "fusewise.norm_fwd.default"; its cost is the family's
    (weights and statistics included), not the generic one FLOP per element."""
    m, n = 6, 16
    x, r, dy, w = torch.randn(m, n), torch.randn(m, n), torch.randn(m, n), torch.randn(n)
    b = torch.randn(n) if kind == "layer_norm" else None
    res = r if kind == "add_rms_norm" else None
    is_rms = kind != "layer_norm"
    ops = torch.ops.fusewise
    y, h, mean, rstd = ops.norm_fwd(x, res, w, b, 1e-5, is_rms)
    (fwd,) = _recorded(lambda: ops.norm_fwd(x, res, w, b, 1e-5, is_rms))
    dh = torch.randn(m, n) if res is not None else None
    xn = h if res is not None else x
    (bwd,) = _recorded(lambda: ops.norm_bwd(dy, dh, xn, w, b, mean, rstd, is_rms))
    assert (fwd.name, bwd.name) == ("fusewise.norm_fwd.default", "fusewise.norm_bwd.default")
    want_fwd = norm_cost.norm(kind, m, n, torch.float32, activations_only=False)
    want_bwd = norm_cost.norm(kind, m, n, torch.float32, backward=True, activations_only=False)
    assert (fwd.flops, fwd.bytes) == (want_fwd.flops, want_fwd.bytes)
    assert (bwd.flops, bwd.bytes) == (want_bwd.flops, want_bwd.bytes)


def test_recorded_linear_ce_ops_get_the_family_cost():
    n, d, v = 10, 8, 30
    h, w, b = torch.randn(n, d), torch.randn(v, d), torch.randn(v)
    t = torch.randint(0, v, (n,))
    ops = torch.ops.fusewise
    opts = (0.0, 0.0, None, False, 0)  # label_smoothing, z_loss, softcap, fp32_accumulate, chunk
    (fused,) = _recorded(lambda: ops.linear_ce_fused(h, w, t, b, -100, True, *opts))
    (fwd,) = _recorded(lambda: ops.linear_ce_fwd(h, w, t, None, -100, "none", *opts))
    g = torch.rand(n)
    (bwd,) = _recorded(lambda: ops.linear_ce_bwd(g, h, w, t, None, -100, "none", *opts))
    want = lce_cost.fwd_bwd(n, d, v, torch.float32, bias=True)
    assert (fused.flops, fused.bytes) == (want.flops, want.bytes) and fused.flops == 6 * n * d * v
    want = lce_cost.forward(n, d, v, torch.float32, per_token=True)
    assert (fwd.flops, fwd.bytes) == (want.flops, want.bytes)
    want = lce_cost.backward(n, d, v, torch.float32, per_token=True, recompute=True)
    assert (bwd.flops, bwd.bytes) == (want.flops, want.bytes)


def test_matmul_and_elementwise_costs():
    c = cost.matmul(8192, 8192, 8192, torch.bfloat16)
    assert c.flops == 2 * 8192**3 and c.bytes == 3 * 8192 * 8192 * 2
    assert c.intensity == pytest.approx(2 * 8192 / 6)
    e = cost.elementwise(100, torch.float32, n_inputs=2)
    assert (e.flops, e.bytes) == (100, 1200)


def test_public_ops_are_recorded_as_one_fusewise_op_each(monkeypatch):
    """A user's step that already calls fusewise's ops, recorded: each call goes through its
    custom op while a dispatch mode is active, so the op graph holds one fusewise op with the
    family's cost (not the interpreter's copies, nor nothing at all as for a GPU launch), on
    the line that called it, forward and backward, with the path reported."""
    from fusewise.capture.opgraph import Recorder

    gpu = torch.cuda.is_available()
    dev = "cuda" if gpu else "cpu"
    if not gpu:  # the kernels under the interpreter (conftest.py decorates them so)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    m, n, v = 6, 32, 40
    x = torch.randn(m, n, requires_grad=True, device=dev)
    w = torch.randn(n, requires_grad=True, device=dev)
    head = torch.randn(v, n, requires_grad=True, device=dev)
    t = torch.randint(0, v, (m,), device=dev)
    with Recorder(profile=False) as rec:
        y = fusewise.ops.rms_norm(x, w)  # the norm's line
        fusewise.ops.linear_cross_entropy(y, head, t).backward()
    names = [op.name for op in rec.graph.ops]
    ours = [op for op in rec.graph.ops if op.name.startswith("fusewise.")]
    assert [op.name for op in ours] == [
        "fusewise.norm_fwd.default",
        "fusewise.linear_ce_fused.default",
        "fusewise.linear_ce_scale.default",
        "fusewise.linear_ce_scale.default",
        "fusewise.norm_bwd.default",
    ]
    assert not any(name.startswith(("aten.copy_", "aten.clone")) for name in names)
    fwd = ours[0]
    assert fwd.where.endswith(f":{_line_of('# the norm' + chr(39) + 's line')}")
    want = norm_cost.norm("rms_norm", m, n, torch.float32, activations_only=False)
    assert (fwd.flops, fwd.bytes) == (want.flops, want.bytes)
    assert ours[-1].phase == "backward" and ours[-1].where == fwd.where
    paths = fusewise.ops.paths()
    want_path = "triton" if gpu else "triton-interpreter"
    assert paths["rms_norm"] == paths["linear_cross_entropy"] == want_path


def _line_of(text: str) -> int:
    import inspect

    lines = inspect.getsource(inspect.getmodule(_line_of)).splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "_line_of" not in line)


def test_compiled_linear_ce_on_the_cpu_says_it_runs_the_reference(monkeypatch):
    """The custom ops that torch.compile traces choose their path as eager calls do: on the CPU
    without the interpreter they warn (once) and FUSEWISE_STRICT=1 refuses; never silent."""
    from fusewise.ops import _dispatch

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(_dispatch, "_warned", set())
    h, head = torch.randn(4, 8, requires_grad=True), torch.randn(20, 8)
    t = torch.randint(0, 20, (4,))
    loss = torch.compile(
        lambda h: fusewise.ops.linear_cross_entropy(h, head, t), backend="eager", fullgraph=True
    )
    with pytest.warns(UserWarning, match="linear_cross_entropy: tensors are on the CPU"):
        loss(h).backward()
    assert fusewise.ops.paths()["linear_cross_entropy"] == "reference"
    monkeypatch.setenv("FUSEWISE_STRICT", "1")
    with pytest.raises(fusewise.ops.FusewiseFallbackError):
        loss(h)


def test_every_rate_key_builds_a_matmul_that_runs():
    """The operands each key is measured with (fp8: e4m3 through torch._scaled_mm, which the CPU
    build runs too), so the GPU-only measurement's call is exercised here."""
    from fusewise.hardware.matmul import matmul_fn

    for key in hardware.RATE_KEYS:
        out = matmul_fn(64, 48, 32, key, torch.device("cpu"))()
        assert out.shape == (64, 48), key
    assert matmul_fn(8, 6, 4, "bf16", "cpu", batch=3)().shape == (3, 8, 6)
    assert hardware.time_matmul_ms(32, 40, 24, "fp32", device="cpu") > 0


@pytest.mark.gpu
def test_gpu_rates_per_dtype_are_measured_in_a_few_seconds():
    """On the GPU: every key measured (fp8 where the GPU has it), TF32 faster than fp32 without
    it, the user's setting back afterwards, and all of it quick."""
    import time

    device = torch.device("cuda")
    before = hardware.matmul_settings()
    t = time.perf_counter()
    rates = hardware.measure_matmuls(device)
    assert time.perf_counter() - t < 10
    want = {"fp32", "tf32", "bf16", "fp16"} | ({"fp8"} if hardware.fp8_supported(device) else set())
    assert set(rates) == want
    assert rates["tf32"] > 2 * rates["fp32"] and rates["bf16"] > rates["tf32"]
    assert hardware.matmul_settings() == before
    ms = hardware.time_matmul_ms(4096, 50257, 768, "bf16")
    assert 0 < ms < 100
