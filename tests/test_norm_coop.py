"""The cooperative backward (kernels_bwd_coop: a row's slices in several programs exchanging their
row sums through global memory) against the float64 analytic backward, through the launcher and
through the public ops. On the GPU each slice is its own program and the programs wait on each
other; under the interpreter one program takes the whole row (its slices a reshape), and the
wait is tested by launching the kernel itself with one slice a program."""

import pytest
import torch
import triton.language as tl
from norm_cases import COOP_CASES, DTYPES, OPS, SLACK, check_op, make_inputs

from fusewise.ops.norms import kernels_bwd_coop as KC
from fusewise.ops.norms import launch as norm_launch
from fusewise.ops.norms import reference as R


def _inputs(op, m, n, device, dtype=torch.float32, x_rows=None, dy_rows=None):
    """x (mean away from 0), dy, dh, w, b and float64 statistics, as the forward would save."""
    x = torch.randn(m, n, device=device) * 2 + 0.5
    dy = torch.randn(m, n, device=device)
    x, dy = (_rows_of(t, rows) if rows else t for t, rows in ((x, x_rows), (dy, dy_rows)))
    dh = torch.randn(m, n, device=device).to(dtype) if op == "add_rms_norm" else None
    w = (1 + 0.3 * torch.randn(n, device=device)).to(dtype)
    b = (0.2 * torch.randn(n, device=device)).to(dtype) if op == "layer_norm" else None
    x, dy = x.to(dtype), dy.to(dtype)
    is_rms, xd = op != "layer_norm", x.double()
    mean = None if is_rms else xd.mean(-1)
    centred = xd if is_rms else xd - mean[:, None]
    rstd = torch.rsqrt((centred * centred).mean(-1) + 1e-5)
    return x, dy, dh, w, b, mean, rstd


def _rows_of(t, layout):
    """t's values with rows strided past their width (padding NaN: a read of it shows), or all
    rows one row broadcast (row stride 0)."""
    if layout == "padded":
        wide = torch.full((t.shape[0], t.shape[1] + 7), float("nan"), device=t.device)
        wide[:, 3 : t.shape[1] + 3] = t
        return wide[:, 3 : t.shape[1] + 3]
    return t[:1].expand(t.shape)


def _backward(x, dy, dh, w, b, mean, rstd, is_rms):
    got = norm_launch.norm_backward(
        dy, dh, x, w, b, None if is_rms else mean.float(), rstd.float(), is_rms
    )
    f64 = [None if t is None else t.double() for t in (dy, dh, w, b)]
    want = R.norm_backward(f64[0], f64[1], x.double(), f64[2], f64[3], mean, rstd, is_rms)
    return got, want


def _coop_everywhere(monkeypatch, setting):
    table = {(op, size): (setting,) for op in OPS for size in (2, 4)}
    monkeypatch.setattr(norm_launch, "BWD_COOP", table)


def _rel(got, want):
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("m, n, slice_, rows, ahead, early, prefetch", COOP_CASES)
@pytest.mark.parametrize("op", OPS)
def test_cooperative_backward_against_float64(
    op, m, n, slice_, rows, ahead, early, prefetch, device, monkeypatch
):
    setting = norm_launch.Coop(1, 1 << 30, slice_, rows, 4, 2, ahead, early, prefetch)
    _coop_everywhere(monkeypatch, setting)
    x, dy, dh, w, b, mean, rstd = _inputs(op, m, n, device)
    got, want = _backward(x, dy, dh, w, b, mean, rstd, op != "layer_norm")
    for g, r in zip(got, want):
        assert (g is None) == (r is None)
        if g is not None:
            assert _rel(g, r) < 1e-6


@pytest.mark.parametrize("x_rows, dy_rows", [("padded", "broadcast"), ("broadcast", "padded")])
@pytest.mark.parametrize("op", OPS)
def test_cooperative_backward_reads_through_row_strides(op, x_rows, dy_rows, device, monkeypatch):
    """x and dy are read twice (publish, then finish), each time through its own row stride."""
    _coop_everywhere(monkeypatch, norm_launch.Coop(1, 1 << 30, 64, 1, 4, 1, True, True, True))
    x, dy, dh, w, b, mean, rstd = _inputs(op, 23, 150, device, x_rows=x_rows, dy_rows=dy_rows)
    got, want = _backward(x, dy, dh, w, b, mean, rstd, op != "layer_norm")
    for g, r in zip(got, want):
        if g is not None:
            assert _rel(g, r) < 1e-6


@pytest.mark.parametrize("has_w, has_b", [(False, False), (True, False), (False, True)])
def test_cooperative_backward_without_weight_or_bias(has_w, has_b, device, monkeypatch):
    _coop_everywhere(monkeypatch, norm_launch.Coop(1, 1 << 30, 64, 2, 4, 1))
    x, dy, dh, w, b, mean, rstd = _inputs("layer_norm", 19, 200, device)
    w, b = (w if has_w else None), (b if has_b else None)
    got, want = _backward(x, dy, dh, w, b, mean, rstd, False)
    for g, r in zip(got, want):
        assert (g is None) == (r is None)
        if g is not None:
            assert _rel(g, r) < 1e-6


@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_cooperative_backward_through_the_ops(op, dname, device, monkeypatch):
    """The public ops with the cooperative backward at their width, held to eager PyTorch's own
    error in the same dtype, as every other path (norm_cases.check_op)."""
    _coop_everywhere(monkeypatch, norm_launch.Coop(1, 1 << 30, 128, 2, 4, 2))
    dtype = DTYPES[dname]
    check_op(op, make_inputs(op, (13, 700), dtype, device), SLACK[dtype])


def test_cooperative_backward_takes_only_its_widths(device, monkeypatch):
    """A setting's widths, bounds included, and only them; the weight gradients deterministic."""
    calls = []
    real = KC.norm_backward_coop

    def spy(*args):
        calls.append(args[2].shape[1])
        return real(*args)

    monkeypatch.setattr(KC, "norm_backward_coop", spy)
    setting = norm_launch.Coop(200, 300, 64, 1, 4, 1)
    monkeypatch.setattr(norm_launch, "BWD_COOP", {("layer_norm", 4): (setting,)})
    for n in (199, 200, 300, 301):
        x, dy, dh, w, b, mean, rstd = _inputs("layer_norm", 7, n, device)
        got, want = _backward(x, dy, dh, w, b, mean, rstd, False)
        again, _ = _backward(x, dy, dh, w, b, mean, rstd, False)
        for g, a, r in zip(got, again, want):
            assert _rel(g, r) < 1e-6 and torch.equal(g, a)
    assert calls == [200, 200, 300, 300]  # each width twice


def test_a_slice_never_published_gives_nan_not_a_wrong_dx(device, monkeypatch):
    """The wait is bounded: a program whose lane-mates never publish writes NaN for its dx.
    Under the interpreter the kernel is launched with one slice a program: program 0 waits for
    program 1, which runs only after it, so program 0 gives up (SPIN_LIMIT lowered) and program
    1 then finds program 0's sums and writes its dx right."""
    if device.type == "cuda":
        pytest.skip("programs run concurrently on a GPU: the wait ends; SPIN_LIMIT is compiled in")
    monkeypatch.setattr(KC, "SPIN_LIMIT", tl.constexpr(3))
    m, n, slice_ = 4, 64, 32
    x, dy, dh, w, b, mean, rstd = _inputs("layer_norm", m, n, device)
    sums = torch.full((2 * 2 * m,), KC.SENTINEL_BITS, dtype=torch.int32).view(torch.float32)
    dx = torch.full((m, n), 0.0)
    parts = torch.zeros(2, 1, n)
    meanf, rstdf = mean.float(), rstd.float()
    KC.norm_bwd_coop_kernel[(2,)](
        *(x, w, dy, dy, dx, meanf, rstdf, sums, parts[0], parts[1], m, n, n, n, n, 1, m),
        IS_RMS=False, HAS_W=True, HAS_B=True, HAS_DH=False, ROWS=1, SLICE=slice_, K=1,
        SLICES=2, SLICES_BLOCK=2, AHEAD=True, EARLY=False, PREFETCH=True,
    )  # fmt: skip
    _, want = _backward(x, dy, dh, w, b, mean, rstd, False)
    assert torch.isnan(dx[:, :slice_]).all()
    assert _rel(dx[:, slice_:], want[0][:, slice_:]) < 1e-6


def test_a_lane_wider_than_a_wave_is_refused():
    """Slices that cannot all be resident at once would wait on each other forever."""
    setting = norm_launch.Coop(1, 1 << 30, 32, 1, 4, 1)
    assert KC.schedule(10, 3 * 32, setting, 3, interpreted=False).parts == 3
    assert not KC.fits(4 * 32, setting, 3, interpreted=False)
    with pytest.raises(ValueError, match="resident"):
        KC.schedule(10, 4 * 32, setting, 3, interpreted=False)
    assert KC.schedule(10, 4 * 32, setting, 3, interpreted=True).parts == 1


@pytest.mark.parametrize(
    "setting",
    [
        norm_launch.Coop(1, 1 << 30, 48, 1, 4, 1),  # slice not a power of two
        norm_launch.Coop(1, 1 << 30, 32, 3, 4, 1),  # rows not a power of two
        norm_launch.Coop(1, 1 << 30, 32, 1, 16, 8),  # 128 warps a multiprocessor
    ],
)
def test_a_setting_the_kernel_cannot_take_is_refused(setting):
    with pytest.raises(ValueError, match="powers of two and per_sm"):
        KC.schedule(10, 96, setting, 132, interpreted=False)


def test_a_setting_too_wide_for_this_gpu_gives_way(device, monkeypatch):
    """Where a row's slices outnumber the programs resident at once (a setting tuned on a
    bigger GPU), the fused or split kernels take the rows, with the right result."""
    monkeypatch.setattr(norm_launch, "_programs_per_wave", lambda dev: 1)
    monkeypatch.setattr(KC, "interpreted_on", lambda dev: False)  # as a GPU lays it out
    monkeypatch.setattr(KC, "norm_backward_coop", None)  # never called
    _coop_everywhere(monkeypatch, norm_launch.Coop(1, 1 << 30, 32, 1, 4, 2))
    x, dy, dh, w, b, mean, rstd = _inputs("layer_norm", 9, 100, device)  # 4 slices > 2
    got, want = _backward(x, dy, dh, w, b, mean, rstd, False)
    for g, r in zip(got, want):
        assert _rel(g, r) < 1e-6


def test_schedule_of_real_shapes():
    """LayerNorm at 16,384 on an H200 (132 multiprocessors), 4,096-column slices, 2 a
    multiprocessor: 66 lanes of 4 programs, 8,192 rows in 125 groups a lane at most."""
    setting = norm_launch.Coop(12289, 16384, 4096, 1, 16, 2)
    plan = KC.schedule(8192, 16384, setting, 132, interpreted=False)
    assert plan == KC.Schedule(4096, 4, 1, 4, 66, 125)
    plan = KC.schedule(5, 12289, setting, 132, interpreted=False)  # 4 slices, 5 lanes of 1 group
    assert plan == KC.Schedule(4096, 4, 1, 4, 5, 1)
