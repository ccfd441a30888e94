"""The cooperative forward (kernels_fwd_coop: a row's slices in several programs exchanging their
statistics through global memory) against float64, through the launcher and the public ops. On
the GPU each slice is its own program; under the interpreter one program takes the whole row (its
slices a reshape), and the wait is tested by launching the kernel with one slice a program."""

import pytest
import torch
import triton.language as tl
from norm_cases import COOP_CASES, DTYPES, OPS, SLACK, check_op, make_inputs

from fusewise.ops.norms import kernels_bwd_coop as KC
from fusewise.ops.norms import kernels_fwd_coop as KF
from fusewise.ops.norms import launch as norm_launch
from fusewise.ops.norms import reference as R

EPS = 1e-5


def _inputs(op, m, n, device, offset=0.5, x_rows=None, r_rows=None):
    """x (mean away from 0 by `offset`), residual, weight, bias, fp32; rows laid out as named
    (test_norm_coop._rows_of)."""
    x = torch.randn(m, n, device=device) * 2 + offset
    r = torch.randn(m, n, device=device) if op == "add_rms_norm" else None
    w = 1 + 0.3 * torch.randn(n, device=device)
    b = 0.2 * torch.randn(n, device=device) if op == "layer_norm" else None
    x = _rows_of(x, x_rows) if x_rows else x
    r = _rows_of(r, r_rows) if r_rows and r is not None else r
    return x, r, w, b


def _rows_of(t, layout):
    if layout == "padded":  # rows strided past their width, the padding NaN
        wide = torch.full((t.shape[0], t.shape[1] + 7), float("nan"), device=t.device)
        wide[:, 3 : t.shape[1] + 3] = t
        return wide[:, 3 : t.shape[1] + 3]
    return t[:1].expand(t.shape)  # every row one row (row stride 0)


def _forward(op, x, r, w, b):
    """(fusewise's y, h, mean, rstd; float64's)."""
    is_rms = op != "layer_norm"
    got = norm_launch.norm_forward(x, r, w, b, EPS, is_rms)
    f64 = [None if t is None else t.double() for t in (x, r, w, b)]
    want = R.norm_forward(*f64, EPS, is_rms)
    return got, want


def _coop_everywhere(monkeypatch, setting):
    table = {(op, size): (setting,) for op in OPS for size in (2, 4)}
    monkeypatch.setattr(norm_launch, "FWD_COOP", table)


def _rel(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm())


def _assert_close(got, want, tol=1e-6):
    for g, r in zip(got, want):
        assert (g is None) == (r is None)
        if g is not None:
            assert _rel(g, r) < tol


@pytest.mark.parametrize("m, n, slice_, rows, ahead, early, prefetch", COOP_CASES)
@pytest.mark.parametrize("op", OPS)
def test_cooperative_forward_against_float64(
    op, m, n, slice_, rows, ahead, early, prefetch, device, monkeypatch
):
    setting = norm_launch.Coop(1, 1 << 30, slice_, rows, 4, 2, ahead, early, prefetch)
    _coop_everywhere(monkeypatch, setting)
    _assert_close(*_forward(op, *_inputs(op, m, n, device)))


@pytest.mark.parametrize("x_rows, r_rows", [("padded", "broadcast"), ("broadcast", "padded")])
@pytest.mark.parametrize("op", OPS)
def test_cooperative_forward_reads_through_row_strides(op, x_rows, r_rows, device, monkeypatch):
    """x (and the residual) are read twice, publish and finish, each through its row stride."""
    _coop_everywhere(monkeypatch, norm_launch.Coop(1, 1 << 30, 64, 1, 4, 1, True, True, True))
    _assert_close(*_forward(op, *_inputs(op, 23, 150, device, x_rows=x_rows, r_rows=r_rows)))


@pytest.mark.parametrize("has_w, has_b", [(False, False), (True, False), (False, True)])
def test_cooperative_forward_without_weight_or_bias(has_w, has_b, device, monkeypatch):
    _coop_everywhere(monkeypatch, norm_launch.Coop(1, 1 << 30, 64, 2, 4, 1))
    x, r, w, b = _inputs("layer_norm", 19, 200, device)
    _assert_close(*_forward("layer_norm", x, r, w if has_w else None, b if has_b else None))


def _outlier_first(x):
    x[:, 0] = 1e4
    return x


@pytest.mark.parametrize(
    "rows_of", [lambda x: x + 1000.0, _outlier_first], ids=["mean 1000", "1e4 first"]
)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_cooperative_statistics_as_accurate_as_the_wide_kernel(op, rows_of, device, monkeypatch):
    """fp32 rows far from zero, or with an outlier where a shift by the row's first element would
    lose the rest (a review's finding): the merged slices' mean, rstd and y no worse than the
    wide kernel's merged chunks (the path these widths took before), against float64."""
    x, r, w, b = _inputs(op, 16, 1000, device)
    x = rows_of(x)
    monkeypatch.setattr(norm_launch, "FWD_WALK", {})
    monkeypatch.setattr(norm_launch, "MAX_BLOCK_N_FWD", 128)
    monkeypatch.setattr(norm_launch, "WIDE_CHUNK_FWD", 128)
    wide = _forward(op, x, r, w, b)
    _coop_everywhere(monkeypatch, norm_launch.Coop(1, 1 << 30, 128, 1, 4, 2))
    coop = _forward(op, x, r, w, b)
    for (got, want), (base, _) in zip(zip(*coop), zip(*wide)):
        if got is not None:
            assert _rel(got, want) <= 2 * _rel(base, want) + 1e-7


@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_cooperative_forward_through_the_ops(op, dname, device, monkeypatch):
    """The public ops, forward and backward both cooperative, held to eager PyTorch's own error
    in the same dtype, as every other path (norm_cases.check_op)."""
    setting = norm_launch.Coop(1, 1 << 30, 128, 2, 4, 2)
    _coop_everywhere(monkeypatch, setting)
    monkeypatch.setattr(norm_launch, "BWD_COOP", norm_launch.FWD_COOP)
    dtype = DTYPES[dname]
    check_op(op, make_inputs(op, (13, 700), dtype, device), SLACK[dtype])
    check_op(op, make_inputs(op, (3, 5, 300), dtype, device, strided=True), SLACK[dtype])


def test_cooperative_forward_takes_only_its_widths(device, monkeypatch):
    """A setting's widths, bounds included, and only them; the same result twice."""
    calls = []
    real = KF.norm_forward_coop

    def spy(*args):
        calls.append(args[0].shape[1])
        return real(*args)

    monkeypatch.setattr(KF, "norm_forward_coop", spy)
    setting = norm_launch.Coop(200, 300, 64, 1, 4, 1)
    monkeypatch.setattr(norm_launch, "FWD_COOP", {("layer_norm", 4): (setting,)})
    for n in (199, 200, 300, 301):
        x, r, w, b = _inputs("layer_norm", 7, n, device)
        got, want = _forward("layer_norm", x, r, w, b)
        again, _ = _forward("layer_norm", x, r, w, b)
        _assert_close(got, want)
        assert all(torch.equal(g, a) for g, a in zip(got, again) if g is not None)
    assert calls == [200, 200, 300, 300]  # each width twice


def test_a_slice_never_published_gives_nan_not_a_wrong_y(device, monkeypatch):
    """The wait is bounded: under the interpreter, launched with one slice a program, program 0
    waits for program 1, which runs only after it, so program 0 gives up (SPIN_LIMIT lowered)
    and writes NaN; program 1 then finds program 0's statistics and writes its y right."""
    if device.type == "cuda":
        pytest.skip("programs run concurrently on a GPU: the wait ends; SPIN_LIMIT is compiled in")
    monkeypatch.setattr(KC, "SPIN_LIMIT", tl.constexpr(3))
    m, n, slice_ = 4, 64, 32
    x, r, w, b = _inputs("layer_norm", m, n, device)
    sums = KC.unpublished_sums(2 * 2 * m, device)
    y, mean, rstd = torch.zeros(m, n), torch.zeros(m), torch.zeros(m)
    KF.norm_fwd_coop_kernel[(2,)](
        *(x, x, w, b, y, y, mean, rstd, sums, m, n, n, n, EPS, 1, m),
        IS_RMS=False, HAS_W=True, HAS_B=True, HAS_RES=False, ROWS=1, SLICE=slice_, K=1,
        SLICES=2, SLICES_BLOCK=2, AHEAD=True, EARLY=False, PREFETCH=True,
    )  # fmt: skip
    _, want = _forward("layer_norm", x, r, w, b)
    assert torch.isnan(y[:, :slice_]).all() and torch.isnan(mean).all() and torch.isnan(rstd).all()
    assert _rel(y[:, slice_:], want[0][:, slice_:]) < 1e-6


def test_rows_of_no_elements_take_the_other_kernels(device, monkeypatch):
    """[m, 0]: no slices to split into; the launcher never calls the cooperative kernel."""
    monkeypatch.setattr(KF, "norm_forward_coop", None)  # never called
    _coop_everywhere(monkeypatch, norm_launch.Coop(0, 1 << 30, 32, 1, 4, 2))
    for op in OPS:
        x, r, w, b = _inputs(op, 3, 0, device)
        got, want = _forward(op, x, r, w, b)
        assert got[0].shape == (3, 0) and torch.isnan(got[-1]).all() == torch.isnan(want[-1]).all()


def test_a_setting_too_wide_for_this_gpu_gives_way(device, monkeypatch):
    """Where a row's slices outnumber the programs resident at once, the other forward kernels
    take the rows, with the right result."""
    monkeypatch.setattr(norm_launch, "_programs_per_wave", lambda dev: 1)
    monkeypatch.setattr(KC, "interpreted_on", lambda dev: False)  # as a GPU lays it out
    monkeypatch.setattr(KF, "norm_forward_coop", None)  # never called
    _coop_everywhere(monkeypatch, norm_launch.Coop(1, 1 << 30, 32, 1, 4, 2))
    _assert_close(*_forward("layer_norm", *_inputs("layer_norm", 9, 100, device)))
