"""The cooperative forward (kernels_coop.py): rows cut into pieces, one program each, which share
their statistics. On the CPU the interpreter runs it in two launches (PHASE 1 and 2); on a GPU
in one, the programs of a row waiting for each other (PHASE 0), which the GPU tests set against
the two launches bit for bit."""

import pytest
import torch
from norm_cases import DTYPES, OPS, SLACK, check_forward, make_inputs, rel_err
from norm_cases import check_op as check

from fusewise.ops.norms import launch as norm_launch
from fusewise.ops.norms import launch_coop, reference

FLAGS = {"layer_norm": (0, 1, 1, 0), "rms_norm": (1, 1, 0, 0), "add_rms_norm": (1, 1, 0, 1)}
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _coop_everywhere(monkeypatch, piece=128, warps=4, narrow=False, registers=0):
    coop = (norm_launch.Coop(1, 1 << 40, piece, warps, narrow, registers),)
    monkeypatch.setattr(norm_launch, "FWD_COOP", {(o, s): coop for o in OPS for s in (2, 4)})


@pytest.mark.parametrize("narrow", [False, True], ids=["fp32-held", "narrow"])
@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("op", OPS)
def test_coop_path(op, dname, narrow, device, monkeypatch):
    """Forward and backward against float64 with the forward in pieces of 128: a ragged last
    piece (1823: 14 whole and one of 31), whole pieces in rows strided by a wider tensor (512),
    a row narrower than one piece (100), a last piece of one element (257). Narrow: 16-bit inputs
    held as they are (fp32 ones ignore it)."""
    _coop_everywhere(monkeypatch, narrow=narrow)
    dtype = DTYPES[dname]
    for shape, strided, pieces in [
        ((9, 1823), False, 15),
        ((5, 512), True, 4),
        ((4, 100), False, 1),
        ((3, 257), False, 3),
    ]:
        size = dtype.itemsize
        plan = norm_launch._forward_plan(*shape, shape[1], shape[1], FLAGS[op], size)
        assert plan.kernel is norm_launch.KC.norm_fwd_coop_kernel
        assert plan.meta["PIECES"] == pieces and plan.grid == (shape[0] * pieces,)
        assert plan.meta["NARROW"] == (narrow and size == 2)
        check(op, make_inputs(op, shape, dtype, device, strided=strided), SLACK[dtype])


@pytest.mark.parametrize("rows", ["0", "1e3", "1e4", "-3e4", "outlier 1e4"])
def test_coop_layer_norm_stats_far_from_zero(rows, device, monkeypatch):
    """The pieces' means and centred sums of squares merge (Chan) with no cancellation: rows far
    from 0 next to their spread, a constant row and outliers (in the first, a middle and the
    last piece) get statistics as close to float64 as the block kernel's, which holds the row."""
    torch.manual_seed(0)
    value = float(rows.split()[-1])
    x = torch.randn(6, 1000, device=device) * 3
    if rows.startswith("outlier"):
        x[:3, 0], x[3, 500], x[4, 999], x[5, 0] = value, value, value, -value
    else:
        x += value
        x[5] = value + 1.0  # constant: rstd = eps**-0.5
    w, b = torch.randn(1000, device=device), torch.randn(1000, device=device)
    want = reference.norm_forward(x.double(), None, w.double(), b.double(), 1e-5, False)
    block = norm_launch.norm_forward(x, None, w, b, 1e-5, False)
    _coop_everywhere(monkeypatch)
    got = norm_launch.norm_forward(x, None, w, b, 1e-5, False)
    spread = x.double().std(-1).norm().item()
    for i, scale in [(0, 0.0), (2, spread), (3, 0.0)]:  # y, mean, rstd
        assert rel_err(got[i], want[i], scale) <= 2 * rel_err(block[i], want[i], scale) + 1e-7, i


def test_coop_plan_follows_its_table_and_the_gpu_size(monkeypatch):
    """FWD_COOP's widths pick the cooperative forward, edited in place or replaced; a GPU with
    fewer than twice a row's pieces in multiprocessors gets the wide kernel (the pieces might
    not all run at once, and a waiting program would wait for ever), and so do rows whose
    tickets would pass int32; no GPU (sms=0): no limit."""
    flags = FLAGS["rms_norm"]
    monkeypatch.setattr(norm_launch, "FWD_COOP", {})
    plan = norm_launch._forward_plan(4, 100_000, 100_000, 100_000, flags, 2, 132)
    assert plan.kernel is norm_launch.K.norm_fwd_wide_kernel
    norm_launch.FWD_COOP[("rms_norm", 2)] = (norm_launch.Coop(65_537, 1 << 20, 16384, 16),)
    plan = norm_launch._forward_plan(4, 100_000, 100_000, 100_000, flags, 2, 132)
    assert plan.kernel is norm_launch.KC.norm_fwd_coop_kernel
    assert (plan.meta["PIECE"], plan.meta["PIECES"], plan.meta["num_warps"]) == (16384, 7, 16)
    small = norm_launch._forward_plan(4, 100_000, 100_000, 100_000, flags, 2, 13)
    assert small.kernel is norm_launch.K.norm_fwd_wide_kernel  # 7 pieces need 14
    assert norm_launch._forward_plan(4, 100_000, 100_000, 100_000, flags, 2, 14).kernel is (
        norm_launch.KC.norm_fwd_coop_kernel
    )
    many = norm_launch._forward_plan(2**31 // 7 + 1, 100_000, 100_000, 100_000, flags, 2, 132)
    assert many.kernel is norm_launch.K.norm_fwd_wide_kernel  # tickets past int32
    assert norm_launch._forward_plan(4, 100_000, 100_000, 100_000, flags, 2, 0) is (
        norm_launch._forward_plan(4, 100_000, 100_000, 100_000, flags, 2)
    )
    outside = norm_launch._forward_plan(4, 65_536, 65_536, 65_536, flags, 2, 132)
    assert outside.kernel is not norm_launch.KC.norm_fwd_coop_kernel
    assert norm_launch._forward_plan(4, 100_000, 100_000, 100_000, flags, 4, 132).kernel is not (
        norm_launch.KC.norm_fwd_coop_kernel  # fp32 has no setting
    )


@pytest.mark.parametrize(
    "piece, warps, narrow, registers, why",
    [(384, 4, 0, 0, "powers of two"), (256, 64, 0, 0, "powers of two")]
    + [(256, 3, 0, 0, "powers of two"), (1, 1, 1, 0, "2 elements or more")]
    + [(256, 4, 0, 8, "registers"), (256, 4, 0, 256, "registers"), (256, 4, 0, -1, "registers")],
)
def test_a_coop_setting_that_cannot_run_is_refused(
    piece, warps, narrow, registers, why, monkeypatch
):
    """A narrow piece of one element would not compile for a GPU: its opaque step moves 16-bit
    elements two at a time."""
    coop = (norm_launch.Coop(1, 1 << 40, piece, warps, bool(narrow), registers),)
    monkeypatch.setattr(norm_launch, "FWD_COOP", {("rms_norm", 2): coop})
    with pytest.raises(ValueError, match=why):
        norm_launch._forward_plan(4, 1000, 1000, 1000, FLAGS["rms_norm"], 2)


def test_fp16_skips_narrow_settings(device, monkeypatch):
    """fp16 takes bf16's settings but for the narrow ones (measured in bf16 alone; under Triton
    3.9 an fp16 narrow piece spills): it takes the next setting that matches its width, or, with
    none, the forward it would have without the cooperative one; and it still holds to
    float64."""
    narrow, plain = norm_launch.Coop(1, 1 << 40, 256, 4, True), norm_launch.Coop(1, 1 << 40, 128, 4)
    monkeypatch.setattr(norm_launch, "FWD_COOP", {("rms_norm", 2): (narrow, plain)})
    shape = (3, 1000, 1000, 1000, FLAGS["rms_norm"], 2)
    bf16, fp16 = norm_launch._forward_plan(*shape), norm_launch._forward_plan(*shape, fp16=True)
    assert (bf16.meta["PIECE"], bf16.meta["NARROW"]) == (256, True)
    assert (fp16.meta["PIECE"], fp16.meta["NARROW"]) == (128, False)
    check_forward("rms_norm", make_inputs("rms_norm", (3, 1000), torch.float16, device), 6e-5)
    monkeypatch.setattr(norm_launch, "FWD_COOP", {("rms_norm", 2): (narrow,)})
    alone = norm_launch._forward_plan(*shape, fp16=True)
    assert alone.kernel is not norm_launch.KC.norm_fwd_coop_kernel
    check_forward("rms_norm", make_inputs("rms_norm", (3, 1000), torch.float16, device), 6e-5)


def test_a_register_cap_goes_to_the_compiler(device, monkeypatch):
    """Coop.registers reaches Triton as maxnreg, a compile option (so in the plan's launch
    options, and the plan cache tells capped from uncapped); 0 sets none. Capped, the forward
    still holds to float64 (the interpreter ignores the cap; a GPU spills past it)."""
    for registers in (0, 32, 0):
        coop = (norm_launch.Coop(1, 1 << 40, 128, 4, registers=registers),)
        monkeypatch.setattr(norm_launch, "FWD_COOP", {("rms_norm", 2): coop})
        plan = norm_launch._forward_plan(4, 1000, 1000, 1000, FLAGS["rms_norm"], 2)
        assert plan.meta.get("maxnreg", 0) == registers
    _coop_everywhere(monkeypatch, narrow=True, registers=32)
    for dname in DTYPES:
        inputs = make_inputs("layer_norm", (3, 1000), DTYPES[dname], device)
        check_forward("layer_norm", inputs, SLACK[DTYPES[dname]])


def test_each_element_size_gets_its_own_plan(monkeypatch):
    """A narrow setting holds 16-bit inputs narrow and fp32 ones not: the plan cache keys on the
    element size, whatever was asked before (the cache emptied first)."""
    coop = (norm_launch.Coop(1, 1 << 40, 128, 4, narrow=True),)
    monkeypatch.setattr(norm_launch, "FWD_COOP", {("rms_norm", 2): coop, ("rms_norm", 4): coop})
    monkeypatch.setattr(norm_launch, "_fwd_plans", {})
    for first, second in [(4, 2), (2, 4)]:
        norm_launch._fwd_plans.clear()
        a = norm_launch._forward_plan(4, 1000, 1000, 1000, FLAGS["rms_norm"], first)
        b = norm_launch._forward_plan(4, 1000, 1000, 1000, FLAGS["rms_norm"], second)
        assert (a.meta["NARROW"], b.meta["NARROW"]) == (first == 2, second == 2)


def test_unwritten_piece_statistics_would_fail(device, monkeypatch):
    """The pieces' statistics come from the poisoned allocator (NaN): were a piece's not written
    before the merge, y would be NaN. Here the merge runs alone (PHASE 2 without PHASE 1)."""
    _coop_everywhere(monkeypatch)
    x, w = torch.randn(3, 300, device=device), torch.randn(300, device=device)
    assert torch.isfinite(norm_launch.norm_forward(x, None, w, None, 1e-6, True)[0]).all()
    plan = norm_launch._forward_plan(3, 300, 300, 300, FLAGS["rms_norm"], 4)
    y, rstd = torch.zeros_like(x), torch.zeros(3, device=device)
    part = norm_launch.alloc(3 * plan.meta["PIECES"] * 2, torch.float32, device)
    sync = torch.zeros(4, dtype=torch.int32, device=device)
    args = (x, x, w, None, y, y, rstd, rstd, part, sync, *plan.ints, 1e-6)
    norm_launch.launch(norm_launch.KC.norm_fwd_coop_kernel, plan.grid, *args, PHASE=2, **plan.meta)
    assert torch.isnan(y).all()


def _both_ways(op, shape, dtype, setting, monkeypatch, graph=False, repeats=1):
    """The one launch (PHASE 0) and the two (PHASE 1, 2) on the same inputs; the one launch
    `repeats` times, each the same bit for bit (a race would show now and then). setting:
    (piece, warps, narrow[, registers])."""
    _coop_everywhere(monkeypatch, *setting)
    a = make_inputs(op, shape, dtype, "cuda")
    args = (a["x"].detach(), a.get("residual"), a["weight"].detach(), a.get("bias"), 1e-5)
    args = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in args)
    is_rms = op != "layer_norm"
    if graph:
        norm_launch.norm_forward(*args, is_rms)  # compile outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            one = norm_launch.norm_forward(*args, is_rms)
        g.replay()
        g.replay()
    else:
        one = norm_launch.norm_forward(*args, is_rms)
        for _ in range(repeats - 1):
            again = norm_launch.norm_forward(*args, is_rms)
            assert all(torch.equal(g, w) for g, w in zip(again, one) if w is not None)
    monkeypatch.setattr(launch_coop, "INTERPRETED", True)
    two = norm_launch.norm_forward(*args, is_rms)
    return one, two


@needs_gpu
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(
    "shape, setting",
    [
        ((64, 262_144), (16384, 16, False)),
        ((37, 100_003), (32768, 32, False)),
        ((2000, 4100), (512, 4, False)),
        ((64, 262_144), (65536, 32, True)),
        ((37, 100_003), (65536, 32, True)),
        ((2000, 4100), (512, 4, True)),
        ((64, 262_144), (32768, 32, True, 32)),
        ((37, 100_003), (16384, 32, False, 32)),
    ],
    ids=["262144", "ragged", "many-rows", "262144-narrow", "ragged-narrow", "many-rows-narrow"]
    + ["262144-narrow-capped", "ragged-capped"],
)
def test_one_launch_matches_two_bit_for_bit(op, dname, shape, setting, monkeypatch):
    """The waiting programs (PHASE 0) compute what the two launches do, bit for bit, at real
    widths, at a ragged width, and with 20,000 programs of 9 pieces a row (tickets handed out
    across many waves, ten times), with x held in fp32 or (narrow) in its own 16-bit dtype, and
    with 32 registers a thread (two programs a multiprocessor; LayerNorm's then spill); the two
    launches are held to float64 by test_coop_path."""
    repeats = 10 if shape[0] == 2000 else 1
    one, two = _both_ways(op, shape, DTYPES[dname], setting, monkeypatch, repeats=repeats)
    for got, want in zip(one, two):
        if want is not None:
            assert torch.equal(got, want)


@needs_gpu
def test_one_launch_under_cuda_graph_replay(monkeypatch):
    """Replayed from a CUDA graph, the counters are zeroed by the captured memset each time."""
    setting = (16384, 16, False)
    one, two = _both_ways("layer_norm", (96, 262_144), torch.bfloat16, setting, monkeypatch, True)
    for got, want in zip(one, two):
        if want is not None:
            assert torch.equal(got, want)


@pytest.mark.parametrize("key", sorted(norm_launch.FWD_COOP), ids=lambda k: f"{k[0]}-{k[1]}")
def test_shipped_coop_settings_at_real_widths(key, device):
    """Each shipped FWD_COOP setting at its narrowest and widest width and an odd one between,
    forward against float64 (the backward: the split kernels' tests), in each dtype it serves:
    fp32, or bf16 and (but for a narrow setting) fp16."""
    op, size = key
    for dtype in [torch.float32] if size == 4 else [torch.bfloat16, torch.float16]:
        fp16 = dtype == torch.float16
        coop = next(c for c in norm_launch.FWD_COOP[key] if not (fp16 and c.narrow))
        for n in (coop.narrowest, (coop.narrowest + coop.widest) // 2 | 1, coop.widest):
            plan = norm_launch._forward_plan(2, n, n, n, FLAGS[op], size, 132, fp16)
            assert plan.kernel is norm_launch.KC.norm_fwd_coop_kernel, n
            assert plan.meta["PIECE"] == coop.piece, (n, dtype)
            check_forward(op, make_inputs(op, (2, n), dtype, device), SLACK[dtype])
