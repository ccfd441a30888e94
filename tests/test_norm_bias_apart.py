"""LayerNorm's bias gradient summed by its own kernel over dy (launch.Bwd.bias_apart,
kernels_bias.column_sums_kernel), the fused backward left with dx and the weight gradient: against
float64, held to eager PyTorch's error in the same dtype; one group of programs (dbias written
directly) and several (fp32 partials), ragged column blocks, strided and broadcast rows, the
sliced backward, and no bias. Runs the real Triton kernels (the interpreter on the CPU)."""

import pytest
import torch
from norm_cases import (
    DTYPES,
    SLACK,
    check_backward_through_row_strides,
    make_inputs,
    one_backward_setting,
)
from norm_cases import check_op as check

from fusewise.ops.norms import kernels_bias as KBIAS
from fusewise.ops.norms import kernels_bwd as KB
from fusewise.ops.norms import kernels_bwd_sliced as KBS
from fusewise.ops.norms import launch as L


def _apart(monkeypatch, **setting):
    """Every backward on one setting (norm_cases): the kernels launched, with their constexprs."""
    return one_backward_setting(monkeypatch, **setting)


def _fused_has_b(launched) -> list:
    return [meta["HAS_B"] for k, meta in launched if k in (KB.norm_bwd_block_kernel,)]


@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize(
    "shape",
    [(5, 64), (301, 100), (2, 7, 257)],  # one group; 3 groups, ragged rows; 3-D
)
def test_bias_gradient_apart_matches_float64(shape, dname, device, monkeypatch):
    """dx, dweight and dbias with the bias gradient's column sums on their own, in 64-column
    blocks (ragged at 100 and 257): the fused kernel is launched without its bias accumulators,
    and the column sums once."""
    monkeypatch.setattr(L, "COLSUM_N", 64)
    launched = _apart(monkeypatch, bias_apart=True)
    dtype = DTYPES[dname]
    check("layer_norm", make_inputs("layer_norm", shape, dtype, device), SLACK[dtype])
    assert _fused_has_b(launched) == [False]
    assert [k for k, _ in launched].count(KBIAS.column_sums_kernel) == 1


@pytest.mark.parametrize("lean, reload", [(True, True), (False, False), (True, False)])
def test_bias_gradient_apart_with_each_fused_variant(lean, reload, device, monkeypatch):
    """The shipped variants' orders of work (reload: x and dy read again) with the bias apart,
    more rows than programs, the sums' tiles of 2 rows."""
    monkeypatch.setattr(L, "COLSUM_M", 2)
    launched = _apart(monkeypatch, bias_apart=True, prefetch=False, lean=lean, reload=reload)
    a = make_inputs("layer_norm", (97, 300), torch.bfloat16, device)
    check("layer_norm", a, SLACK[torch.bfloat16])
    assert _fused_has_b(launched) == [False]


@pytest.mark.parametrize("per_sm", [1, 3])  # one group of 3 slices; 3 groups (partial rows)
def test_bias_gradient_apart_with_the_sliced_backward(per_sm, device, monkeypatch):
    """A row's columns shared out among programs (Bwd.slice) with the bias apart: the sliced
    kernel without bias accumulators, the column sums into the same partial rows."""
    launched = _apart(monkeypatch, tile=64, slice=128, per_sm=per_sm, bias_apart=True)
    check("layer_norm", make_inputs("layer_norm", (41, 300), torch.float32, device), 1e-6)
    sliced = [meta["HAS_B"] for k, meta in launched if k is KBS.norm_bwd_sliced_kernel]
    assert sliced == [False] and [k for k, _ in launched].count(KBIAS.column_sums_kernel) == 1
    plan = L._backward_plan(41, 300, "layer_norm", 4, torch.device(device))
    assert plan.groups == per_sm and plan.slices == 3


@pytest.mark.parametrize("single", [True, False])  # dbias itself; 3 groups of partial rows
@pytest.mark.parametrize("x_rows, dy_rows", [("padded", "broadcast"), ("broadcast", "padded")])
def test_bias_gradient_apart_reads_dy_through_its_row_stride(
    x_rows, dy_rows, single, device, monkeypatch
):
    """dy with padded rows or a row stride of 0 (an expanded gradient): the column sums read it
    through its own stride (against the float64 analytic backward), into dbias itself or into
    partial rows N apart."""
    monkeypatch.setattr(L, "COLSUM_N", 32)
    if not single:
        monkeypatch.setattr(L, "SINGLE_PROGRAM_ELEMENTS", 0)
    launched = _apart(monkeypatch, bias_apart=True, reload=True, prefetch=False, lean=True)
    check_backward_through_row_strides("layer_norm", x_rows, dy_rows, device)
    assert [k for k, _ in launched].count(KBIAS.column_sums_kernel) == 1


def test_no_bias_no_column_sums(device, monkeypatch):
    """A LayerNorm without bias on a bias_apart setting launches no column sums and returns no
    bias gradient."""
    launched = _apart(monkeypatch, bias_apart=True)
    x = torch.randn(9, 64, device=device)
    w, dy = torch.randn(64, device=device), torch.randn(9, 64, device=device)
    mean, rstd = x.mean(-1), torch.rsqrt(x.var(-1, unbiased=False) + 1e-5)
    dx, dw, db = L.norm_backward(dy, None, x, w, None, mean, rstd, False)
    assert db is None and dw is not None
    assert KBIAS.column_sums_kernel not in [k for k, _ in launched]
    xhat = (x - mean[:, None]) * rstd[:, None]
    torch.testing.assert_close(dw, (dy * xhat).sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dname", ["bf16", "fp16"])
def test_bias_gradient_apart_in_the_parameters_dtype(dname, device, monkeypatch):
    """Activations in bf16 or fp16 with fp32 weight and bias (mixed precision's master
    parameters): dbias comes back in fp32, not rounded through the activations' dtype, within
    eager PyTorch's error; one group and three."""
    launched = _apart(monkeypatch, bias_apart=True)
    dtype = DTYPES[dname]
    for shape in [(5, 64), (301, 100)]:
        a = make_inputs("layer_norm", shape, dtype, device, weight_dtype=torch.float32)
        check("layer_norm", a, SLACK[dtype])
    assert _fused_has_b(launched) == [False, False]


def test_single_group_dbias_rounds_to_nearest(device, monkeypatch):
    """One group writes dbias in bf16 itself: rounded to nearest from its fp32 sum, within half
    a bf16 ulp of the float64 sum (plus the fp32 sum's own error), where a truncating store
    misses by up to a whole ulp; and the same bits on a second call (a fixed order)."""
    _apart(monkeypatch, bias_apart=True)
    m, n = 6, 512
    x = torch.randn(m, n, device=device).to(torch.bfloat16)
    dy = torch.randn(m, n, device=device).to(torch.bfloat16)
    w = torch.randn(n, device=device).to(torch.bfloat16)
    b = torch.zeros(n, device=device, dtype=torch.bfloat16)
    mean, rstd = x.float().mean(-1), torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5)
    assert L._backward_plan(m, n, "layer_norm", 2, torch.device(device)).groups == 1
    db = L.norm_backward(dy, None, x, w, b, mean, rstd, False)[2]
    want = dy.double().sum(0)
    half_ulp = 2.0 ** (torch.floor(torch.log2(want.abs().clamp_min(1e-30))) - 8)
    assert ((db.double() - want).abs() <= half_ulp * (1 + 1e-3) + 1e-6 * want.abs()).all()
    again = L.norm_backward(dy, None, x, w, b, mean, rstd, False)[2]
    assert torch.equal(db, again)


@pytest.mark.parametrize("shape", [(1, 64), (7, 1), (1, 1)])
def test_bias_gradient_apart_one_row_or_one_column(shape, device, monkeypatch):
    """M = 1 and N = 1 (a column block of one element), against float64."""
    _apart(monkeypatch, bias_apart=True)
    check("layer_norm", make_inputs("layer_norm", shape, torch.float32, device), 1e-6)


@pytest.mark.parametrize("rows", [5, 301])  # one group; 3 groups of partial rows (bias only)
def test_bias_gradient_apart_without_weight(rows, device, monkeypatch):
    """A bias and no weight: the fused kernel without either accumulator, the column sums into
    dbias itself or into the only plane of partials."""
    launched = _apart(monkeypatch, bias_apart=True)
    x = torch.randn(rows, 100, device=device) * 2 + 0.5
    dy, b = torch.randn(rows, 100, device=device), torch.randn(100, device=device)
    xd = x.double()
    mean, rstd = xd.mean(-1), torch.rsqrt(xd.var(-1, unbiased=False) + 1e-5)
    dx, dw, db = L.norm_backward(dy, None, x, None, b, mean.float(), rstd.float(), False)
    assert dw is None and _fused_has_b(launched) == [False]
    assert [k for k, _ in launched].count(KBIAS.column_sums_kernel) == 1
    torch.testing.assert_close(db.double(), dy.double().sum(0), rtol=1e-5, atol=1e-5)


def test_column_sums_take_dy_aligned(device, monkeypatch):
    """Widths and row strides 16 does not divide: the column sums get ALIGN of the width and
    dy's row stride (their loads 16 bytes wide on the GPU)."""
    launched = _apart(monkeypatch, bias_apart=True)
    a = make_inputs("layer_norm", (7, 1004), torch.bfloat16, device)
    check("layer_norm", a, SLACK[torch.bfloat16])
    assert [m["ALIGN"] for k, m in launched if k is KBIAS.column_sums_kernel] == [4]


@pytest.mark.parametrize("dname", ["bf16", "fp16"])
@pytest.mark.parametrize("rows", [2, 3])  # one group (dbias itself); three
def test_shipped_setting_at_12289(rows, dname, device):
    """The shipped 16-bit LayerNorm setting at its narrowest, 12,289 (a quarter of its block
    masked; narrower rows take two blocks)."""
    assert L.bwd_config(12289, "layer_norm")[2].bias_apart
    assert not L.bwd_config(12288, "layer_norm")[2].bias_apart
    dtype = DTYPES[dname]
    check("layer_norm", make_inputs("layer_norm", (rows, 12289), dtype, device), SLACK[dtype])
