"""The backward with a row's columns shared out among programs (launch.Bwd.slice,
kernels_bwd_sliced): against float64, held to eager PyTorch's error in the same dtype; ragged
last slices and chunks, rows past the programs, strided and broadcast rows, no weight, and the
schedule launch.py makes for it. Runs the real Triton kernels (the interpreter on the CPU)."""

import pytest
import torch
from norm_cases import (
    DTYPES,
    OPS,
    SLACK,
    check_backward_through_row_strides,
    check_without_weight,
    make_inputs,
)
from norm_cases import check_op as check

from fusewise.ops.norms import launch as norm_launch

Bwd = norm_launch.Bwd


def _only(monkeypatch, setting):
    """Every op and dtype on `setting` alone."""
    configs = dict.fromkeys(norm_launch.BWD_CONFIGS, (setting,))
    monkeypatch.setattr(norm_launch, "BWD_CONFIGS", configs)


def _sliced_launches(monkeypatch):
    """The kernel names norm_backward launches, in order."""
    names, real = [], norm_launch.launch

    def counting(kernel, grid, *args, **meta):
        names.append((kernel.fn.__name__, grid, meta))
        return real(kernel, grid, *args, **meta)

    monkeypatch.setattr(norm_launch, "launch", counting)
    return names


# (rows, width, slice, chunk, programs a multiprocessor, unrolled): the last slice ragged (100 =
# 3·32 + 4) and its chunks too, whole slices, the walk in a loop and unrolled, more rows than
# programs, and one group of programs (the gradients written directly)
CASES = {
    "ragged-slices": (37, 100, 32, 16, 4, False),
    "whole-slices-unrolled": (37, 128, 32, 32, 4, True),
    "two-slices": (23, 100, 64, 32, 2, False),
    "one-group": (5, 96, 32, 32, 1, True),
    # a chunk wider than the slice (capped at it: uncapped, the walk had no whole chunk and the
    # row sums came out 0), and a row narrower than one slice
    "chunk-past-slice": (9, 40, 32, 64, 2, False),
    "row-within-slice": (9, 20, 32, 64, 2, True),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_sliced_backward_against_float64(op, dname, case, device, monkeypatch):
    m, n, sl, chunk, per_sm, unroll = CASES[case]
    setting = Bwd(1 << 20, chunk, 4, per_sm, slice=sl, unroll=unroll)
    _only(monkeypatch, setting)
    dtype = DTYPES[dname]
    plan = norm_launch._backward_plan(m, n, op, dtype.itemsize, torch.device(device))
    assert plan.setting == setting and plan.slices == -(-n // sl) and plan.block_n == sl
    launches = _sliced_launches(monkeypatch)
    check(op, make_inputs(op, (m, n), dtype, device), SLACK[dtype])
    names = [name for name, _, _ in launches]
    assert names.count("norm_bwd_sliced_kernel") == 1 and "norm_bwd_block_kernel" not in names
    (grid,) = [g for name, g, _ in launches if name == "norm_bwd_sliced_kernel"]
    assert grid == (plan.groups * plan.slices,)
    # partials summed afterwards unless one group of programs took every row
    assert ("sum_partials_kernel" in names) == (plan.groups > 1)


def test_sliced_plan():
    """Slices of the row's power-of-two block (capped at the row's), groups of programs from the
    programs a multiprocessor shared among the slices, rows shared out among the groups."""
    L, cpu = norm_launch, torch.device("cpu")  # 3 programs a wave under the interpreter
    configs = {("layer_norm", 2): (Bwd(1 << 20, 16, 4, 4, slice=32),)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(L, "BWD_CONFIGS", configs)
        plan = L._backward_plan(37, 100, "layer_norm", 2, cpu)
        assert (plan.block_m, plan.block_n, plan.slices) == (1, 32, 4)
        assert (plan.groups, plan.tiles_per_program) == (3, 13)  # 4 · 3 // 4 groups
        # a row narrower than the slice: one slice; and few elements, so one program
        plan = L._backward_plan(37, 20, "layer_norm", 2, cpu)
        assert (plan.block_n, plan.slices, plan.groups) == (32, 1, 1)
        mp.setattr(L, "SINGLE_PROGRAM_ELEMENTS", 0)
        plan = L._backward_plan(37, 20, "layer_norm", 2, cpu)
        assert (plan.block_n, plan.slices, plan.groups) == (32, 1, 12)
        plan = L._backward_plan(2, 100, "layer_norm", 2, cpu)  # fewer rows than groups
        assert (plan.groups, plan.tiles_per_program) == (2, 1)
        # a slice wider than MAX_BLOCK_N is not used; the row itself may be wider
        mp.setattr(L, "MAX_BLOCK_N", 16)
        assert L._backward_plan(37, 100, "layer_norm", 2, cpu) is None
        mp.setattr(L, "MAX_BLOCK_N", 32)
        assert L._backward_plan(37, 1000, "layer_norm", 2, cpu).slices == 32
        assert not L.use_wide_path(1000, True, "layer_norm", 2)


@pytest.mark.parametrize("x_rows, dy_rows", [("padded", "broadcast"), ("broadcast", "padded")])
@pytest.mark.parametrize("op", OPS)
def test_sliced_backward_reads_through_row_strides(op, x_rows, dy_rows, device, monkeypatch):
    """x, dy (and dh) through their own row strides, padded or 0, in the walk and in the slice's
    second read, against the float64 analytic backward."""
    _only(monkeypatch, Bwd(1 << 20, 16, 4, 4, slice=32))
    check_backward_through_row_strides(op, x_rows, dy_rows, device)


@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_sliced_backward_without_weight(op, dname, device, monkeypatch):
    """No weight (and no bias): dx (and add+RMSNorm's residual gradient) against float64, held
    to eager PyTorch's error in the same dtype."""
    _only(monkeypatch, Bwd(1 << 20, 16, 4, 4, slice=32, unroll=True))
    check_without_weight(op, DTYPES[dname], 37, device)
