"""LayerNorm's bias gradient summed by its own kernel over dy (launch.Bwd.bias_apart,
kernels_bwd.column_sums_kernel), the fused backward left with dx and the weight gradient: against
float64, held to eager PyTorch's error in the same dtype; one group of programs (dbias written
directly) and several (fp32 partials), ragged column blocks, strided and broadcast rows, the
sliced backward, and no bias. Runs the real Triton kernels (the interpreter on the CPU)."""

import pytest
import torch
from norm_cases import DTYPES, SLACK, check_backward_through_row_strides, make_inputs
from norm_cases import check_op as check

from fusewise.ops.norms import kernels_bwd as KB
from fusewise.ops.norms import launch as L


def _apart(monkeypatch, **setting):
    """Every backward on one bias_apart setting; returns the kernels launched, with their
    constexprs, as they are launched."""
    bwd = L.Bwd(**{"widest": 1 << 20, "tile": 256, "warps": 4, "per_sm": 1} | setting)
    monkeypatch.setattr(L, "BWD_CONFIGS", dict.fromkeys(L.BWD_CONFIGS, (bwd,)))
    launched, launch = [], L.launch

    def spy(kernel, grid, *args, **meta):
        launched.append((kernel, meta))
        return launch(kernel, grid, *args, **meta)

    monkeypatch.setattr(L, "launch", spy)
    return launched


def _fused_has_b(launched) -> list:
    return [meta["HAS_B"] for k, meta in launched if k in (KB.norm_bwd_block_kernel,)]


@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize(
    "shape",
    [(5, 64), (301, 100), (2, 7, 257)],  # one group; 3 groups (interpreter), ragged rows; 3-D
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
    assert [k for k, _ in launched].count(KB.column_sums_kernel) == 1


@pytest.mark.parametrize("lean, reload", [(True, True), (False, False), (True, False)])
def test_bias_gradient_apart_with_each_fused_variant(lean, reload, device, monkeypatch):
    """The shipped variants' orders of work (reload: x and dy read again) with the bias apart,
    more rows than programs, the sums' tiles of 2 rows."""
    monkeypatch.setattr(L, "COLSUM_M", 2)
    launched = _apart(monkeypatch, bias_apart=True, prefetch=False, lean=lean, reload=reload)
    a = make_inputs("layer_norm", (97, 300), torch.bfloat16, device)
    check("layer_norm", a, SLACK[torch.bfloat16])
    assert _fused_has_b(launched) == [False]


def test_bias_gradient_apart_with_the_sliced_backward(device, monkeypatch):
    """A row's columns shared out among programs (Bwd.slice) with the bias apart: the sliced
    kernel without bias accumulators, the column sums into the same partial rows."""
    launched = _apart(monkeypatch, tile=64, slice=128, bias_apart=True)
    check("layer_norm", make_inputs("layer_norm", (41, 300), torch.float32, device), 1e-6)
    sliced = [meta["HAS_B"] for k, meta in launched if k is not KB.column_sums_kernel]
    assert False in sliced and [k for k, _ in launched].count(KB.column_sums_kernel) == 1


@pytest.mark.parametrize("x_rows, dy_rows", [("padded", "broadcast"), ("broadcast", "padded")])
def test_bias_gradient_apart_reads_dy_through_its_row_stride(x_rows, dy_rows, device, monkeypatch):
    """dy with padded rows or a row stride of 0 (an expanded gradient): the column sums read it
    through its own stride (against the float64 analytic backward)."""
    monkeypatch.setattr(L, "COLSUM_N", 32)
    launched = _apart(monkeypatch, bias_apart=True, reload=True, prefetch=False, lean=True)
    check_backward_through_row_strides("layer_norm", x_rows, dy_rows, device)
    assert [k for k, _ in launched].count(KB.column_sums_kernel) == 1


def test_no_bias_no_column_sums(device, monkeypatch):
    """A LayerNorm without bias on a bias_apart setting launches no column sums and returns no
    bias gradient."""
    launched = _apart(monkeypatch, bias_apart=True)
    x = torch.randn(9, 64, device=device)
    w, dy = torch.randn(64, device=device), torch.randn(9, 64, device=device)
    mean, rstd = x.mean(-1), torch.rsqrt(x.var(-1, unbiased=False) + 1e-5)
    dx, dw, db = L.norm_backward(dy, None, x, w, None, mean, rstd, False)
    assert db is None and dw is not None
    assert KB.column_sums_kernel not in [k for k, _ in launched]
    xhat = (x - mean[:, None]) * rstd[:, None]
    torch.testing.assert_close(dw, (dy * xhat).sum(0), rtol=1e-5, atol=1e-5)
