import json

import pytest
import torch

from fusewise import cost, hardware


def test_cpu_ceilings_are_measured_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEWISE_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(hardware, "measure_bandwidth", lambda d: calls.append("bw") or 12.5)
    monkeypatch.setattr(hardware, "measure_matmul", lambda d: calls.append("mm") or 0.5)
    c = hardware.ceilings("cpu")
    assert (c.bandwidth_GBps, c.matmul_TFLOPs, c.source) == (12.5, 0.5, "measured")
    assert c.ridge == pytest.approx(0.5e12 / 12.5e9)
    again = hardware.ceilings("cpu")  # from the cache: nothing measured twice
    assert calls == ["bw", "mm"] and again.bandwidth_GBps == 12.5
    cache = json.loads((tmp_path / "ceilings.json").read_text())
    assert any(torch.__version__ in key for key in cache)  # keyed by versions too
    hardware.ceilings("cpu", refresh=True)
    assert calls == ["bw", "mm", "bw", "mm"]


def test_corrupt_cache_is_remeasured(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEWISE_CACHE_DIR", str(tmp_path))
    (tmp_path / "ceilings.json").write_text("{not json")
    monkeypatch.setattr(hardware, "measure_bandwidth", lambda d: 3.0)
    monkeypatch.setattr(hardware, "measure_matmul", lambda d: 0.1)
    assert hardware.ceilings("cpu").bandwidth_GBps == 3.0


def test_real_cpu_measurement_is_positive():
    bw = hardware.measure_bandwidth(torch.device("cpu"))
    mm = hardware.measure_matmul(torch.device("cpu"))
    assert 0.1 < bw < 10_000 and 1e-4 < mm < 1_000


def test_datasheet_lookup_prefers_specific_names():
    assert hardware.datasheet("NVIDIA H100 PCIe") == (2000.0, 756.0)
    assert hardware.datasheet("NVIDIA H100 80GB HBM3") == (3350.0, 989.0)
    assert hardware.datasheet("NVIDIA H200") == (4800.0, 989.0)
    assert hardware.datasheet("Some CPU") is None
    with pytest.raises(ValueError, match="no datasheet"):
        hardware.ceilings("cpu", measure=False)


def test_norm_byte_model_matches_perf_md():
    m, n = 32768, 4096
    assert cost.norm("layer_norm", m, n, torch.bfloat16).bytes == 2 * m * n * 2
    assert cost.norm_fwd_bwd("rms_norm", m, n, torch.bfloat16).bytes == 5 * m * n * 2
    assert cost.norm("add_rms_norm", m, n, torch.float32).bytes == 4 * m * n * 4
    full = cost.norm("layer_norm", m, n, torch.bfloat16, activations_only=False)
    assert full.bytes == 2 * m * n * 2 + m * 2 * 4 + 2 * n * 2
    with pytest.raises(ValueError, match="kind must be one of"):
        cost.norm("batch_norm", 1, 1, torch.float32)


def test_matmul_and_elementwise_costs():
    c = cost.matmul(8192, 8192, 8192, torch.bfloat16)
    assert c.flops == 2 * 8192**3 and c.bytes == 3 * 8192 * 8192 * 2
    assert c.intensity == pytest.approx(2 * 8192 / 6)
    e = cost.elementwise(100, torch.float32, n_inputs=2)
    assert (e.flops, e.bytes) == (100, 1200)
