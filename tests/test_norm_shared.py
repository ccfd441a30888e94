"""The norms' backward with each row shared by several programs (ops/norms/kernels_bwd_shared.py,
issue #14): every op, dtype and schedule held to eager PyTorch's error against float64, with
NaN-poisoned outputs, ragged last parts and tiles, strided rows, and the launch plan."""

import pytest
import torch
from norm_cases import DTYPES, OPS, SLACK, make_inputs
from test_norm_numerics import check

from fusewise.ops.norms import launch as norm_launch


def _shared(monkeypatch, part: int, tile: int = 256, warps: int = 4, hoist: bool = True):
    """Every op and element size on one shared-row setting (any width)."""
    setting = norm_launch.Bwd(1 << 20, tile, warps, 2, prefetch=hoist, part=part)
    monkeypatch.setattr(
        norm_launch, "BWD_CONFIGS", dict.fromkeys(norm_launch.BWD_CONFIGS, (setting,))
    )
    return setting


@pytest.mark.parametrize("hoist", [True, False])
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_shared_rows_agree_with_float64(op, dname, hoist, device, monkeypatch):
    """Parts of 128 columns: 300 wide is 3 programs a row, the last one 44 wide. 13 rows in
    tiles of 2 (1024 // the row's 512 block) are 7 tiles; 6 programs a wave under the
    interpreter (3, 2 a multiprocessor) make 2 groups of 4 tiles, the last past the end, each
    group summing its own rows' weight gradients (SINGLE_PROGRAM_ELEMENTS 0: never one group
    for a small call). 6 x 64 is one part and one tile."""
    _shared(monkeypatch, part=128, tile=1024, hoist=hoist)
    monkeypatch.setattr(norm_launch, "SINGLE_PROGRAM_ELEMENTS", 0)
    dtype = DTYPES[dname]
    for shape, strided in [((13, 300), False), ((13, 300), True), ((6, 64), False)]:
        a = make_inputs(op, shape, dtype, device, strided=strided)
        plan = norm_launch._backward_plan(*shape, op, dtype.itemsize, a["x"].device)
        assert plan.share == -(-shape[1] // 128) and plan.setting.part == 128
        if a["x"].device.type == "cpu":
            assert plan.programs == (2 if shape[1] == 300 else 1)
        check(op, a, SLACK[dtype])


@pytest.mark.parametrize("op", OPS)
def test_one_group_writes_the_gradients_itself(op, device, monkeypatch):
    """A small call is one group of programs, each writing its own columns of dweight (and
    dbias) in their dtype: no partials, no sum kernel."""
    _shared(monkeypatch, part=128)
    a = make_inputs(op, (4, 512), torch.bfloat16, device)
    plan = norm_launch._backward_plan(4, 512, op, 2, a["x"].device)
    assert plan.programs == 1 and plan.share == 4
    names = []
    real = norm_launch.launch

    def counting(kernel, grid, *args, **meta):
        names.append((kernel.__name__, grid))
        return real(kernel, grid, *args, **meta)

    monkeypatch.setattr(norm_launch, "launch", counting)
    check(op, a, SLACK[torch.bfloat16])
    assert ("norm_bwd_shared_kernel", (4,)) in names
    assert all(name != "sum_partials_kernel" for name, _ in names)


def test_shared_settings_are_not_capped_by_the_register_block(monkeypatch):
    """MAX_BLOCK_N caps the settings that hold whole rows; a row shared by programs is not
    held by one, so it takes the shared kernel past it, and the split kernels do not."""
    _shared(monkeypatch, part=64)
    monkeypatch.setattr(norm_launch, "MAX_BLOCK_N", 128)
    assert not norm_launch.use_wide_path(1000, True, "layer_norm", 2)
    plan = norm_launch._backward_plan(64, 1000, "layer_norm", 2, torch.device("cpu"))
    assert plan.share == 16
    # a setting holding rows is still capped
    held = norm_launch.Bwd(1 << 20, 256, 4, 1)
    monkeypatch.setattr(norm_launch, "BWD_CONFIGS", dict.fromkeys(norm_launch.BWD_CONFIGS, (held,)))
    assert norm_launch.use_wide_path(1000, True, "layer_norm", 2)


def test_groups_fill_the_wave_with_whole_groups(monkeypatch):
    """programs = groups of `share`: as many whole groups as the wave holds, at least one."""
    _shared(monkeypatch, part=64, tile=64)
    monkeypatch.setattr(norm_launch, "SINGLE_PROGRAM_ELEMENTS", 0)
    dev = torch.device("cpu")  # 3 programs a wave under the interpreter, 2 per SM: 6
    assert norm_launch._backward_plan(50, 128, "rms_norm", 2, dev).programs == 3  # share 2
    assert norm_launch._backward_plan(50, 1024, "rms_norm", 2, dev).programs == 1  # share 16
    assert norm_launch._backward_plan(2, 128, "rms_norm", 2, dev).programs == 2  # 2 tiles
