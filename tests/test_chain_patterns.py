"""Fusion-chain patterns (diagnose/_patterns.py): gated activations and rotary embeddings are
recognised from the dataflow of real recorded steps (both captures), controls that only look
alike are not, and the finding's fix is the one fixes.py holds for the pattern (the fused op a
family registered first). Plus the structural rules on hand-built op lists."""

import pathlib

import pytest
import torch
import torch.nn.functional as F

from fusewise import fixes
from fusewise.capture.graph import OpGraph, OpRecord, Value
from fusewise.capture.opgraph import Recorder
from fusewise.capture.profiled import ProfiledCapture
from fusewise.diagnose import _patterns
from fusewise.diagnose.chains import find_chains
from fusewise.hardware import Ceilings

H200 = Ceilings("NVIDIA H200 (PERF.md)", "cuda", 4274.0, 686.0, "test")
CAPTURES = [pytest.param(Recorder, id="recorder"), pytest.param(ProfiledCapture, id="profiler")]
B, T, D, H = 2, 128, 256, 688  # MLP: [B, T, D] -> [B, T, H] -> [B, T, D]
NH, DH = 4, 64  # attention heads, head dim: q, k [B, NH, T, DH]


def line_of(text: str) -> str:
    """path:line of this file's line containing text, as the recorder names it."""
    for i, line in enumerate(pathlib.Path(__file__).read_text().splitlines(), 1):
        if line.rstrip().endswith(text):
            return f"{i}"
    raise AssertionError(text)


def findings(capture, step):
    """The chains of one recorded step (run once before, as diagnose does)."""
    torch.manual_seed(0)
    step()
    with capture() as cap:
        step()
    return find_chains(cap.graph, H200)


def at(found, text):
    """The findings made by this file's line containing text: {(pattern, phase): finding}."""
    line = line_of(text)
    return {
        (f.pattern, f.evidence["phase"]): f
        for f in found
        if pathlib.Path(f.where.split(":")[0]).name == pathlib.Path(__file__).name
        and f.where.split(":")[-1] == line
    }


# --- gated activations ------------------------------------------------------------------------


def _mlp(act):
    torch.manual_seed(0)
    x = torch.randn(B, T, D, requires_grad=True)
    gate, up = torch.nn.Linear(D, H, bias=False), torch.nn.Linear(D, H, bias=False)
    down = torch.nn.Linear(H, D, bias=False)

    def step():
        h = act(gate(x)) * up(x)  # the gated line
        down(h).sum().backward()

    return step


ACTIVATIONS = [
    pytest.param(F.silu, id="swiglu"),
    pytest.param(lambda g: F.gelu(g, approximate="tanh"), id="geglu-tanh"),
    pytest.param(F.gelu, id="geglu-exact"),
]


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_a_gated_mlp_is_gated_activation_and_names_swiglu(capture, act):
    found = at(findings(capture, _mlp(act)), "# the gated line")
    # the backward (silu_backward / gelu_backward fed by grad_h * up, plus x's gradient sum) is
    # reported; the forward chain act(gate) * up is not: autograd keeps act(gate), so as written
    # it moves 5 tensors where a fused kernel moves 4, below CHAIN_MIN_RATIO
    assert set(found) == {("gated-activation", "backward")}, found
    f = found["gated-activation", "backward"]
    assert f.fix.startswith("fusewise.ops.swiglu / geglu") and "fusewise.patch(model)" in f.fix
    assert f.fix == fixes.text("fusion-chain", "gated-activation")
    assert {"mul"} <= set(f.evidence["op_names"]) and f.evidence["phase"] == "backward"


@pytest.mark.parametrize("capture", CAPTURES)
def test_silu_written_out_times_up_is_gated_in_both_directions(capture):
    torch.manual_seed(0)
    x = torch.randn(B, T, D, requires_grad=True)
    gate, up = torch.nn.Linear(D, H, bias=False), torch.nn.Linear(D, H, bias=False)

    def step():
        g = gate(x)
        h = g * torch.sigmoid(g) * up(x)  # silu by hand
        h.sum().backward()

    found = at(findings(capture, step), "# silu by hand")
    # forward: sigmoid, mul, mul keep s and a for the backward: 8 tensors moved, 5 needed
    assert {("gated-activation", "forward"), ("gated-activation", "backward")} <= set(found)


# --- rotary -----------------------------------------------------------------------------------


def rotate_half(x):
    """Hugging Face's: [..., DH] -> [..., DH], the halves swapped, the second negated."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x):
    """GPT-J's interleaved form: pairs (x0, x1) -> (-x1, x0)."""
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _attention_inputs(rotate):
    torch.manual_seed(0)
    hidden = torch.randn(B, T, NH * DH, requires_grad=True)
    wq, wk = torch.nn.Linear(NH * DH, NH * DH), torch.nn.Linear(NH * DH, NH * DH)
    angles = torch.randn(T, DH)
    cos, sin = angles.cos(), angles.sin()

    def step():
        q = wq(hidden).view(B, T, NH, DH).transpose(1, 2)
        k = wk(hidden).view(B, T, NH, DH).transpose(1, 2)
        q = q * cos + rotate(q) * sin  # rotary q
        k = k * cos + rotate(k) * sin  # rotary k
        (q @ k.transpose(-1, -2)).sum().backward()

    return step


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("rotate", [rotate_half, rotate_every_two], ids=["hf", "gptj"])
def test_rotary_on_q_and_k_is_rotary_forward_and_backward(capture, rotate):
    found = findings(capture, _attention_inputs(rotate))
    for text in ("# rotary q", "# rotary k"):
        mine = at(found, text)
        assert set(mine) == {("rotary", "forward"), ("rotary", "backward")}, (text, mine)
        for f in mine.values():
            assert f.fix == fixes.text("fusion-chain", "rotary")
            assert "neg" in f.evidence["op_names"]
    assert not [f for f in found if f.pattern == "gated-activation"]


def test_a_registered_rotary_fix_is_what_the_finding_recommends(monkeypatch):
    """fusewise's rotary family registers its fix when imported: the finding recommends it first,
    the generic fix after; and through the registry alone (another family in its place)."""
    found = findings(Recorder, _attention_inputs(rotate_half))
    rotary = [f for f in found if f.pattern == "rotary"]
    assert rotary and all(
        f.fix.startswith("fusewise.ops.apply_rotary(q, k, cos, sin)") for f in rotary
    )
    assert all("; or torch.compile the rotary" in f.fix for f in rotary)
    registry = {k: list(v) for k, v in fixes._REGISTERED.items() if k != ("fusion-chain", "rotary")}
    monkeypatch.setattr(fixes, "_REGISTERED", registry)
    fixes.register(
        "fusion-chain",
        "rotary",
        "fake.apply_rotary(q, k, cos, sin)",
        api="fake.apply_rotary",
        origin="test",
    )
    found = findings(Recorder, _attention_inputs(rotate_half))
    rotary = [f for f in found if f.pattern == "rotary"]
    assert len(rotary) == 4  # q and k, forward and backward
    for f in rotary:
        assert f.fix.startswith("fake.apply_rotary(q, k, cos, sin); or torch.compile the rotary")


# --- controls: alike, but neither gated nor rotary --------------------------------------------

X_SHAPE = (4, 256, 512)  # 2 MiB of fp32: every control chain is above the reporting floor


def _plain():
    x = torch.randn(X_SHAPE)
    return lambda: (x * 2 + 1).neg()  # plain elementwise


def _gelu_alone():
    x = torch.randn(X_SHAPE, requires_grad=True)
    return lambda: (F.gelu(x * 3.0) * 0.5).sum().backward()  # gelu alone


def _gelu_dropout():
    x = torch.randn(X_SHAPE, requires_grad=True)
    # on the CPU dropout is a bernoulli_ mask times its input: a same-shape mul, but not up
    return lambda: (F.dropout(F.gelu(x * 3.0), 0.1) * 2.0).sum().backward()  # gelu dropout


def _silu_residual():
    x, r = torch.randn(X_SHAPE, requires_grad=True), torch.randn(X_SHAPE)
    return lambda: ((F.silu(x * 3.0) + r) * 2.0).sum().backward()  # silu residual


def _rms_norm():
    x, w = torch.randn(X_SHAPE, requires_grad=True), torch.randn(X_SHAPE[-1])

    def rms():
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w  # rms norm

    return lambda: rms().sum().backward()


def _negated_concat():
    x, y = torch.randn(X_SHAPE), torch.randn(X_SHAPE)
    # halves of two different tensors, negated and placed side by side, then multiplied
    return lambda: torch.cat((-x[..., :256], y[..., 256:]), -1) * y * 2  # two tensors


CONTROLS = [
    pytest.param(_plain, "# plain elementwise", "elementwise", id="x*2+1"),
    pytest.param(_gelu_alone, "# gelu alone", "elementwise", id="gelu-alone"),
    pytest.param(_gelu_dropout, "# gelu dropout", "elementwise", id="gelu-dropout"),
    pytest.param(_silu_residual, "# silu residual", "elementwise", id="silu-plus-residual"),
    pytest.param(_rms_norm, "# rms norm", "norm", id="rms-norm"),
    pytest.param(_negated_concat, "# two tensors", "elementwise", id="negated-concat"),
]


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("make, text, expected", CONTROLS)
def test_look_alikes_are_neither_gated_nor_rotary(capture, make, text, expected):
    torch.manual_seed(0)
    found = at(findings(capture, make()), text)
    patterns = {p for p, _ in found}
    # a forward chain that ends in the loss's .sum() is "other"
    assert expected in patterns and patterns <= {expected, "other"}, found
    for f in found.values():
        assert "swiglu" not in f.fix and f.fix == fixes.text("fusion-chain", f.pattern)


def test_the_elementwise_fix_no_longer_recommends_swiglu():
    assert "swiglu" not in fixes.text("fusion-chain", "elementwise")
    (fix,) = fixes.registered("fusion-chain", "gated-activation")
    assert (fix.api, fix.origin) == ("fusewise.ops.swiglu", "fusewise.ops.gated")
    assert fixes.text("fusion-chain", "gated-activation").endswith(
        "torch.compile the MLP's activation, act(gate) * up (Inductor makes it one kernel "
        "forward and one backward)"
    )


# --- the rules on hand-built op lists ---------------------------------------------------------


def _pattern_of(shapes: dict[int, tuple], ops: list[tuple], dtypes: dict | None = None) -> str:
    """ops: (name, inputs, outputs), a name ending in "!" a view. Values fp32 unless dtypes
    says otherwise; the chain is every op that is not a view."""
    values = {
        v: Value(v, s, (dtypes or {}).get(v, "float32"), 4 * max(1, _numel(s)))
        for v, s in shapes.items()
    }
    records = [
        OpRecord(i, name.rstrip("!"), "forward", ins, outs, 1.0, 8.0, "x.py:1", name.endswith("!"))
        for i, (name, ins, outs) in enumerate(ops)
    ]
    g = OpGraph(records, values)
    return _patterns.pattern([o for o in records if not o.is_view], g)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


FULL, HALF = (2, 8, 64), (2, 8, 32)
ROTATE_HALF = [  # X = 0, cos = 1, sin = 2
    ("aten.mul.Tensor", [0, 1], [3]),
    ("aten.slice.Tensor!", [0], [4]),
    ("aten.slice.Tensor!", [0], [5]),
    ("aten.neg.default", [5], [6]),
    ("aten.cat.default", [6, 4], [7]),
    ("aten.mul.Tensor", [7, 2], [8]),
    ("aten.add.Tensor", [3, 8], [9]),
]
ROT_SHAPES = {0: FULL, 1: FULL, 2: FULL, 3: FULL, 4: HALF, 5: HALF, 6: HALF, 7: FULL, 8: FULL}
ROT_SHAPES[9] = FULL


def test_rotate_half_rules():
    assert _pattern_of(ROT_SHAPES, ROTATE_HALF) == "rotary"
    # the other half from another tensor (10): not a rotation of X
    other = [
        op if op[0] != "aten.slice.Tensor!" or op[2] != [4] else (op[0], [10], [4])
        for op in ROTATE_HALF
    ]
    assert _pattern_of({**ROT_SHAPES, 10: FULL}, other) == "elementwise"
    # the whole tensor negated (no view): not one half of it
    whole = [("aten.neg.default", [0], [6]), ("aten.cat.default", [6, 4], [7])]
    whole = [ROTATE_HALF[1]] + whole + ROTATE_HALF[5:]
    assert _pattern_of({**ROT_SHAPES, 6: FULL}, whole) == "elementwise"
    # rotated but never multiplied (by sin), nor made by a mul: not rotary
    assert _pattern_of(ROT_SHAPES, ROTATE_HALF[1:5]) == "elementwise"
    # a softmax in the chain: attention comes first
    assert (
        _pattern_of({**ROT_SHAPES, 10: FULL}, ROTATE_HALF + [("aten._softmax.default", [9], [10])])
        == "attention"
    )


def test_rotate_half_backward_rule():
    # Y = grad * sin (3); halves of Y placed back by slice_backward, one negated
    ops = [
        ("aten.mul.Tensor", [0, 2], [3]),
        ("aten.slice.Tensor!", [3], [4]),
        ("aten.slice.Tensor!", [3], [5]),
        ("aten.neg.default", [4], [6]),
        ("aten.slice_backward.default", [6], [7]),
        ("aten.slice_backward.default", [5], [8]),
        ("aten.add.Tensor", [7, 8], [9]),
    ]
    shapes = {0: FULL, 2: FULL, 3: FULL, 4: HALF, 5: HALF, 6: HALF, 7: FULL, 8: FULL, 9: FULL}
    assert _pattern_of(shapes, ops) == "rotary"
    # Y made by an add, not a mul: no sin, not rotary
    assert _pattern_of(shapes, [("aten.add.Tensor", [0, 2], [3])] + ops[1:]) == "elementwise"


GATED = [  # gate = 0, up = 1
    ("aten.silu.default", [0], [2]),
    ("aten.mul.Tensor", [2, 1], [3]),
]
G = (2, 8, 48)


@pytest.mark.parametrize(
    "ops, shapes, dtypes, expected",
    [
        pytest.param(GATED, {0: G, 1: G, 2: G, 3: G}, {}, "gated-activation", id="silu-times-up"),
        pytest.param(
            [("aten.gelu.default", [0], [2]), ("aten.mul_.Tensor", [2, 1], [3])],
            {0: G, 1: G, 2: G, 3: G},
            {},
            "gated-activation",
            id="gelu-times-up-in-place",
        ),
        pytest.param(GATED, {0: G, 1: (48,), 2: G, 3: G}, {}, "elementwise", id="times-a-weight"),
        pytest.param(GATED, {0: G, 1: (), 2: G, 3: G}, {}, "elementwise", id="times-a-scalar"),
        pytest.param(GATED, {0: G, 1: G, 2: G, 3: G}, {1: "bool"}, "elementwise", id="times-bool"),
        pytest.param(
            [("aten.silu.default", [0], [2]), ("aten.mul.Tensor", [2, 0], [3])],
            {0: G, 2: G, 3: G},
            {},
            "elementwise",
            id="silu-times-its-gate",
        ),
        pytest.param(
            [("aten.sigmoid.default", [0], [2]), ("aten.mul.Tensor", [0, 2], [3])],
            {0: G, 2: G, 3: G},
            {},
            "elementwise",
            id="silu-by-hand-alone",
        ),
        pytest.param(
            [("aten.bernoulli_.float", [1], [4]), ("aten.div_.Scalar", [4], [5])]
            + [("aten.silu.default", [0], [2]), ("aten.mul.Tensor", [2, 5], [3])],
            {0: G, 1: G, 2: G, 3: G, 4: G, 5: G},
            {},
            "elementwise",
            id="times-dropout-mask",
        ),
        pytest.param(
            GATED + [("aten.mean.dim", [3], [4]), ("aten.rsqrt.default", [4], [5])],
            {0: G, 1: G, 2: G, 3: G, 4: (2, 8, 1), 5: (2, 8, 1)},
            {},
            "norm",
            id="norm-first",
        ),
        pytest.param(  # grad_a = grad_h * up; silu_backward(grad_a, gate)
            [("aten.mul.Tensor", [4, 1], [5]), ("aten.silu_backward.default", [5, 0], [6])],
            {0: G, 1: G, 4: G, 5: G, 6: G},
            {},
            "gated-activation",
            id="silu-backward",
        ),
        pytest.param(  # gelu(x) * 2 backward: grad * 2 (a 0-dim scalar), then gelu_backward
            [("aten.mul.Tensor", [4, 1], [5]), ("aten.gelu_backward.default", [5, 0], [6])],
            {0: G, 1: (), 4: G, 5: G, 6: G},
            {},
            "elementwise",
            id="gelu-backward-scaled",
        ),
    ],
)
def test_gated_rules(ops, shapes, dtypes, expected):
    assert _pattern_of(shapes, ops, dtypes) == expected


def test_a_hugging_face_llama_step():
    """The real thing, as the patterns were written for: HF Llama's rotate_half on q and k, its
    SwiGLU MLP (only the backward is reported: the forward's ratio is below CHAIN_MIN_RATIO)."""
    tf = pytest.importorskip("transformers")
    config = tf.LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(config)
    idx = torch.randint(3, 512, (4, 128))
    found = findings(ProfiledCapture, lambda: model(input_ids=idx, labels=idx).loss.backward())
    by_pattern = {(f.pattern, f.evidence["phase"]): f for f in found}
    assert {("rotary", "forward"), ("rotary", "backward")} <= set(by_pattern)
    assert ("gated-activation", "backward") in by_pattern
    assert ("gated-activation", "forward") not in by_pattern
    gated = by_pattern["gated-activation", "backward"]
    assert "modeling_llama.py" in gated.where and "silu_backward" in gated.evidence["op_names"]
    assert "fusewise.ops.swiglu" in gated.fix
    assert "neg" in by_pattern["rotary", "forward"].evidence["op_names"]


@pytest.mark.parametrize("capture", CAPTURES)
def test_an_optimizer_chain_holds_every_update_of_its_parameter(capture):
    """A per-parameter AdamW (foreach=False) is one chain per parameter with all its updates:
    `p.mul_(1 - lr * wd)` and `exp_avg_sq.mul_(beta2)` read nothing computed in the optimizer,
    the updates after them read the gradient the backward's matmuls made; only matmuls of the
    optimizer's own phase may part a chain (they once left both muls out: a fused optimizer
    removes them too, and the H200 demo's prediction missed their 0.35 ms of kernels)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1, foreach=False)
    x = torch.randn(64, 256)

    def step():
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()

    (f,) = [f for f in findings(capture, step) if f.evidence["phase"] == "optimizer"]
    assert f.pattern == "optimizer" and f.evidence["chains"] == 4  # weight and bias, twice
    # per parameter: 2 mul_, lerp_, addcmul_, sqrt, div, add_, addcdiv_
    assert f.evidence["ops"] == 4 * 8
    assert "mul_" in f.evidence["op_names"]


@pytest.mark.parametrize("capture", CAPTURES)
def test_ops_after_the_optimizer_step_never_join_a_chain_before_the_backward(capture):
    """Ops after opt.step() are labelled forward too; a chain cannot take the clone made before
    the backward and the ops after the step (the optimizer rewrites w between them)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(512, 512))
    opt = torch.optim.SGD([w], lr=0.1)
    x = torch.randn(64, 512)

    def step():
        opt.zero_grad()
        old = w.detach().clone()
        (x @ w).square().mean().backward()
        opt.step()
        return (w.detach() - old).abs().amax()

    for f in findings(capture, step):
        assert not {"clone", "sub"} <= set(f.evidence["op_names"]), f.evidence
