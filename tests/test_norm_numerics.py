"""Fused norms against a float64 oracle, forward and backward, held to eager PyTorch's own error
in the same dtype (plus a small slack). Runs the real Triton kernels: on the GPU, or on the CPU
under the Triton interpreter."""

import pytest
import torch
from norm_cases import (
    DTYPES,
    OPS,
    SLACK,
    backward,
    check_backward_through_row_strides,
    check_forward,
    check_without_weight,
    fused,
    make_inputs,
    rel_err,
)
from norm_cases import check_op as check

from fusewise.ops.norms import launch as norm_launch
from fusewise.ops.norms.settings import _RMS_16384

# the forward plan's flags (IS_RMS, HAS_W, HAS_B, HAS_RES) of each op with its weight and bias
FLAGS = {"layer_norm": (0, 1, 1, 0), "rms_norm": (1, 1, 0, 0), "add_rms_norm": (1, 1, 0, 1)}

SHAPES = {
    "M1-N7": (1, 7),
    "M3-N1": (3, 1),
    "M199-N760": (199, 760),
    "M37-N1823": (37, 1823),
    "B2-T5-N256": (2, 5, 256),  # 3-D input
    "M64-N33": (64, 33),  # several rows per program on the block path
}


@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("shape_id", list(SHAPES))
@pytest.mark.parametrize("op", OPS)
def test_block_path(op, shape_id, dname, device):
    dtype = DTYPES[dname]
    check(op, make_inputs(op, SHAPES[shape_id], dtype, device), SLACK[dtype])


@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_wide_path(op, dname, device, monkeypatch):
    """Rows wider than one block: the chunked forward and the split backward, reached at small
    sizes by lowering the limits (the same code runs for rows past 32768 elements forward, and
    past 16384 backward, and LayerNorm's in fp32 at 8,193-12,287): row sums in steps of two
    chunks (the last step ragged), ragged column blocks."""
    for name, value in [
        ("MAX_BLOCK_N", 256),
        ("MAX_BLOCK_N_FWD", 256),
        ("WIDE_CHUNK_FWD", 128),
        ("SUMS_CHUNK", 128),
        ("SUMS_UNROLL", 2),
    ]:
        monkeypatch.setattr(norm_launch, name, value)
    dtype = DTYPES[dname]
    check(op, make_inputs(op, (9, 1823), dtype, device), SLACK[dtype])


@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_split_backward_row_tiles_and_groups(op, dname, device, monkeypatch):
    """The split backward with several rows per row-sums program (one step), several column
    blocks and several row groups, the last of each ragged."""
    for name, value in [("MAX_BLOCK_N", 128), ("SUMS_CHUNK", 512), ("TILES_N", 64)]:
        monkeypatch.setattr(norm_launch, name, value)
    assert norm_launch.use_wide_path(300, backward=True)
    assert not norm_launch.use_wide_path(300)
    dtype = DTYPES[dname]
    check(op, make_inputs(op, (45, 300), dtype, device), SLACK[dtype])


@pytest.mark.parametrize("n", [8192, 8195, 16387])
def test_layer_norm_backward_of_a_huge_constant_row_is_finite(n, device):
    """A constant row (variance 0, rstd = eps**-0.5) of 2**110 with BERT's eps: x̂ of a column
    past N would be -inf. Every backward path (one block at 8192, two blocks at 8195, the split
    kernels at 16,387: ragged last chunks) must keep it out of the row sums, as the float64
    reference does."""
    two_blocks = bool(norm_launch.bwd_config(n, "layer_norm", 4)[2].head)
    split = norm_launch.use_wide_path(n, True, "layer_norm", 4)
    assert (two_blocks, split) == {8192: (False, False), 8195: (True, False), 16387: (False, True)}[
        n
    ]
    torch.manual_seed(0)
    x = torch.randn(2, n, device=device)
    x[0] = 2.0**110
    x.requires_grad_()
    w = torch.ones(n, device=device, requires_grad=True)
    b = torch.zeros(n, device=device, requires_grad=True)
    dy = torch.randn(2, n, device=device)
    import fusewise

    got = torch.autograd.grad(fusewise.ops.layer_norm(x, w, b, eps=1e-12), (x, w, b), dy)
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    y64 = torch.nn.functional.layer_norm(leaves[0], (n,), leaves[1], leaves[2], 1e-12)
    ref = torch.autograd.grad(y64, leaves, dy.double())
    for g, r in zip(got, ref):
        assert torch.isfinite(g).all() and torch.isfinite(r).all()
        assert rel_err(g, r) < 1e-5


def test_forward_settings_by_width():
    """2048-element tiles of whole rows; 32 elements a thread, at least 4 and at most 16 warps."""
    assert norm_launch.block_config(256) == (8, 256, 4)
    assert norm_launch.block_config(4096) == (1, 4096, 4)
    assert norm_launch.block_config(8192) == (1, 8192, 8)
    assert norm_launch.block_config(16384) == (1, 16384, 16)
    assert norm_launch.block_config(32768) == (1, 32768, 16)


def test_backward_paths_by_width():
    """The fused backward holds rows up to its widest configured block (16384 elements; LayerNorm
    in fp32 at 12,288-16,384 in slices of 8192); wider rows take the split kernels. Each width's
    fused setting is the one for the smallest block that holds it."""
    L, Bwd = norm_launch, norm_launch.Bwd
    assert not L.use_wide_path(8192, True, "layer_norm", 4)
    # LayerNorm fp32 at 12,288-16,384: two slices of 8,192 (rows' columns shared out); the
    # narrower rows of that block on the split kernels
    sliced = Bwd(16384, 4096, 16, 1, slice=8192, fused_from=12288)
    assert L.bwd_config(12289, "layer_norm", 4) == (1, 8192, sliced)
    # ... and at 8,193-12,288 a head block of 8,192 and a tail of up to 4,096 (Bwd.head)
    two_blocks = Bwd(16384, 16384, 16, 1, prefetch=False, head=8192, tail=4096)
    for n in (8193, 12287, 12288):
        assert L.bwd_config(n, "layer_norm", 4) == (1, 8192, two_blocks), n
        assert not L.use_wide_path(n, True, "layer_norm", 4), n
    assert not L.use_wide_path(16384, True, "layer_norm", 4)
    assert L.use_wide_path(16385, True, "layer_norm", 4)
    assert L.bwd_config(4096, "layer_norm") == (2, 4096, Bwd(8192, 8192, 8, 1))
    assert L.bwd_config(600, "layer_norm") == (4, 1024, Bwd(2048, 4096, 4, 2, True, True))
    assert L.bwd_config(100, "rms_norm") == (64, 128, Bwd(1024, 8192, 16, 1))
    assert L.bwd_config(2048, "rms_norm") == (2, 2048, Bwd(2048, 4096, 8, 2))
    assert L.bwd_config(1025, "rms_norm")[:2] == (2, 2048)
    assert L.bwd_config(4096, "rms_norm") == (2, 4096, Bwd(8192, 8192, 16, 1))
    assert L.bwd_config(256, "layer_norm", 4) == (8, 256, Bwd(2048, 2048, 16, 2))
    assert L.bwd_config(8192, "rms_norm", 4) == (1, 8192, Bwd(8192, 8192, 16, 1))
    # add+RMSNorm: lean at 513-1024 in bf16 and at every width in fp32
    assert L.bwd_config(512, "add_rms_norm") == (16, 512, Bwd(512, 8192, 16, 1))
    assert L.bwd_config(1000, "add_rms_norm") == (8, 1024, Bwd(1024, 8192, 16, 1, True, True))
    assert L.bwd_config(4096, "add_rms_norm") == (2, 4096, Bwd(8192, 8192, 16, 1))
    assert all(L.bwd_config(n, "add_rms_norm", 4)[2].lean for n in (256, 1024, 2048, 8192))
    # rows of 16384: one a tile, 32 warps, loads at each tile's turn; LayerNorm in bf16/fp16
    # reads x and dy again for dx
    for op, size in [("rms_norm", 2), ("add_rms_norm", 2), ("rms_norm", 4), ("add_rms_norm", 4)]:
        assert not L.use_wide_path(16384, True, op, size)
        assert L.use_wide_path(16385, True, op, size)
        assert L.bwd_config(16384, op, size) == (1, 16384, Bwd(16384, 16384, 32, 1, False, True))
    # ... with its bias gradient summed apart, past two blocks' reach
    setting = Bwd(16384, 16384, 32, 1, prefetch=False, lean=True, reload=True, bias_apart=True)
    for n in (12289, 16384):
        assert L.bwd_config(n, "layer_norm") == (1, 16384, setting), n
        assert not L.use_wide_path(n, True, "layer_norm", 2), n
    # two blocks: a head of 8,192 and a tail, the setting by the tail's width
    for op, size, n, warps, tail in [
        ("layer_norm", 2, 8193, 8, 1024),
        ("layer_norm", 2, 9216, 8, 1024),
        ("layer_norm", 2, 9217, 16, 4096),
        ("layer_norm", 2, 12288, 16, 4096),
        ("rms_norm", 2, 9216, 8, 1024),
        ("rms_norm", 4, 10240, 16, 2048),
        ("add_rms_norm", 4, 9216, 16, 1024),
    ]:
        block_m, block_n, s = L.bwd_config(n, op, size)
        assert (block_m, block_n, s.head, s.tail, s.warps) == (1, 8192, 8192, tail, warps), n
        assert s.prefetch == (warps == 8)
    for op, size, n in [("rms_norm", 2, 9217), ("rms_norm", 4, 10241), ("add_rms_norm", 4, 9217)]:
        assert L.bwd_config(n, op, size)[1:] == (16384, _RMS_16384), (op, size, n)
    assert all(L.bwd_config(n, "add_rms_norm")[1] == 16384 for n in (8193, 12288))
    assert not L.bwd_config(16384, "layer_norm", 4)[2].bias_apart  # fp32: it lost there
    assert L.use_wide_path(16385, True, "layer_norm", 2)
    assert L.bwd_config(8192, "layer_norm")[2] == Bwd(8192, 8192, 8, 1)


@pytest.mark.parametrize("n, split", [(60, True), (100, False)])
def test_rows_below_a_settings_fused_from_take_the_split_kernels(n, split, device, monkeypatch):
    """norm_backward sends rows narrower than their setting's fused_from to the split kernels,
    and wider ones to the fused kernel; both against float64."""
    setting = norm_launch.Bwd(128, 256, 4, 1, fused_from=97)
    configs = dict.fromkeys(norm_launch.BWD_CONFIGS, (setting,))
    monkeypatch.setattr(norm_launch, "BWD_CONFIGS", configs)
    taken = []
    split_kernels = norm_launch._backward_split
    monkeypatch.setattr(
        norm_launch,
        "_backward_split",
        lambda *a: taken.append("split") or split_kernels(*a),
    )
    assert norm_launch.use_wide_path(n, True, "layer_norm", 4) == split
    check(
        "layer_norm",
        make_inputs("layer_norm", (23, n), torch.float32, device),
        SLACK[torch.float32],
    )
    assert taken == (["split"] if split else [])


@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize(
    "is_rms, has_dh, op",
    [(False, False, "layer_norm"), (True, False, "rms_norm"), (True, True, "add_rms_norm")],
)
def test_each_backward_takes_its_own_settings(is_rms, has_dh, op, dname, device, monkeypatch):
    """norm_backward looks its setting up under its own op and element size: add+RMSNorm's (dh
    added to dx) is not RMSNorm's. Only that key is left (another would raise KeyError)."""
    dtype = DTYPES[dname]
    setting = (norm_launch.Bwd(1 << 20, 64, 4, 1),)
    monkeypatch.setattr(norm_launch, "BWD_CONFIGS", {(op, dtype.itemsize): setting})
    x, dy, dh = (torch.randn(5, 64, device=device).to(dtype) for _ in range(3))
    w = torch.randn(64, device=device).to(dtype)
    rstd = torch.rand(5, device=device) + 0.5
    mean = None if is_rms else torch.randn(5, device=device)
    dx, dw, _ = norm_launch.norm_backward(
        dy, dh if has_dh else None, x, w, None, mean, rstd, is_rms
    )
    x, dy, dh, w = (t.float() for t in (x, dy, dh, w))
    xhat = (x if is_rms else x - mean[:, None]) * rstd[:, None]
    g = dy * w
    c2 = (g * xhat).mean(-1, keepdim=True)
    c1 = 0 if is_rms else g.mean(-1, keepdim=True)
    want = (g - c1 - xhat * c2) * rstd[:, None] + (dh if has_dh else 0)
    tol = 1e-4 if dtype == torch.float32 else 2e-2  # dx and dweight stored in the dtype
    torch.testing.assert_close(dx.float(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(dw.float(), (dy * xhat).sum(0), rtol=tol, atol=tol)


def test_backward_reach_is_capped_by_max_block_n(monkeypatch):
    """A configured block wider than MAX_BLOCK_N is not used: the split kernels take those rows."""
    wide = {**norm_launch.BWD_CONFIGS, ("rms_norm", 2): (norm_launch.Bwd(1 << 20, 8192, 16, 1),)}
    monkeypatch.setattr(norm_launch, "BWD_CONFIGS", wide)
    assert not norm_launch.use_wide_path(16384, True, "rms_norm", 2)
    assert norm_launch.use_wide_path(16385, True, "rms_norm", 2)
    monkeypatch.setattr(norm_launch, "MAX_BLOCK_N", 4096)
    assert norm_launch.use_wide_path(4097, True, "rms_norm", 2)


@pytest.mark.parametrize(
    "prefetch,lean,reload",
    [(False, True, False), (False, False, False), (True, True, False), (False, True, True)],
)
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_fused_backward_loads_and_order(op, dname, prefetch, lean, reload, device, monkeypatch):
    """The fused backward's variants (launch.Bwd): loads at each tile's turn (the weight's too)
    or prefetched, the weight-gradient sums before or after dx, x and dy read again for dx
    (reload) or held. Several tiles per program (3
    programs under the interpreter, one per multiprocessor on a GPU), the last tile ragged, and a
    ragged row. (prefetch, not lean) is what test_block_path covers at most widths."""
    setting = norm_launch.Bwd(1 << 20, 256, 4, 1, prefetch, lean, reload)
    monkeypatch.setattr(
        norm_launch, "BWD_CONFIGS", dict.fromkeys(norm_launch.BWD_CONFIGS, (setting,))
    )
    dtype = DTYPES[dname]
    assert norm_launch.bwd_config(100, op, dtype.itemsize)[2] == setting
    check(op, make_inputs(op, (301, 100), dtype, device), SLACK[dtype])


@pytest.mark.parametrize(
    "prefetch,lean,reload",
    [(False, True, False), (False, False, False), (True, True, False), (False, True, True)],
)
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_fused_backward_variants_without_weight(
    op, dname, prefetch, lean, reload, device, monkeypatch
):
    """As above with no weight (and no bias): the kernel's weight loads, held or at each tile's
    turn, must not happen. dx (and add+RMSNorm's residual gradient) against float64, held to
    eager PyTorch's error in the same dtype."""
    setting = norm_launch.Bwd(1 << 20, 256, 4, 1, prefetch, lean, reload)
    configs = dict.fromkeys(norm_launch.BWD_CONFIGS, (setting,))
    monkeypatch.setattr(norm_launch, "BWD_CONFIGS", configs)
    check_without_weight(op, DTYPES[dname], 301, device)


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("x_rows, dy_rows", [("padded", "broadcast"), ("broadcast", "padded")])
@pytest.mark.parametrize("op", OPS)
def test_reloaded_backward_reads_through_row_strides(
    op, x_rows, dy_rows, prefetch, device, monkeypatch
):
    """x and dy read again for dx (Bwd.reload) through their own row strides, padded or 0,
    against the float64 analytic backward (the reload with x's stride for dy's, or the row's
    width for x's stride, passed every other test)."""
    setting = norm_launch.Bwd(1 << 20, 256, 4, 1, prefetch, True, True)
    monkeypatch.setattr(
        norm_launch, "BWD_CONFIGS", dict.fromkeys(norm_launch.BWD_CONFIGS, (setting,))
    )
    check_backward_through_row_strides(op, x_rows, dy_rows, device)


@pytest.mark.parametrize(
    "op, dtype",
    [
        ("rms_norm", torch.bfloat16),
        ("add_rms_norm", torch.bfloat16),
        ("layer_norm", torch.bfloat16),  # x and dy read again for dx
        ("rms_norm", torch.float32),
        ("add_rms_norm", torch.float32),
        ("layer_norm", torch.float32),  # two slices of 8,192, the second ragged (4,097)
    ],
)
def test_backward_of_rows_up_to_16384_with_the_shipped_setting(op, dtype, device):
    """Rows of 12,289 elements: the fused backward's widest shipped block (16384, loads at each
    tile's turn, or LayerNorm fp32's slices), a ragged row, more rows than programs under the
    interpreter."""
    assert not norm_launch.use_wide_path(12289, True, op, dtype.itemsize)
    setting = norm_launch.bwd_config(12289, op, dtype.itemsize)[2]
    if (op, dtype) == ("layer_norm", torch.float32):
        assert setting.slice == 8192
    else:
        assert not setting.prefetch and not setting.slice
    check(op, make_inputs(op, (7, 12289), dtype, device), SLACK[dtype])


@pytest.mark.parametrize("op", OPS)
def test_wide_row_at_real_limits(op, device):
    """65,537 elements: past the forward and backward block limits, with the shipped chunking
    (the row sums' last step holds one element)."""
    assert norm_launch.use_wide_path(65537) and norm_launch.use_wide_path(65537, backward=True)
    check(op, make_inputs(op, (2, 65537), torch.float32, device), SLACK[torch.float32])


@pytest.mark.parametrize("op", OPS)
def test_strided_input(op, device):
    a = make_inputs(op, (23, 300), torch.float32, device, strided=True)
    assert a["x"].stride(-1) == 1 and a["x"].stride(0) == 305  # rows strided, no copy needed
    check(op, a, SLACK[torch.float32])


@pytest.mark.parametrize("op", OPS)
def test_transposed_input(op, device):
    """Unit stride is not along the normalised dim: the op copies, and still computes right."""
    a = make_inputs(op, (40, 24), torch.float32, device)
    a["x"] = a["x"].detach().t().contiguous().t().requires_grad_()
    assert a["x"].stride(-1) != 1
    check(op, a, SLACK[torch.float32])


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_fp32_weight_with_bf16_activations(op, device):
    a = make_inputs(op, (50, 384), torch.bfloat16, device, weight_dtype=torch.float32)
    check(op, a, SLACK[torch.bfloat16])


def test_weight_gradient_is_deterministic(device):
    a = make_inputs("layer_norm", (300, 96), torch.float32, device)
    out = fused("layer_norm", a)
    g = [torch.randn_like(out[0])]
    first = backward(out, g, a)
    second = backward(fused("layer_norm", a), g, a)
    for u, v in zip(first, second):
        assert torch.equal(u, v)


def test_no_weight_no_bias(device):
    import fusewise

    x = torch.randn(17, 100, device=device, requires_grad=True)
    for fn, ref in [
        (fusewise.ops.layer_norm, lambda t: torch.nn.functional.layer_norm(t, (100,))),
        (fusewise.ops.rms_norm, lambda t: torch.nn.functional.rms_norm(t, (100,), eps=1e-6)),
    ]:
        y = fn(x)
        yd = ref(x.detach().double().requires_grad_())
        assert rel_err(y, yd) < 1e-6
        g = torch.randn_like(y)
        (dx,) = torch.autograd.grad(y, x, g)
        xd = x.detach().double().requires_grad_()
        (dxd,) = torch.autograd.grad(ref(xd), xd, g.double())
        assert rel_err(dx, dxd) < 1e-5


@pytest.mark.parametrize("op", ["layer_norm", "add_rms_norm"])
def test_widest_rows_in_the_issue(op, device):
    """262,144 elements a row (the widest width the benchmarks run), forward and backward."""
    check(op, make_inputs(op, (2, 262144), torch.float32, device), SLACK[torch.float32])


@pytest.mark.parametrize("unroll", [False, True], ids=["rolled", "unrolled"])
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_walk_path(op, dname, unroll, device, monkeypatch):
    """The forward that walks each row in chunks (settings.FWD_WALK), reached at small sizes with
    128-element chunks: a ragged last chunk (1823 = 14 whole chunks walked unmasked and one of
    31 elements after them), whole chunks (512), rows strided by a wider tensor, a row narrower
    than a chunk (100: no whole chunk, the masked one alone); the backward as shipped."""
    walk = (norm_launch.Walk(1, 1 << 40, 128, 4, unroll),)
    monkeypatch.setattr(norm_launch, "FWD_WALK", {(o, s): walk for o in OPS for s in (2, 4)})
    dtype = DTYPES[dname]
    for shape, strided in [((9, 1823), False), ((5, 512), True), ((4, 100), False)]:
        plan = norm_launch._forward_plan(shape[0], shape[1], shape[1], shape[1], (1, 1, 0, 0), 2)
        assert plan.kernel is norm_launch.KW.norm_fwd_walk_kernel
        check(op, make_inputs(op, shape, dtype, device, strided=strided), SLACK[dtype])


@pytest.mark.parametrize("unroll", [False, True], ids=["rolled", "unrolled"])
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_walk_path_with_a_held_part(op, dname, unroll, device, monkeypatch):
    """The walk holding a row's first elements in registers (Walk.hold) and walking the rest:
    the held part joins each statistic and gets its own y. A ragged rest (1823 = 256 held, 12
    chunks and 31), a rest of whole chunks in rows strided by a wider tensor (512), a rest
    narrower than one chunk (300: 44 walked in one chunk of 64)."""
    walk = (norm_launch.Walk(1, 1 << 40, 128, 4, unroll, hold=256),)
    monkeypatch.setattr(norm_launch, "FWD_WALK", {(o, s): walk for o in OPS for s in (2, 4)})
    dtype = DTYPES[dname]
    for shape, strided in [((9, 1823), False), ((5, 512), True), ((3, 300), False)]:
        plan = norm_launch._forward_plan(shape[0], shape[1], shape[1], shape[1], (1, 1, 0, 0), 2)
        assert plan.kernel is norm_launch.KW.norm_fwd_walk_kernel and plan.meta["HOLD"] == 256
        rest = shape[1] - 256
        assert plan.meta["CHUNK"] * plan.meta["CHUNKS"] - rest < plan.meta["CHUNK"]
        check(op, make_inputs(op, shape, dtype, device, strided=strided), SLACK[dtype])


@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("op", OPS)
def test_rows_of_65536_on_the_shipped_walks(op, dname, device):
    """The shipped walks' forward at 65,536 (those that hold a row's first 32,768 elements in
    registers and those that do not) against float64, a ragged rest (40,000) and a row just past
    the held part's width (32,769: one element walked); models' widths that are no whole number
    of chunks (Falcon-180B's 14,848, Nemotron-4's 18,432: walked with a ragged last chunk, but
    add+RMSNorm fp32 at 18,432 on the block path, and at 65,536 cooperative)."""
    dtype = DTYPES[dname]
    for n in (65536, 40000, 32769, 14848, 18432):
        plan = norm_launch._forward_plan(2, n, n, n, FLAGS[op], dtype.itemsize)
        add_fp32 = op == "add_rms_norm" and dname == "fp32"
        kernel = {18432: norm_launch.K.norm_fwd_block_kernel}.get(n) if add_fp32 else None
        if add_fp32 and n == 65536:  # the cooperative forward (settings.FWD_COOP)
            kernel = norm_launch.KC.norm_fwd_coop_kernel
        assert plan.kernel is (kernel or norm_launch.KW.norm_fwd_walk_kernel)
        check_forward(op, make_inputs(op, (2, n), dtype, device), SLACK[dtype])


@pytest.mark.parametrize(
    "walk",
    [
        norm_launch.Walk(1, 1 << 40, 128, 4, hold=512),  # the whole row of 512
        norm_launch.Walk(1, 1 << 40, 128, 4, hold=384),  # not a power of two
        norm_launch.Walk(1, 1 << 40, 128, 4, welford=True, hold=256),
    ],
    ids=["whole-row", "not-a-power-of-two", "welford"],
)
def test_a_walk_holding_what_it_cannot_is_refused(walk, monkeypatch):
    """A held part must be a power of two narrower than the row, and not under welford: a
    setting that breaks this is an error naming it, never a kernel reading past the row."""
    monkeypatch.setattr(norm_launch, "FWD_WALK", {("rms_norm", 2): (walk,)})
    with pytest.raises(ValueError, match="holds"):
        norm_launch._forward_plan(4, 512, 512, 512, (1, 1, 0, 0), 2)


@pytest.mark.parametrize("cache", [0, 1, 2])
@pytest.mark.parametrize("op", OPS)
def test_wide_and_walk_paths_with_streaming_stores(op, cache, device, monkeypatch):
    """launch.FWD_CACHE (y stored streaming; 2: the wide kernel's walks loaded evict-last, then
    evict-first) changes where lines live in the cache, never a value: both paths against
    float64, ragged chunks, strided rows."""
    monkeypatch.setattr(norm_launch, "FWD_CACHE", cache)
    flags, dtype = (op != "layer_norm", 1, op == "layer_norm", op == "add_rms_norm"), torch.bfloat16
    for walk in [(), (norm_launch.Walk(1, 1 << 40, 128, 4),)]:
        monkeypatch.setattr(norm_launch, "FWD_WALK", {(o, 2): walk for o in OPS})
        monkeypatch.setattr(norm_launch, "MAX_BLOCK_N_FWD", 256)
        monkeypatch.setattr(norm_launch, "WIDE_CHUNK_FWD", 128)
        plan = norm_launch._forward_plan(9, 1823, 1823, 1823, flags, 2)
        assert plan.meta.get("CACHE", plan.meta.get("STREAM")) == (cache if not walk else cache > 0)
        for shape, strided in [((9, 1823), False), ((5, 512), True)]:
            check(op, make_inputs(op, shape, dtype, device, strided=strided), SLACK[dtype])


@pytest.mark.parametrize("unroll", [False, True], ids=["rolled", "unrolled"])
@pytest.mark.parametrize("dname", list(DTYPES))
def test_walk_path_layer_norm_in_two_walks(dname, unroll, device, monkeypatch):
    """LayerNorm's walk with mean and variance in one walk (Walk.welford): each lane's running
    mean and M2, merged at the end; ragged (1823), whole (512) and one masked (100) chunks,
    strided rows."""
    walk = (norm_launch.Walk(1, 1 << 40, 128, 4, unroll, welford=True),)
    monkeypatch.setattr(norm_launch, "FWD_WALK", {("layer_norm", s): walk for s in (2, 4)})
    dtype = DTYPES[dname]
    for shape, strided in [((9, 1823), False), ((5, 512), True), ((4, 100), False)]:
        plan = norm_launch._forward_plan(shape[0], shape[1], shape[1], shape[1], (0, 1, 1, 0), 2)
        assert plan.meta["WELFORD"] and plan.kernel is norm_launch.KW.norm_fwd_walk_kernel
        check(
            "layer_norm",
            make_inputs("layer_norm", shape, dtype, device, strided=strided),
            SLACK[dtype],
        )


# LayerNorm's three walks: the mean and variance in one walk, a held part, three plain walks
each_layer_norm_walk = pytest.mark.parametrize(
    "walk",
    [
        norm_launch.Walk(1, 1 << 40, 128, 4, welford=True),
        norm_launch.Walk(1, 1 << 40, 128, 4, hold=256),
        norm_launch.Walk(1, 1 << 40, 128, 4),
    ],
    ids=["welford", "held", "plain"],
)


@each_layer_norm_walk
@pytest.mark.parametrize("rows", ["0", "1e3", "1e4", "-3e4", "outlier 1e4", "outlier -3e4"])
def test_walked_layer_norm_stats_far_from_zero(rows, walk, device, monkeypatch):
    """Rows whose mean is far from 0 next to their spread (offset), or with one element far from
    the rest (outlier: first, middle, last; an outlier channel as in large models' activations):
    the statistics (fp32) are as close to float64 as the one-pass-in-registers block kernel's,
    not worse by the mean's rounding: the lanes walk x less the median of five elements (0,
    250, 500, 749, 999 here; less x[0], the outliers failed 6). The outliers sit where the
    median samples, one a row, two in row 2. Offset: also a constant row. fp32: bf16 and fp16
    shift by x[0] (the next test)."""
    from fusewise.ops.norms import reference

    torch.manual_seed(0)
    value = float(rows.split()[-1])
    if rows.startswith("outlier"):
        x = torch.randn(6, 1000, device=device) * 3
        x[:3, 0], x[3, 500], x[4, 999], x[5, 0] = value, value, value, -value
        x[2, 999] = value / 2
    else:
        x = torch.randn(6, 1000, device=device) * 3 + value
        x[5] = value + 1.0  # constant: rstd = eps**-0.5
    w, b = torch.randn(1000, device=device), torch.randn(1000, device=device)
    want = reference.norm_forward(x.double(), None, w.double(), b.double(), 1e-5, False)
    monkeypatch.setattr(norm_launch, "FWD_WALK", {})
    block = norm_launch.norm_forward(x, None, w, b, 1e-5, False)
    monkeypatch.setattr(norm_launch, "FWD_WALK", {("layer_norm", 4): (walk,)})
    got = norm_launch.norm_forward(x, None, w, b, 1e-5, False)
    # the mean's error counts against the rows' spread (what it shifts y by), not its own size
    spread = x.double().std(-1).norm().item()
    for i, scale in [(0, 0.0), (2, spread), (3, 0.0)]:  # y, mean, rstd
        block_err = rel_err(block[i], want[i], scale)
        assert rel_err(got[i], want[i], scale) <= 2 * block_err + 1e-7, i


@pytest.mark.parametrize("dname", ["bf16", "fp16"])
@each_layer_norm_walk
def test_walked_layer_norm_16_bit_with_an_outlier_first_element(dname, walk, device, monkeypatch):
    """bf16 and fp16 walks shift by x[0] (the median's five loads cost 14% at 65,536 bf16 on the
    H100): with x[0] an outlier their y, gradients too, stays within eager's error in the same
    dtype, which rounds away the statistics' fp32 error."""
    monkeypatch.setattr(norm_launch, "FWD_WALK", {("layer_norm", 2): (walk,)})
    dtype = DTYPES[dname]
    a = make_inputs("layer_norm", (6, 1000), dtype, device)
    with torch.no_grad():
        a["x"][:3, 0] = 1e4 if dtype == torch.bfloat16 else 6e3
        a["x"][3:, 0] = -3e4 if dtype == torch.bfloat16 else -6e3
    check("layer_norm", a, SLACK[dtype])


def test_align_of():
    """ALIGN: the largest power of two below 16 dividing the width and strides; 1 where 16 does
    (Triton knows that itself) and where nothing does."""
    assert norm_launch.align_of(65528, 65528, 65528) == 8
    assert norm_launch.align_of(65536, 65544, 65536) == 8  # a padded row stride
    assert norm_launch.align_of(1004, 1004, 0) == 4  # stride 0: a broadcast residual
    assert norm_launch.align_of(1002, 1002, 1002) == 2
    assert norm_launch.align_of(65536, 65536, 65536) == 1
    assert norm_launch.align_of(32769, 32769, 32769) == 1
    assert norm_launch.align_of(0, 0, 0) == 1
    # past int32 Triton passes a stride as int64; divided it would fit int32 and the kernel's
    # product overflow (tests/test_norm_api.py runs such rows on the GPU)
    assert norm_launch.align_of(1000, 2**31 + 8, 1000) == 1
    assert norm_launch.align_of(1000, 2**31 - 8, 1000) == 8


def _strided_rows(x: torch.Tensor, stride: int) -> torch.Tensor:
    """x's values in rows `stride` apart (a column slice of a wider, poisoned tensor)."""
    wide = torch.full((x.shape[0], stride), float("nan"), device=x.device, dtype=x.dtype)
    wide[:, : x.shape[1]] = x.detach()
    return wide[:, : x.shape[1]].requires_grad_()


# the kernels each path launches, forward then backward
PATH_KERNELS = {
    "block": ("norm_fwd_block_kernel", "norm_bwd_block_kernel"),
    "walk": ("norm_fwd_walk_kernel", "norm_bwd_block_kernel"),
    "wide": ("norm_fwd_wide_kernel", "norm_bwd_row_sums_kernel", "norm_bwd_tiles_kernel"),
    "sliced": ("norm_fwd_block_kernel", "norm_bwd_sliced_kernel"),
}


@pytest.mark.parametrize("path", list(PATH_KERNELS))
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_widths_and_strides_divisible_by_2_4_8(op, dname, path, device, monkeypatch):
    """Each kernel, forward and backward, at widths and row strides that 16 does not divide: the
    launcher passes them divided by ALIGN and the kernel multiplies them back (a division
    forgotten on either side reads the wrong rows or columns). x's rows strided apart from the
    residual's and the gradients'."""
    if path == "walk":
        walk = (norm_launch.Walk(1, 1 << 40, 128, 4),)
        monkeypatch.setattr(norm_launch, "FWD_WALK", {(o, s): walk for o in OPS for s in (2, 4)})
    if path == "wide":  # the forward's chunks and the split backward
        for name, value in [("MAX_BLOCK_N_FWD", 256), ("WIDE_CHUNK_FWD", 128)]:
            monkeypatch.setattr(norm_launch, name, value)
        for name, value in [("MAX_BLOCK_N", 256), ("SUMS_CHUNK", 128)]:
            monkeypatch.setattr(norm_launch, name, value)
    if path == "sliced":
        sliced = (norm_launch.Bwd(1 << 20, 128, 4, 2, slice=256),)
        monkeypatch.setattr(
            norm_launch, "BWD_CONFIGS", dict.fromkeys(norm_launch.BWD_CONFIGS, sliced)
        )
    launched, real = [], norm_launch.launch

    def recording(kernel, grid, *args, **meta):
        launched.append((kernel.fn.__name__, meta.get("ALIGN")))
        return real(kernel, grid, *args, **meta)

    monkeypatch.setattr(norm_launch, "launch", recording)
    dtype = DTYPES[dname]
    for n, stride, align in [(1000, 1000, 8), (1004, 1012, 4), (1002, 1010, 2), (1024, 1032, 8)]:
        a = make_inputs(op, (5, n), dtype, device)
        a["x"] = _strided_rows(a["x"], stride)
        launched.clear()
        check(op, a, SLACK[dtype])
        # add+RMSNorm's backward reads h, which the forward wrote contiguous
        bwd_align = norm_launch.align_of(n) if op == "add_rms_norm" else align
        fwd, *bwd = PATH_KERNELS[path]
        want = {fwd: align, **dict.fromkeys(bwd, bwd_align)}
        assert {k: v for k, v in launched if k in want} == want, (n, launched)
