"""fusewise.ops.swiglu / geglu: the fused gated activations against float64 torch, forward and both
gradients, over odd shapes, dtypes and layouts; the saved tensors; errors; torch.compile and the
custom ops' registrations. On the CPU the real kernels run under TRITON_INTERPRET=1 (conftest)."""

import pytest
import torch
import torch.nn.functional as F

import fusewise
from fusewise.ops import geglu, swiglu
from fusewise.ops.gated import cost as gated_cost
from fusewise.ops.gated import launch as gated_launch
from fusewise.ops.gated import op as gated_op

# the interpreter's numpy exp overflows to inf in sigmoid's tail (giving the right 0)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

# name -> (the fused op, the float64 oracle)
ACTS = {
    "silu": (swiglu, lambda g, u: F.silu(g) * u),
    "gelu": (lambda g, u: geglu(g, u), lambda g, u: F.gelu(g) * u),
    "gelu_tanh": (
        lambda g, u: geglu(g, u, approximate="tanh"),
        lambda g, u: F.gelu(g, approximate="tanh") * u,
    ),
}
TOL = {  # (rtol, atol) against float64: fp32 math, one rounding to the storage dtype
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1e-2, 1e-2),
    torch.float16: (2e-3, 2e-3),
}


@pytest.fixture(autouse=True)
def poisoned_gated_outputs(monkeypatch):
    """The gated kernels' outputs start as NaN, so an element a kernel never writes fails."""

    def alloc(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(gated_launch, "alloc", alloc)


def _inputs(shape, dtype, device, layout):
    """gate (scaled to reach the activations' tails) and up, in the given layout."""
    if layout == "contiguous":
        g, u = torch.randn(shape, device=device) * 3, torch.randn(shape, device=device)
    elif layout == "strided":  # the two halves of a fused gate_up projection (Phi-3's chunk)
        both = torch.randn(*shape[:-1], 2 * shape[-1], device=device)
        both[..., : shape[-1]] *= 3
        g, u = both.to(dtype).chunk(2, dim=-1)
    elif layout == "transposed":  # unit stride along a leading dim: copied once
        g = torch.randn(*reversed(shape), device=device).mT * 3
        u = torch.randn(*reversed(shape), device=device).mT
    elif layout == "expanded":  # gate broadcast over the rows (stride 0), up along the last dim
        g = (torch.randn(shape[-1], device=device) * 3).expand(shape)
        u = torch.randn(*shape[:-1], 1, device=device).expand(shape)
    g, u = g.to(dtype), u.to(dtype)
    assert layout != "strided" or (g.stride(-2) == 2 * shape[-1] and not g.is_contiguous())
    return g.detach().requires_grad_(), u.detach().requires_grad_()


def _check(act, g, u, *, need=(True, True)):
    fn, oracle = ACTS[act]
    g.requires_grad_(need[0])
    u.requires_grad_(need[1])
    y = fn(g, u)
    assert y.shape == g.shape and y.dtype == g.dtype
    g64 = g.detach().double().requires_grad_(need[0])
    u64 = u.detach().double().requires_grad_(need[1])
    want = oracle(g64, u64)
    rtol, atol = TOL[g.dtype]
    torch.testing.assert_close(y.double(), want, rtol=rtol, atol=atol)
    if not any(need):
        return
    dy = torch.randn(g.shape, device=g.device).to(g.dtype)
    dy = torch.where(dy == 0, torch.ones_like(dy), dy)  # random and non-zero
    y.backward(dy)
    want.backward(dy.double())
    for t, t64 in ((g, g64), (u, u64)):
        if t.requires_grad:
            assert t.grad.shape == t.shape and t.grad.dtype == t.dtype
            torch.testing.assert_close(t.grad.double(), t64.grad, rtol=rtol, atol=atol)
        else:
            assert t.grad is None


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", [(1,), (), (3, 5, 37), (2, 2100), (4, 1)])
def test_matches_float64_fp32(act, shape, device):
    g, u = _inputs(shape, torch.float32, device, "contiguous")
    _check(act, g, u)
    assert fusewise.ops.paths()["swiglu" if act == "silu" else "geglu"] in (
        "triton",
        "triton-interpreter",
    )


@pytest.mark.parametrize("act", ACTS)
def test_tails_and_zero_match_float64(act, device):
    """Gates across both tails of each activation (tanh-GELU's z = k·(g + 0.044715·g³) past
    ±40, where exp(-2|z|) underflows and one sigmoid is 1 and the other is taken as t / (1 + t),
    not 1 - 1) and at 0, where z changes sign, against float64."""
    g = torch.tensor([-60.0, -12.0, -4.0, -1.5, -1e-3, 0.0, 1e-3, 1.5, 4.0, 12.0, 60.0])
    g = torch.cat((g, torch.linspace(-6, 6, 53))).to(device).requires_grad_()
    u = (torch.rand(g.shape, device=device) + 0.5).requires_grad_()
    _check(act, g, u)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("layout", ["strided", "transposed", "expanded"])
def test_any_layout(act, layout, device):
    g, u = _inputs((2, 3, 40), torch.float32, device, layout)
    _check(act, g, u)


@pytest.mark.parametrize("act", ACTS)
def test_bf16(act, device):
    g, u = _inputs((5, 300), torch.bfloat16, device, "contiguous")
    _check(act, g, u)
    g, u = _inputs((3, 70), torch.bfloat16, device, "strided")
    _check(act, g, u)


def test_fp16(device):
    g, u = _inputs((7, 33), torch.float16, device, "contiguous")
    _check("silu", g, u)


@pytest.mark.parametrize("need", [(True, False), (False, True), (False, False)])
def test_only_the_gradients_asked_for(need, device):
    g, u = _inputs((6, 45), torch.float32, device, "strided")
    _check("gelu_tanh", g, u, need=need)
    dg, du = gated_launch.gated_backward(
        torch.ones(6, 45, device=device), g.detach(), u.detach(), "silu", *need
    )
    assert (dg.numel() > 0, du.numel() > 0) == need


def test_zero_elements(device):
    g, u = _inputs((0, 8), torch.float32, device, "contiguous")
    y = swiglu(g, u)
    assert y.shape == (0, 8)
    y.sum().backward()
    assert g.grad.shape == (0, 8) and u.grad.shape == (0, 8)
    assert geglu(torch.empty(3, 0, device=device), torch.empty(3, 0, device=device)).shape == (3, 0)


def test_autograd_keeps_only_gate_and_up(device):
    """The activation is recomputed in backward: nothing of gate's size but gate and up saved."""
    g, u = _inputs((4, 64), torch.float32, device, "contiguous")
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = swiglu(g, u)
    assert len(saved) == 2
    assert {t.data_ptr() for t in saved} == {g.data_ptr(), u.data_ptr()}
    y.sum().backward()


def test_errors_name_the_argument(device):
    g = torch.randn(3, 4, device=device)
    with pytest.raises(ValueError, match="up must have gate's shape"):
        swiglu(g, torch.randn(3, 5, device=device))
    with pytest.raises(TypeError, match="up must have gate's dtype"):
        swiglu(g, torch.randn(3, 4, device=device, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="gate must be a floating-point tensor"):
        swiglu(torch.ones(3, 4, dtype=torch.int64, device=device), g)
    with pytest.raises(TypeError, match="up must be a torch.Tensor"):
        geglu(g, [1.0])
    with pytest.raises(ValueError, match="up is on meta"):
        swiglu(g, torch.empty(3, 4, device="meta"))
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        geglu(g, g, approximate="erf")
    with pytest.raises(ValueError, match="unit stride along N"):
        gated_op.gated_fwd(g.mT, g.mT, "silu")


def test_float64_takes_the_reference_with_a_warning(device):
    g, u = torch.randn(3, 9, dtype=torch.float64, device=device), torch.randn(3, 9).double()
    with pytest.warns(UserWarning, match="running the eager reference"):
        y = swiglu(g, u.to(device))
    torch.testing.assert_close(y, F.silu(g) * u.to(device))
    assert fusewise.ops.paths()["swiglu"] == "reference"


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_compiles_without_graph_breaks(act, device):
    fn, _ = ACTS[act]
    torch._dynamo.reset()
    compiled = torch.compile(lambda g, u: fn(g, u) * 2, fullgraph=True, backend="aot_eager")
    g, u = _inputs((3, 40), torch.float32, device, "strided")
    y = compiled(g, u)
    dy = torch.randn_like(y)
    y.backward(dy)
    g2, u2 = g.detach().clone().requires_grad_(), u.detach().clone().requires_grad_()
    (fn(g2, u2) * 2).backward(dy)
    torch.testing.assert_close(y, fn(g2, u2) * 2)
    torch.testing.assert_close(g.grad, g2.grad)
    torch.testing.assert_close(u.grad, u2.grad)


def test_opcheck_custom_ops(device):
    g = torch.randn(5, 24, device=device, requires_grad=True)
    u = torch.randn(5, 24, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.fusewise.gated_fwd.default, (g, u, "silu"))
    torch.library.opcheck(torch.ops.fusewise.gated_fwd.default, (g, u, "gelu"))
    dy = torch.randn(5, 24, device=device)
    args = (dy, g.detach(), u.detach(), "gelu_tanh")
    torch.library.opcheck(torch.ops.fusewise.gated_bwd.default, (*args, True, True))
    torch.library.opcheck(torch.ops.fusewise.gated_bwd.default, (*args, False, True))


def test_cost_model_and_registration():
    n = 1000
    assert gated_cost.gated(n, torch.bfloat16).bytes == 3 * n * 2
    assert gated_cost.gated(n, torch.bfloat16, backward=True).bytes == 5 * n * 2
    assert gated_cost.gated_fwd_bwd(n, torch.float32).bytes == 8 * n * 4
    g = torch.empty(10, 100, dtype=torch.bfloat16)
    assert gated_cost.recorded("fusewise.gated_fwd.default", [g, g], [g]).bytes == 3 * n * 2
    bwd = gated_cost.recorded("fusewise.gated_bwd.default", [g, g, g], [g, g])
    assert bwd.bytes == 5 * n * 2
    assert {"fusewise.gated_fwd.", "fusewise.gated_bwd."} <= set(fusewise.cost._REGISTERED)


@pytest.mark.parametrize("act", sorted(ACTS))
def test_create_graph_is_a_clear_error_not_a_dropped_term(act, device):
    """A gradient penalty: the incoming gradient (of y.sum()) does not require grad, so torch's
    once_differentiable let the backward return gradients without a graph, and the penalty's
    terms through the op were silently lost. It must refuse instead."""
    fused, _ = ACTS[act]
    g = torch.randn(4, 16, device=device, requires_grad=True)
    u = torch.randn(4, 16, device=device, requires_grad=True)
    y = fused(g, u)
    name = "swiglu" if act == "silu" else "geglu"
    with pytest.raises(RuntimeError, match=rf"fusewise.ops.{name} has no second derivative"):
        torch.autograd.grad(y.sum(), g, create_graph=True)
    (dg,) = torch.autograd.grad(fused(g, u).sum(), g)  # without create_graph: as before
    assert not dg.requires_grad
