"""Host-device syncs from the op graph: named with their line and counted; CPU-only values are
not syncs. The graph is written by hand with device "cuda" values (no GPU in CI); a GPU-only test
records a real .item()."""

import pytest
import torch

from fusewise.capture.opgraph import OpGraph, OpRecord, Recorder, Value
from fusewise.diagnose.syncs import find_syncs


def graph(device: str) -> OpGraph:
    values = {
        0: Value(0, (1024,), "float32", 4096, device=device),
        1: Value(1, (), "float32", 4, device=device),
        2: Value(2, (1024,), "float32", 4096, device="cpu"),
    }
    ops = [
        OpRecord(0, "aten.sum.default", "forward", [0], [1], 1024.0, 4100.0, "train.py:10"),
        OpRecord(
            1, "aten._local_scalar_dense.default", "forward", [1], [], 1.0, 4.0, "train.py:11"
        ),
        OpRecord(
            2, "aten._local_scalar_dense.default", "forward", [1], [], 1.0, 4.0, "train.py:11"
        ),
        OpRecord(3, "aten._to_copy.default", "forward", [0], [2], 1024.0, 8192.0, "train.py:12"),
    ]
    return OpGraph(ops, values)


def test_syncs_on_gpu_values_are_named_and_counted():
    found = {f.where: f for f in find_syncs(graph("cuda"))}
    assert set(found) == {"train.py:11", "train.py:12"}
    assert found["train.py:11"].evidence["syncs_per_step"] == 2
    assert ".item()" in found["train.py:11"].title
    assert "copy to the CPU" in found["train.py:12"].title
    assert all(f.kind == "host-sync" for f in found.values())


def test_cpu_values_are_not_syncs():
    assert find_syncs(graph("cpu")) == []


def test_recorder_keeps_devices():
    with Recorder() as rec:
        torch.ones(3).sum().item()
    op = next(o for o in rec.graph.ops if o.name.startswith("aten._local_scalar_dense"))
    assert rec.graph.values[op.inputs[0]].device == "cpu"
    assert find_syncs(rec.graph) == []


@pytest.mark.gpu
def test_item_on_the_gpu_is_a_sync():
    x = torch.randn(1000, device="cuda")
    with Recorder() as rec:
        if x.sum() > 0:  # bool(tensor)
            pass
        x.mean().item()
    found = find_syncs(rec.graph)  # one per line: the `if`, and the .item()
    assert len(found) == 2 and all("test_syncs.py" in f.where for f in found)
    assert all(f.evidence["syncs_per_step"] == 1 for f in found)
