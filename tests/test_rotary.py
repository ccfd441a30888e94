"""fusewise.ops.apply_rotary: the fused rotary embedding against HF's formula in float64 (and HF's
apply_rotary_pos_emb itself when transformers is installed), forward and the gradients of q and
k, over odd widths, partial and interleaved rotary, grouped-query heads, every cos/sin shape and
strided, transposed and expanded layouts; the saved tensors; errors; torch.compile and the
custom ops' registrations. On the CPU the real kernel runs under TRITON_INTERPRET=1 (conftest)."""

from dataclasses import dataclass

import pytest
import torch

import fusewise
from fusewise.ops import apply_rotary
from fusewise.ops.rotary import cost as rotary_cost
from fusewise.ops.rotary import launch as rotary_launch
from fusewise.ops.rotary import op as rotary_op

TOL = {  # (rtol, atol) against float64: fp32 math, one rounding to the storage dtype
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1e-2, 1e-2),
    torch.float16: (2e-3, 2e-3),
}


@pytest.fixture(autouse=True)
def poisoned_rotary_outputs(monkeypatch):
    """The kernel's outputs start as NaN, so an element it never writes fails."""

    def alloc(like):
        return torch.empty_like(like).fill_(float("nan"))

    monkeypatch.setattr(rotary_launch, "alloc", alloc)


# --- the float64 oracle: HF's formula, written here -----------------------------------------------


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rotate_every_two(x):  # GPT-J: [-x1, x0, -x3, x2, ...]
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _oracle(x, cos, sin, interleaved):
    """x * cos + rotate(x) * sin on the first Dr features, the rest passed through; cos, sin
    broadcast as HF's unsqueeze_dim=1 layout [B | 1, 1, S, Dr]."""
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    dr = cos.shape[-1]
    r = x[..., :dr]
    turn = _rotate_every_two if interleaved else _rotate_half
    return torch.cat((r * cos + turn(r) * sin, x[..., dr:]), dim=-1)


# --- inputs --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    b: int
    s: int
    hq: int
    hkv: int
    d: int
    dr: int
    cos: str = "BS"  # S: [S, Dr]; BS: [B, S, Dr]; B1S: [B, 1, S, Dr]; 11S: [1, 1, S, Dr];
    # strided: [B, S, Dr] with stride 2 along Dr
    q: str = "hf"  # hf: HF's view(B, S, H, D).transpose(1, 2); contiguous; expanded; strided
    k: str = "hf"
    interleaved: bool = False
    cos_dtype: torch.dtype | None = None  # None: q's dtype, as HF casts them

    def __str__(self):
        mode = "-interleaved" if self.interleaved else ""
        return (
            f"B{self.b}-S{self.s}-Hq{self.hq}-Hkv{self.hkv}-D{self.d}-Dr{self.dr}-cos{self.cos}"
            f"-q{self.q}-k{self.k}{mode}"
        )


CASES = [
    Case(2, 3, 4, 2, 16, 16),
    Case(2, 3, 2, 1, 6, 4, cos="S", q="contiguous", k="contiguous", cos_dtype=torch.float64),
    Case(1, 2, 4, 2, 80, 80, cos="B1S", k="expanded"),
    Case(2, 1, 4, 1, 8, 8, cos="11S", q="contiguous", k="expanded"),
    Case(1, 1, 1, 1, 4, 2, cos="S"),
    Case(2, 3, 4, 4, 20, 10, q="strided"),
    Case(2, 3, 2, 2, 12, 8, cos="strided", k="strided", interleaved=True),
    Case(2, 2, 4, 2, 16, 16, cos="B1S", q="contiguous", interleaved=True),
    # head counts against the kernel's head tiles (8 heads of D 128 a tile): two unmasked tiles
    # of q; 12 heads: a tile overhanging by 4; 3 heads in a tile of 4
    Case(1, 2, 16, 8, 128, 128),
    Case(1, 2, 12, 3, 128, 128, k="contiguous"),
]


def _leaf_and_view(layout, b, h, s, d, dtype, device):
    """A leaf tensor (the gradient lands on it) and the [B, H, S, D] view of it the op gets."""
    make = {
        "contiguous": ((b, h, s, d), lambda t: t),
        "hf": ((b, s, h, d), lambda t: t.transpose(1, 2)),
        "expanded": ((b, 1, s, d), lambda t: t.expand(b, h, s, d)),  # stride 0 over heads
        "strided": ((b, h, s, 2 * d), lambda t: t[..., ::2]),  # stride 2 along D
    }
    shape, view = make[layout]
    leaf = torch.randn(shape, device=device).to(dtype).requires_grad_()
    return leaf, view


def _cos_sin(case, dtype, device):
    """Independent random angles per feature (no assumption that the halves are equal)."""
    b, s, dr = case.b, case.s, case.dr
    shape = {
        "S": (s, dr),
        "BS": (b, s, dr),
        "B1S": (b, 1, s, dr),
        "11S": (1, 1, s, dr),
        "strided": (b, s, 2 * dr),
    }[case.cos]
    angles = torch.rand(shape, device=device, dtype=torch.float64) * 6.3
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    if case.cos == "strided":
        cos, sin = cos[..., ::2], sin[..., ::2]
        assert cos.stride(-1) == 2
    return cos, sin


def _check(case, dtype, device, *, need=(True, True)):
    q_leaf, q_view = _leaf_and_view(case.q, case.b, case.hq, case.s, case.d, dtype, device)
    k_leaf, k_view = _leaf_and_view(case.k, case.b, case.hkv, case.s, case.d, dtype, device)
    q_leaf.requires_grad_(need[0])
    k_leaf.requires_grad_(need[1])
    cos, sin = _cos_sin(case, case.cos_dtype or dtype, device)
    q, k = q_view(q_leaf), k_view(k_leaf)
    q_out, k_out = apply_rotary(q, k, cos, sin, interleaved=case.interleaved)

    leaves64 = [
        t.detach().double().requires_grad_(n) for t, n in ((q_leaf, need[0]), (k_leaf, need[1]))
    ]
    c64, s64 = cos.double(), sin.double()
    want_q = _oracle(q_view(leaves64[0]), c64, s64, case.interleaved)
    want_k = _oracle(k_view(leaves64[1]), c64, s64, case.interleaved)
    rtol, atol = TOL[dtype]
    for out, x, want in ((q_out, q, want_q), (k_out, k, want_k)):
        assert out.shape == x.shape and out.dtype == x.dtype
        # HF's transposed q gives a transposed q_out (the strides HF's own formula gives);
        # an expanded or strided input a contiguous one
        dense = x.is_contiguous() or x.transpose(1, 2).is_contiguous()
        expected = x.stride() if dense else torch.empty(x.shape).stride()
        assert out.stride() == expected
        torch.testing.assert_close(out.double(), want, rtol=rtol, atol=atol)
    if not any(need):
        return
    dq = torch.randn(q_out.shape, device=device).to(dtype)
    dk = torch.randn(k_out.shape, device=device).to(dtype)
    torch.autograd.backward(
        [t for t, n in ((q_out, need[0]), (k_out, need[1])) if n],
        [g for g, n in ((dq, need[0]), (dk, need[1])) if n],
    )
    torch.autograd.backward(
        [t for t, n in ((want_q, need[0]), (want_k, need[1])) if n],
        [g.double() for g, n in ((dq, need[0]), (dk, need[1])) if n],
    )
    for leaf, leaf64 in zip((q_leaf, k_leaf), leaves64):
        if leaf.requires_grad:
            assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == dtype
            torch.testing.assert_close(leaf.grad.double(), leaf64.grad, rtol=rtol, atol=atol)
        else:
            assert leaf.grad is None


@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_float64_fp32(case, device):
    _check(case, torch.float32, device)
    assert fusewise.ops.paths()["apply_rotary"] in ("triton", "triton-interpreter")
    assert fusewise.ops.paths()["apply_rotary.backward"] in ("triton", "triton-interpreter")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", [CASES[2], CASES[6]], ids=str)
def test_half_precision(case, dtype, device):
    _check(case, dtype, device)


@pytest.mark.parametrize("need", [(True, False), (False, True), (False, False)])
def test_only_the_gradients_asked_for(need, device):
    _check(CASES[0], torch.float32, device, need=need)
    g = torch.randn(2, 3, 4, 8, device=device)
    cos = torch.rand(1, 4, 8, device=device)
    dq, dk = rotary_launch.rotary(g, g[:, :1], cos, cos, False, True, *need)
    assert (dq.numel() > 0, dk.numel() > 0) == need


def test_matches_transformers(device):
    """HF's own apply_rotary_pos_emb, on what a Llama attention passes it: q transposed, cos/sin
    [B, S, D] of duplicated halves in q's dtype. fp32: equal up to rounding; bf16: no further from
    float64 than HF's own bf16 result (HF rounds every product, fusewise once)."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    b, s, hq, hkv, d = 2, 6, 4, 2, 32
    positions = torch.arange(s, device=device)[None].expand(b, s) + torch.tensor(
        [[0], [3]], device=device
    )
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device).double() / d))
    freqs = positions.double()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(b, s, hq, d, device=device).to(dtype).transpose(1, 2).requires_grad_()
        k = torch.randn(b, s, hkv, d, device=device).to(dtype).transpose(1, 2).requires_grad_()
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        ours = apply_rotary(q, k, cos, sin)
        q2, k2 = (t.detach().clone().requires_grad_() for t in (q, k))
        theirs = llama.apply_rotary_pos_emb(q2, k2, cos, sin)
        exact = llama.apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double())
        grads = [torch.randn_like(t) for t in ours]
        torch.autograd.backward(ours, grads)
        torch.autograd.backward(theirs, grads)
        for mine, hf, x64 in zip(ours, theirs, exact):
            assert mine.stride() == hf.stride()
            if dtype == torch.float32:
                torch.testing.assert_close(mine, hf, rtol=1e-6, atol=1e-6)
            else:
                # slack: fp32 math may round a near-tie the other way (1e-5 << a bf16 ulp)
                ours_err = (mine.double() - x64).abs().max()
                assert ours_err <= (hf.double() - x64).abs().max() + 1e-5
        for mine, hf in ((q.grad, q2.grad), (k.grad, k2.grad)):
            torch.testing.assert_close(mine, hf, **dict(zip(("rtol", "atol"), TOL[dtype])))


def test_zero_sizes(device):
    q = torch.randn(2, 4, 0, 8, device=device, requires_grad=True)
    k = torch.randn(2, 2, 0, 8, device=device, requires_grad=True)
    cos = torch.empty(0, 8, device=device)
    q_out, k_out = apply_rotary(q, k, cos, cos)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    (q_out.sum() + k_out.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_autograd_keeps_only_cos_and_sin(device):
    q = torch.randn(2, 4, 3, 16, device=device, requires_grad=True)
    k = torch.randn(2, 2, 3, 16, device=device, requires_grad=True)
    cos, sin = torch.rand(2, 3, 16, device=device), torch.rand(2, 3, 16, device=device)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        q_out, k_out = apply_rotary(q, k, cos, sin)
    assert [t.data_ptr() for t in saved] == [cos.data_ptr(), sin.data_ptr()]
    (q_out.sum() + k_out.sum()).backward()


def test_cos_sin_requiring_grad_is_an_error(device):
    q, k = torch.randn(1, 2, 3, 8, device=device), torch.randn(1, 1, 3, 8, device=device)
    cos = torch.rand(3, 8, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="does not differentiate with respect to cos and sin"):
        apply_rotary(q, k, cos, cos.detach())
    with torch.no_grad():  # no gradient asked for: nothing is lost
        apply_rotary(q, k, cos, cos)


def test_errors_name_the_argument(device):
    q, k = torch.randn(2, 4, 3, 8, device=device), torch.randn(2, 2, 3, 8, device=device)
    cos = torch.rand(3, 8, device=device)
    cases = [
        (ValueError, "q must be 4-D", (q[0], k, cos, cos)),
        (ValueError, r"k \[B, Hkv, S, D\] must match q", (q, k[..., :6], cos, cos)),
        (ValueError, r"k \[B, Hkv, S, D\] must match q", (q, k[:1], cos, cos)),
        (TypeError, "k must have q's dtype", (q, k.double(), cos, cos)),
        (TypeError, "q must be a floating-point tensor", (q.long(), k, cos, cos)),
        (TypeError, "sin must be a torch.Tensor", (q, k, cos, 1.0)),
        (ValueError, "cos is on meta", (q, k, cos.to("meta"), cos)),
        (ValueError, "sin must have cos's shape", (q, k, cos, cos[:, :6])),
        (ValueError, "must be even", (q, k, cos[:, :5], cos[:, :5])),
        (
            ValueError,
            "must be even and 2 <= Dr <= D = 8",
            (q, k, cos.repeat(1, 2), cos.repeat(1, 2)),
        ),
        (ValueError, "cos and sin must be", (q, k, cos[:2], cos[:2])),
        (ValueError, "cos and sin must be", (q, k, cos.expand(3, 3, 8), cos.expand(3, 3, 8))),
        # 0-d and 1-D cos: their own message, and no IndexError hiding another argument's
        (ValueError, "cos and sin must be", (q, k, cos[0, 0], cos[0, 0])),
        (ValueError, "cos and sin must be", (q, k, cos[0], cos[0])),
        (ValueError, "q must be 4-D", (q[0], k, cos[0, 0], cos[0, 0])),
        (TypeError, "k must have q's dtype", (q, k.double(), cos[0, 0], cos[0, 0])),
    ]
    for error, message, args in cases:
        with pytest.raises(error, match=message):
            apply_rotary(*args)
    with pytest.raises(ValueError, match="call fusewise.ops.apply_rotary"):
        rotary_op.rotary_fwd(q, k, cos, cos, False)  # the custom op takes cos as [B | 1, S, Dr]


def test_float64_takes_the_reference_with_a_warning(device):
    case = CASES[6]
    q = torch.randn(2, 2, 3, 12, dtype=torch.float64, device=device, requires_grad=True)
    cos, sin = _cos_sin(case, torch.float64, device)
    dq = torch.randn(q.shape, dtype=torch.float64, device=device)
    with pytest.warns(UserWarning, match="running the eager reference"):
        q_out, k_out = apply_rotary(q, q * 2, cos, sin, interleaved=True)
        q_out.backward(dq)  # the backward says so too (once per process)
    assert fusewise.ops.paths()["apply_rotary"] == "reference"
    assert fusewise.ops.paths()["apply_rotary.backward"] == "reference"
    torch.testing.assert_close(q_out, _oracle(q.detach(), cos, sin, True))
    torch.testing.assert_close(k_out, _oracle(q.detach() * 2, cos, sin, True))
    q64 = q.detach().clone().requires_grad_()
    _oracle(q64, cos, sin, True).backward(dq)
    torch.testing.assert_close(q.grad, q64.grad)


def test_compiles_without_graph_breaks(device):
    torch._dynamo.reset()

    def fn(q, k, cos, sin):
        q_out, k_out = apply_rotary(q, k, cos, sin)
        return q_out * 2, k_out

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    q = torch.randn(2, 3, 4, 16, device=device).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 2, 3, 16, device=device, requires_grad=True)
    cos, sin = torch.rand(2, 3, 16, device=device), torch.rand(2, 3, 16, device=device)
    got = compiled(q, k, cos, sin)
    grads = [torch.randn_like(t) for t in got]
    torch.autograd.backward(got, grads)
    q2, k2 = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    want = fn(q2, k2, cos, sin)
    torch.autograd.backward(want, grads)
    for a, b in zip((*got, q.grad, k.grad), (*want, q2.grad, k2.grad)):
        torch.testing.assert_close(a, b)


def test_opcheck_custom_ops(device):
    q = torch.randn(2, 3, 4, 10, device=device).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 2, 3, 10, device=device, requires_grad=True)
    cos, sin = torch.rand(1, 3, 8, device=device), torch.rand(1, 3, 8, device=device)
    torch.library.opcheck(torch.ops.fusewise.rotary_fwd.default, (q, k, cos, sin, False))
    torch.library.opcheck(torch.ops.fusewise.rotary_fwd.default, (q, k, cos, sin, True))
    dq, dk = torch.randn(2, 4, 3, 10, device=device), torch.randn(2, 2, 3, 10, device=device)
    bwd = torch.ops.fusewise.rotary_bwd.default
    torch.library.opcheck(bwd, (dq.transpose(2, 3).mT, dk, cos, sin, False, True, True))
    torch.library.opcheck(bwd, (dq, dk, cos, sin, True, False, True))


def test_cost_model_and_registration():
    b, s, hq, hkv, d = 2, 16, 8, 2, 64
    n, c = b * s * (hq + hkv) * d, s * d
    assert rotary_cost.rotary(n, c, torch.bfloat16).bytes == 2 * n * 2 + 2 * c * 2
    assert rotary_cost.rotary(n, c, torch.bfloat16, torch.float32).bytes == 4 * n + 8 * c
    assert rotary_cost.rotary_fwd_bwd(n, c, torch.float32).bytes == 2 * (8 * n + 8 * c)
    q, k = torch.empty(b, hq, s, d, dtype=torch.bfloat16), torch.empty(b, hkv, s, d).bfloat16()
    cos = torch.empty(1, s, d, dtype=torch.bfloat16)
    fwd = rotary_cost.recorded("fusewise.rotary_fwd.default", [q, k, cos, cos], [q, k])
    assert fwd.bytes == 2 * n * 2 + 2 * c * 2
    only_dq = rotary_cost.recorded(
        "fusewise.rotary_bwd.default", [q, k, cos, cos], [q, k.new_empty(0)]
    )
    assert only_dq.bytes == 2 * q.numel() * 2 + 2 * c * 2
    assert {"fusewise.rotary_fwd.", "fusewise.rotary_bwd."} <= set(fusewise.cost._REGISTERED)


def test_a_recorded_call_is_one_costed_custom_op_each_way(device):
    """Under a TorchDispatchMode (fusewise's op-graph recorder) apply_rotary goes through the
    custom ops, each recorded once with the family's byte model."""
    from fusewise.capture.opgraph import Recorder

    q = torch.randn(2, 3, 4, 16, device=device).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 2, 3, 16, device=device, requires_grad=True)
    cos = torch.rand(3, 16, device=device)
    with Recorder(profile=False) as rec:
        q_out, k_out = apply_rotary(q, k, cos, cos)
        (q_out.sum() + k_out.sum()).backward()
    ops = [op for op in rec.graph.ops if op.name.startswith("fusewise.")]
    assert [op.name for op in ops] == ["fusewise.rotary_fwd.default", "fusewise.rotary_bwd.default"]
    want = rotary_cost.rotary(q.numel() + k.numel(), cos.numel(), torch.float32)
    assert all((op.flops, op.bytes) == (want.flops, want.bytes) for op in ops)


@pytest.mark.gpu
def test_cuda_graph_capture_replays_forward_and_backward():
    from cuda_graphs import replay_matches_eager

    case = Case(2, 64, 8, 2, 128, 128)
    q = torch.randn(2, 64, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(2, 2, 64, 128, device="cuda", dtype=torch.bfloat16)
    q.requires_grad_()
    k.requires_grad_()
    cos, sin = _cos_sin(case, torch.bfloat16, "cuda")
    grads = [torch.randn_like(q), torch.randn_like(k)]

    def step():
        outs = apply_rotary(q, k, cos, sin)
        return (*outs, *torch.autograd.grad(outs, (q, k), grads))

    replay_matches_eager(step, lambda: q.copy_(torch.randn_like(q)))


@pytest.mark.gpu
def test_past_2_31_elements_uses_64_bit_offsets():
    b, hq, hkv, d = 2, 32, 8, 128
    s = (1 << 31) // (b * hq * d) + 4  # q's last rows start past element 2**31
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
    angles = torch.rand(s, d, device="cuda") * 6.3
    cos, sin = angles.cos(), angles.sin()
    q_out, k_out = apply_rotary(q, k, cos, sin)
    tail = slice(s - 4, s)
    for out, x in ((q_out, q), (k_out, k)):
        want = _oracle(x[:, :, tail].double(), cos[tail].double(), sin[tail].double(), False)
        torch.testing.assert_close(out[:, :, tail].double(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("interleaved", [False, True])
def test_second_derivative_matches_float64(interleaved, device):
    """A gradient penalty through the rotary (create_graph=True). Rotary is linear, so its
    backward Rᵀ g differentiates exactly (by R, the forward); once_differentiable refused it.
    The loss is not linear in q_out, so the incoming gradient depends on q and k and the second
    derivative runs through the backward's own backward. q arrives transposed (HF's layout),
    with grouped-query heads and a partial rotary. float32: in bf16 the cube and the square
    amplify the storage rounding past any tolerance that would still catch a wrong formula."""
    dtype = torch.float32
    b, hq, hkv, s, d, dr = 2, 4, 2, 6, 16, 10
    leaves = [torch.randn(b, s, h, d, device=device).to(dtype) for h in (hq, hkv)]
    angles = torch.rand(1, s, dr, device=device, dtype=torch.float64) * 6.3
    weights = [torch.randn(b, h, s, d, device=device, dtype=torch.float64) for h in (hq, hkv)]

    def penalty_grads(rotate, leaves, cast):
        q, k = (leaf.transpose(1, 2) for leaf in leaves)
        q_out, k_out = rotate(q, k, cast(angles.cos()), cast(angles.sin()))
        loss = sum((out.double() ** 3 * w).sum() for out, w in zip((q_out, k_out), weights))
        gq, gk = torch.autograd.grad(loss, leaves, create_graph=True)
        penalty = (gq.double() ** 2).sum() + (gk.double() * gk.double().sin()).sum()
        return torch.autograd.grad(penalty, leaves)

    ours = penalty_grads(
        lambda q, k, c, s: apply_rotary(q, k, c, s, interleaved=interleaved),
        [leaf.requires_grad_() for leaf in leaves],
        lambda t: t.to(dtype),
    )
    want = penalty_grads(
        lambda q, k, c, s: (_oracle(q, c, s, interleaved), _oracle(k, c, s, interleaved)),
        [leaf.detach().double().requires_grad_() for leaf in leaves],
        lambda t: t,
    )
    for got, exact in zip(ours, want):
        assert got.dtype == dtype and got.abs().sum() > 0
        assert (got.double() - exact).abs().max() <= 1e-5 * exact.abs().max()
