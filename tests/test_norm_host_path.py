"""The norms' eager host path (issue #14: host time per call near torch's): the quick argument
check must only ever send a call to the full checks, the plans looked up per shape must follow
the settings tests and sweeps replace, and the backward of a small call runs as one program that
writes the weight gradients itself (one launch), as correct as the multi-program schedule."""

import math

import pytest
import torch
from norm_cases import DTYPES, OPS, SLACK, fused, make_inputs
from test_norm_numerics import check

import fusewise
from fusewise.ops import _dispatch
from fusewise.ops.norms import launch as norm_launch
from fusewise.ops.norms import validate


class _Sub(torch.Tensor):
    pass


def _cases():
    """(x, weight, bias): usual calls and calls the full checks refuse or must look at."""
    x = torch.randn(3, 8)
    w = torch.randn(8)
    yield x, w, None
    yield x, torch.nn.Parameter(w), torch.randn(8)
    yield x.to(torch.bfloat16), w, None
    yield x, None, None
    yield torch.randn(2, 3, 8).transpose(0, 1), w, w
    yield torch.tensor(1.0), None, None  # 0-d
    yield torch.ones(3, 8, dtype=torch.int32), None, None
    yield x.to_sparse(), None, None
    yield x, torch.randn(7), None
    yield x, torch.randn(1, 8), None
    yield x, torch.ones(8, dtype=torch.int64), None
    yield x, torch.randn(8, device="meta"), None
    yield x, [8], None
    yield x.as_subclass(_Sub), w, None
    yield x, w.as_subclass(_Sub), None
    yield torch.randn(3, 8, dtype=torch.complex64), None, None


def _full_checks_pass(x, weight, bias) -> bool:
    try:
        validate.check_input("x", x)
        validate.check_param("weight", weight, x)
        validate.check_param("bias", bias, x)
    except (TypeError, ValueError):
        return False
    return True


@pytest.mark.parametrize("case", range(len(list(_cases()))))
def test_quick_check_accepts_only_what_the_full_checks_accept(case):
    x, weight, bias = list(_cases())[case]
    quick = validate.plainly_valid(x, weight, bias)
    if quick:
        assert _full_checks_pass(x, weight, bias)
    # the usual calls are recognised (or the quick check would save nothing)
    if case < 5:
        assert quick


def test_refused_calls_still_get_the_full_messages():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        fusewise.ops.rms_norm(x, torch.randn(7))
    with pytest.raises(ValueError, match="at least one dimension"):
        fusewise.ops.layer_norm(torch.tensor(1.0))
    with pytest.raises(TypeError, match="floating-point"):
        fusewise.ops.layer_norm(torch.ones(3, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="residual must have x's shape"):
        fusewise.ops.add_rms_norm(x, torch.randn(3, 7), None)
    with pytest.raises(TypeError, match="residual must have x's dtype"):
        fusewise.ops.add_rms_norm(x, x.double(), None)
    with pytest.raises(TypeError, match="residual must be a torch.Tensor"):
        fusewise.ops.add_rms_norm(x, 1.0, None)


@pytest.mark.parametrize(
    "eps,ok",
    [(1e-5, True), (0.0, True), (float("nan"), False), (math.inf, False), (-1e-6, False)],
)
def test_eps_quick_path_refuses_what_the_full_check_refuses(eps, ok):
    if ok:
        assert validate.check_eps(eps) == eps
    else:
        with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
            validate.check_eps(eps)


def test_a_tensor_on_an_unsupported_device_names_it():
    reason = _dispatch._why_not_triton([torch.empty(2, device="meta")])
    assert reason is not None and "'meta'" in reason


def _count_launches(monkeypatch) -> list:
    names = []
    real = norm_launch.launch

    def counting(kernel, grid, *args, **meta):
        names.append((kernel.__name__ if hasattr(kernel, "__name__") else str(kernel), grid))
        return real(kernel, grid, *args, **meta)

    monkeypatch.setattr(norm_launch, "launch", counting)
    return names


@pytest.mark.parametrize("op", OPS)
def test_small_backward_is_one_launch_of_one_program(op, device, monkeypatch):
    """8 x 256 in bf16: every tile in one program, which writes dweight (and dbias) itself."""
    a = make_inputs(op, (8, 256), torch.bfloat16, device)
    plan = norm_launch._backward_plan(8, 256, op, 2, a["x"].device)
    assert plan is not None and plan.groups == 1
    launches = _count_launches(monkeypatch)
    check(op, a, SLACK[torch.bfloat16])
    kernels = [name for name, _ in launches]
    assert kernels.count("norm_bwd_block_kernel") == 1 and "sum_partials_kernel" not in kernels
    assert all(grid == (1,) for name, grid in launches if name == "norm_bwd_block_kernel")


@pytest.mark.parametrize("single", [0, 1 << 30])
@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("op", OPS)
def test_one_program_and_many_agree_with_float64(op, dname, single, device, monkeypatch):
    """The same shapes on either schedule (SINGLE_PROGRAM_ELEMENTS 0: always partials and their
    sum; 2**30: always one program), several tiles and a ragged last one, held to eager
    PyTorch's error against float64."""
    monkeypatch.setattr(norm_launch, "SINGLE_PROGRAM_ELEMENTS", single)
    dtype = DTYPES[dname]
    for shape in [(37, 300), (5, 33)]:
        m, n = shape
        plan = norm_launch._backward_plan(m, n, op, dtype.itemsize, torch.device(device))
        n_tiles = -(-m // plan.block_m)
        assert plan.groups == (1 if single else min(n_tiles, plan.groups))
        assert single or n_tiles == 1 or plan.groups > 1
        check(op, make_inputs(op, shape, dtype, device), SLACK[dtype])


def test_backward_plan_follows_replaced_settings(monkeypatch):
    """A plan is reused while BWD_CONFIGS and MAX_BLOCK_N are the ones it was made from."""
    dev = torch.device("cpu")
    first = norm_launch._backward_plan(64, 300, "rms_norm", 2, dev)
    assert norm_launch._backward_plan(64, 300, "rms_norm", 2, dev) is first
    other = norm_launch.Bwd(1 << 20, 512, 4, 1, prefetch=False, lean=True)
    monkeypatch.setattr(
        norm_launch, "BWD_CONFIGS", dict.fromkeys(norm_launch.BWD_CONFIGS, (other,))
    )
    assert norm_launch._backward_plan(64, 300, "rms_norm", 2, dev).setting == other
    monkeypatch.setattr(norm_launch, "MAX_BLOCK_N", 256)
    assert norm_launch._backward_plan(64, 300, "rms_norm", 2, dev) is None  # split kernels


def test_forward_plan_follows_replaced_settings(monkeypatch):
    flags = (True, True, False, False)
    block = norm_launch._forward_plan(4, 300, 300, 300, flags, 2)
    assert block.kernel is norm_launch.K.norm_fwd_block_kernel
    assert norm_launch._forward_plan(4, 300, 300, 300, flags, 2) is block
    monkeypatch.setattr(norm_launch, "MAX_BLOCK_N_FWD", 256)
    wide = norm_launch._forward_plan(4, 300, 300, 300, flags, 2)
    assert wide.kernel is norm_launch.K.norm_fwd_wide_kernel and wide.grid == (4,)
    monkeypatch.setattr(norm_launch, "WIDE_CHUNK_FWD", 128)
    assert norm_launch._forward_plan(4, 300, 300, 300, flags, 2).meta["BLOCK_N"] == 128


def test_plans_are_bounded(monkeypatch):
    monkeypatch.setattr(norm_launch, "_MAX_PLANS", 4)
    monkeypatch.setattr(norm_launch, "_fwd_plans", {})
    for m in range(1, 20):
        norm_launch._forward_plan(m, 64, 64, 64, (True, False, False, False), 2)
    assert len(norm_launch._fwd_plans) <= 4


def test_backward_plan_sees_the_table_edited_in_place(monkeypatch):
    dev = torch.device("cpu")
    assert norm_launch._backward_plan(64, 300, "layer_norm", 2, dev) is not None
    narrow = (norm_launch.Bwd(256, 8192, 16, 1),)  # 300 is past its widest: split kernels
    monkeypatch.setitem(norm_launch.BWD_CONFIGS, ("layer_norm", 2), narrow)
    assert norm_launch.use_wide_path(300, True, "layer_norm", 2)
    assert norm_launch._backward_plan(64, 300, "layer_norm", 2, dev) is None


def test_a_nested_input_gets_the_full_checks_messages():
    x = torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(3, 8)])
    assert not validate.plainly_valid(x, None)
    with pytest.raises(TypeError, match="weight must be a floating-point tensor"):
        fusewise.ops.layer_norm(x, torch.ones(8, dtype=torch.int64))


_EVERY_OP_UNMASKED_AT_256 = {(op, size): (256,) for op in OPS for size in (2, 4)}


@pytest.mark.parametrize(
    "shape, strided, unmasked",
    [
        ((16, 256), False, True),  # 8-row tiles, 2 of them: no masks
        ((16, 256), True, True),  # rows strided by 261: still whole tiles
        ((2, 3, 256), False, False),  # 6 rows: a ragged last tile
        ((16, 200), False, False),  # narrower than the 256 block
        ((16, 512), False, False),  # whole tiles, but not a width of the table
    ],
)
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_unmasked_forward_only_on_whole_tiles(
    op, dname, shape, strided, unmasked, device, monkeypatch
):
    """The forward drops its masks exactly at the table's widths when every tile lies inside
    the tensor, and gives the bits the masked kernel gives, both held to eager PyTorch's error
    against float64."""
    monkeypatch.setattr(norm_launch, "FWD_UNMASKED", _EVERY_OP_UNMASKED_AT_256)
    dtype = DTYPES[dname]
    a = make_inputs(op, shape, dtype, device, strided=strided)
    x = a["x"].reshape(-1, shape[-1])
    flags = (op != "layer_norm", True, op == "layer_norm", op == "add_rms_norm")
    plan_args = (x.shape[0], x.shape[1], x.stride(0), x.shape[1], flags, dtype.itemsize)
    assert norm_launch._forward_plan(*plan_args).meta["EVEN"] is unmasked
    check(op, a, SLACK[dtype])
    with torch.no_grad():
        unmasked_out = fused(op, a)
        monkeypatch.setattr(norm_launch, "FWD_UNMASKED", {})
        assert not norm_launch._forward_plan(*plan_args).meta["EVEN"]
        masked_out = fused(op, a)
    for got, want in zip(unmasked_out, masked_out):
        assert torch.equal(got, want)


def test_forward_plan_sees_the_unmasked_table_edited_in_place(monkeypatch):
    flags = (False, True, True, False)  # layer_norm
    table = dict(norm_launch.FWD_UNMASKED)
    monkeypatch.setattr(norm_launch, "FWD_UNMASKED", table)
    assert not norm_launch._forward_plan(16, 256, 256, 256, flags, 4).meta["EVEN"]
    table["layer_norm", 4] = (256,)
    assert norm_launch._forward_plan(16, 256, 256, 256, flags, 4).meta["EVEN"]
    assert not norm_launch._forward_plan(16, 256, 256, 256, flags, 2).meta["EVEN"]  # bf16's


def test_shipped_unmasked_widths_are_whole_blocks():
    """Only a power-of-two width can fill the block: any other entry would never apply."""
    for widths in norm_launch.FWD_UNMASKED.values():
        for n in widths:
            assert norm_launch.block_config(n)[1] == n and n <= norm_launch.MAX_BLOCK_N_FWD


def test_walk_plan_by_width(monkeypatch):
    """FWD_WALK's settings apply at their widths only: chunks capped at the row's block, the
    chunk count, masks only where the last chunk is ragged, the loop unrolled whole on request."""
    Walk, K = norm_launch.Walk, norm_launch.K
    table = {("layer_norm", 2): (Walk(100, 1000, 128, 4), Walk(1001, 4096, 1024, 8, True))}
    monkeypatch.setattr(norm_launch, "FWD_WALK", table)
    ln = (False, True, True, False)

    def plan(n, size=2, flags=ln):
        return norm_launch._forward_plan(6, n, n, n, flags, size)

    assert plan(99).kernel is K.norm_fwd_block_kernel
    assert plan(4097).kernel is K.norm_fwd_block_kernel
    assert plan(300, 4).kernel is K.norm_fwd_block_kernel  # fp32: not in the table
    assert plan(300, 2, (True, True, False, False)).kernel is K.norm_fwd_block_kernel  # RMS
    expected = {  # width: (CHUNK, CHUNKS, EVEN, UNROLL, warps)
        100: (128, 1, False, 1, 4),  # chunk capped at the row's block
        300: (128, 3, False, 1, 4),
        512: (128, 4, True, 1, 4),
        1001: (1024, 1, False, 1, 8),
        3000: (1024, 3, False, 2, 8),  # unrolled over the whole chunks; the ragged last after
        4096: (1024, 4, True, 4, 8),
    }
    for n, want in expected.items():
        p = plan(n)
        assert p.kernel is norm_launch.KW.norm_fwd_walk_kernel and p.grid == (6,)
        align = p.meta["ALIGN"]  # 100 = 4 x 25, 300 = 4 x 75, 3000 = 8 x 375: passed divided
        assert align == {100: 4, 300: 4, 3000: 8}.get(n, 1) and p.ints == (n // align,) * 3
        got = tuple(p.meta[k] for k in ("CHUNK", "CHUNKS", "EVEN", "UNROLL", "num_warps"))
        assert got == want, n


def test_forward_plan_sees_the_walk_table_edited_in_place(monkeypatch):
    table = {}
    monkeypatch.setattr(norm_launch, "FWD_WALK", table)
    flags = (True, True, False, False)  # rms_norm
    assert norm_launch._forward_plan(4, 512, 512, 512, flags, 2).kernel is not (
        norm_launch.KW.norm_fwd_walk_kernel
    )
    table["rms_norm", 2] = (norm_launch.Walk(512, 512, 256, 4),)
    assert norm_launch._forward_plan(4, 512, 512, 512, flags, 2).kernel is (
        norm_launch.KW.norm_fwd_walk_kernel
    )


def test_shipped_walk_settings_are_consistent():
    """Each op's walked widths do not overlap (the first match would hide the rest), chunks are
    powers of two, an unrolled walk has at most 32 chunks at its widest (compile time), a held
    part is a power of two narrower than every row it is for and not under welford, and every
    key is an op and element size the launchers ask for."""
    for key, settings in norm_launch.FWD_WALK.items():
        assert key in norm_launch.BWD_CONFIGS
        spans = sorted((s.narrowest, s.widest) for s in settings)
        for s in settings:
            assert 1 <= s.narrowest <= s.widest and s.chunk & (s.chunk - 1) == 0
            assert not s.unroll or -(-(s.widest - s.hold) // s.chunk) <= 32
            if s.hold:
                assert s.hold < s.narrowest and s.hold & (s.hold - 1) == 0 and not s.welford
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end < start, key
