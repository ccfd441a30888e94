"""The fused backward on rows held as a head block and a tail block (launch.Bwd.head,
kernels_bwd_pieces): against float64, held to eager PyTorch's error in the same dtype; every op,
with and without the next row's loads in flight, ragged and exact tails, one program (the
gradients written directly) and several (fp32 partials), the bias apart, strided and broadcast
rows, no weight; and rows no wider than the head on the one-block kernel. Runs the real Triton
kernels (the interpreter on the CPU)."""

import pytest
import torch
from norm_cases import (
    DTYPES,
    OPS,
    SLACK,
    check_backward_through_row_strides,
    check_without_weight,
    make_inputs,
    one_backward_setting,
    rel_err,
)
from norm_cases import check_op as check

from fusewise.ops.norms import kernels_bias as KBIAS
from fusewise.ops.norms import kernels_bwd as KB
from fusewise.ops.norms import kernels_bwd_pieces as KBP
from fusewise.ops.norms import launch as L
from fusewise.ops.norms import reference as R


def _head(monkeypatch, head=64, tail=64, **setting):
    """Every backward on one setting with a head block of `head` and tails up to `tail`
    (norm_cases)."""
    return one_backward_setting(monkeypatch, head=head, tail=tail, **setting)


def _pieces(launched) -> list:
    return [(m["HEAD"], m["TAIL"]) for k, m in launched if k is KBP.norm_bwd_pieces_kernel]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize(
    "shape, tail",
    [((37, 100), 64), ((41, 128), 64), ((5, 65), 1), ((2, 3, 96), 32)],
)  # a ragged tail on 3 programs; an exact one; a tail of one column, one program; 3-D
def test_two_blocks_match_float64(op, dname, prefetch, shape, tail, device, monkeypatch):
    launched = _head(monkeypatch, prefetch=prefetch)
    dtype = DTYPES[dname]
    check(op, make_inputs(op, shape, dtype, device), SLACK[dtype])
    assert _pieces(launched) == [(64, tail)]


@pytest.mark.parametrize("dname", ["bf16", "fp16"])
def test_two_blocks_with_fp32_parameters(dname, device, monkeypatch):
    """16-bit activations with fp32 weight and bias: the gradients in fp32, one program and 3."""
    _head(monkeypatch)
    dtype = DTYPES[dname]
    for shape in [(5, 100), (301, 100)]:
        a = make_inputs("layer_norm", shape, dtype, device, weight_dtype=torch.float32)
        check("layer_norm", a, SLACK[dtype])


@pytest.mark.parametrize("rows", [5, 97])  # one program; 3 groups of partial rows
@pytest.mark.parametrize("prefetch", [True, False])
def test_two_blocks_with_the_bias_apart(rows, prefetch, device, monkeypatch):
    """LayerNorm's bias gradient by the column sums: the two-block kernel without its bias
    accumulators."""
    launched = _head(monkeypatch, prefetch=prefetch, bias_apart=True)
    check("layer_norm", make_inputs("layer_norm", (rows, 100), torch.bfloat16, device), 5e-4)
    assert [m["HAS_B"] for k, m in launched if k is KBP.norm_bwd_pieces_kernel] == [False]
    assert [k for k, _ in launched].count(KBIAS.column_sums_kernel) == 1


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("x_rows, dy_rows", [("padded", "broadcast"), ("broadcast", "padded")])
def test_two_blocks_read_through_row_strides(op, x_rows, dy_rows, device, monkeypatch):
    """x and dy with padded rows (NaN between) or a row stride of 0, dh padded (add+RMSNorm)."""
    launched = _head(monkeypatch)
    check_backward_through_row_strides(op, x_rows, dy_rows, device)
    assert _pieces(launched) == [(64, 64)]


@pytest.mark.parametrize("op", OPS)
def test_two_blocks_without_weight(op, device, monkeypatch):
    launched = _head(monkeypatch)
    check_without_weight(op, torch.float32, 37, device)
    assert _pieces(launched) == [(64, 64)]


@pytest.mark.parametrize("n, block_m, block_n", [(64, 4, 64), (40, 4, 64), (20, 8, 32)])
def test_rows_within_the_head_take_one_block(n, block_m, block_n, device, monkeypatch):
    """A row no wider than the head is one block of the next power of two over it, as many rows
    a tile as the setting's tile holds."""
    launched = _head(monkeypatch)
    check("rms_norm", make_inputs("rms_norm", (9, n), torch.float32, device), 1e-6)
    assert _pieces(launched) == []
    blocks = [(m["BLOCK_M"], m["BLOCK_N"]) for k, m in launched if k is KB.norm_bwd_block_kernel]
    assert blocks == [(block_m, block_n)]


@pytest.mark.parametrize("op", OPS)
def test_rows_past_the_tail_take_the_split_kernels(op, device, monkeypatch):
    """A table whose last setting holds two blocks: a row wider than its head + tail takes the
    split kernels, not a wider tail block than the setting says."""
    launched = _head(monkeypatch, tail=16)
    check(op, make_inputs(op, (7, 100), torch.float32, device), 1e-6)
    assert _pieces(launched) == []
    assert KB.norm_bwd_row_sums_kernel in [k for k, _ in launched]
    assert L.use_wide_path(81, True, op, 4) and not L.use_wide_path(80, True, op, 4)


def _nan_rows_after(t, rows: int = 2):
    """t's values in the first rows of a buffer with `rows` more rows of NaN after them."""
    buf = torch.full(
        (t.shape[0] + rows, *t.shape[1:]), float("nan"), dtype=t.dtype, device=t.device
    )
    buf[: t.shape[0]] = t
    return buf[: t.shape[0]]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("prefetch", [True, False])
def test_rows_past_the_last_are_neither_read_nor_written(op, prefetch, device, monkeypatch):
    """5 rows on 3 programs, so each program's last turns (and the loads in flight for the next)
    fall past the last row: x, dy, dh, mean and rstd followed by NaN rows, dx by NaN guard rows.
    A read past the last row would put NaN in the weight gradients; a write, numbers in the
    guard."""
    launched = _head(monkeypatch, prefetch=prefetch)
    monkeypatch.setattr(L, "SINGLE_PROGRAM_ELEMENTS", 0)  # 3 programs of 2 rows, not 1 of 5
    guards = []

    def alloc(shape, dtype, dev):
        if isinstance(shape, tuple) and len(shape) == 2 and shape[1] == 100:  # dx
            guards.append(_nan_rows_after(torch.empty(shape, dtype=dtype, device=dev)))
            return guards[-1]
        return torch.full(shape, float("nan"), dtype=dtype, device=dev)

    monkeypatch.setattr(L, "alloc", alloc)
    m, n, is_rms = 5, 100, op != "layer_norm"
    x = _nan_rows_after(torch.randn(m, n, device=device, dtype=torch.float64) * 2 + 0.5)
    dy = _nan_rows_after(torch.randn(m, n, device=device, dtype=torch.float64))
    dh = _nan_rows_after(torch.randn(m, n, device=device)) if op == "add_rms_norm" else None
    w = 1 + 0.3 * torch.randn(n, device=device, dtype=torch.float64)
    b = None if is_rms else 0.2 * torch.randn(n, device=device, dtype=torch.float64)
    mean = None if is_rms else x.mean(-1)
    centred = x if is_rms else x - mean[:, None]
    rstd = torch.rsqrt((centred * centred).mean(-1) + 1e-5)
    x32, dy32 = (_nan_rows_after(t.float()) for t in (x, dy))
    stats = [None if t is None else _nan_rows_after(t.float()) for t in (mean, rstd)]
    b32 = None if b is None else b.float()
    got = L.norm_backward(dy32, dh, x32, w.float(), b32, stats[0], stats[1], is_rms)
    want = R.norm_backward(dy, None if dh is None else dh.double(), x, w, b, mean, rstd, is_rms)
    for g, r in zip(got, want):
        assert (g is None) == (r is None)
        if g is not None:
            assert rel_err(g, r) < 1e-5
    assert _pieces(launched) == [(64, 64)]
    assert L._backward_plan(m, n, L.op_name(is_rms, dh is not None), 4, x.device).groups == 3
    assert torch.isnan(guards[0].as_strided((2, n), (n, 1), m * n)).all()  # the guard rows


def test_single_program_gradients_are_rounded_once(device, monkeypatch):
    """One program writes dweight in bf16 itself: the same bits twice, and within eager's error
    of float64 (a fixed order of sums; the rounding of round_to)."""
    _head(monkeypatch)
    a = make_inputs("rms_norm", (4, 100), torch.bfloat16, device)
    assert L._backward_plan(4, 100, "rms_norm", 2, torch.device(device)).groups == 1
    check("rms_norm", a, SLACK[torch.bfloat16])
    x, w = a["x"].detach(), a["weight"].detach()
    dy = torch.randn_like(x)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
    first = L.norm_backward(dy, None, x, w, None, None, rstd, True)
    again = L.norm_backward(dy, None, x, w, None, None, rstd, True)
    assert all(torch.equal(f, g) for f, g in zip(first[:2], again[:2]))


def _shipped_two_blocks():
    """(op, element size, narrowest, widest row) of each shipped two-block setting."""
    for (op, size), settings in L.BWD_CONFIGS.items():
        reach = 0  # the widest row an earlier two-block setting of the op takes
        for setting in settings:
            if setting.head:
                yield op, size, max(setting.head, reach) + 1, setting.head + setting.tail
                reach = setting.head + setting.tail


@pytest.mark.parametrize("op, size, narrowest, widest", sorted(_shipped_two_blocks()))
def test_shipped_two_block_settings_at_their_edges(op, size, narrowest, widest, device):
    """Each shipped two-block setting at its narrowest row, its widest and a width 16 does not
    divide, more rows than programs: that setting taken, against float64."""
    dtype = torch.bfloat16 if size == 2 else torch.float32
    for n in (narrowest, widest - 13, widest):
        setting = L.bwd_config(n, op, size)[2]
        assert (setting.head, setting.head + setting.tail) == (8192, widest), n
        check(op, make_inputs(op, (4, n), dtype, device), SLACK[dtype])
