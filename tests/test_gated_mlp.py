"""The patched HF gated MLP's down projection (ops/gated/down.py through patch/hf_mlp.py): the
product recomputed in the backward and gate/up overwritten by their gradients, against float64
and the unpatched model; what autograd keeps; when it falls back to swiglu + down_proj; the
launcher's out= buffers. On the CPU the kernels run under TRITON_INTERPRET=1 (conftest)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hf_tiny import causal_lm

import fusewise
from fusewise.ops.gated import launch as gated_launch
from fusewise.patch import SWAPPED

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
FP32 = dict(atol=1e-5, rtol=1e-4)
ACT = {"silu": F.silu, "gelu_tanh": lambda g: F.gelu(g, approximate="tanh")}
# family -> act: SEPARATE silu, GATE_UP silu, SEPARATE gelu_tanh; tokens 2 x 5, hidden 32,
# intermediate 64 (hf_tiny)
FAMILIES = {"llama": "silu", "phi3": "silu", "gemma": "gelu_tanh"}
WIDE = 2 * 5 * 64  # elements of a [tokens, intermediate] tensor


@pytest.fixture(autouse=True)
def poisoned_gated_outputs(monkeypatch):
    """Buffers the gated launcher allocates start as NaN: an element never written fails."""

    def alloc(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(gated_launch, "alloc", alloc)


def _mlp(family, device, dtype=torch.float32, **config):
    torch.manual_seed(0)
    return causal_lm(family, **config).model.layers[0].mlp.to(device, dtype)


def _patched(mlp):
    patched = copy.deepcopy(mlp)
    (change,) = fusewise.patch(patched, norms=False, loss=False, rotary=False)
    assert change.action == SWAPPED
    return patched, change


def _projections(mlp, x):
    """gate, up as the MLP's input projections compute them."""
    if hasattr(mlp, "gate_up_proj"):
        return mlp.gate_up_proj(x).chunk(2, dim=-1)
    return mlp.gate_proj(x), mlp.up_proj(x)


def _float64_reference(mlp, x, dy, act):
    """(y, dx, {parameter: grad}, dgate, dup) in float64, by autograd over torch ops."""
    m = copy.deepcopy(mlp).double()
    x64 = x.detach().double().requires_grad_()
    gate, up = _projections(m, x64)
    gate.retain_grad()
    up.retain_grad()
    y = m.down_proj(ACT[act](gate) * up)
    y.backward(dy.double())
    grads = {n: p.grad for n, p in m.named_parameters()}
    return y, x64.grad, grads, gate.grad, up.grad


def _run(mlp, x, dy, retain=False):
    """(y, dx, {parameter: grad}, the saved [tokens, intermediate] tensors by data_ptr)."""
    saved = {}

    def pack(t):
        if t.numel() == WIDE:  # detached: Phi-3's halves are views autograd would guard
            saved.setdefault(t.data_ptr(), t.detach())
        return t

    x = x.detach().requires_grad_()
    mlp.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = mlp(x)
    y.backward(dy, retain_graph=retain)
    grads = {n: p.grad for n, p in mlp.named_parameters() if p.grad is not None}
    return y, x.grad, grads, saved


def _inputs(mlp, device):
    hidden = mlp.down_proj.weight.shape[0]
    dtype = mlp.down_proj.weight.dtype
    x = torch.randn(2, 5, hidden, device=device).to(dtype)
    dy = torch.randn(2, 5, hidden, device=device).to(dtype)
    return x, dy


@pytest.mark.parametrize(
    "family, bias", [("llama", False), ("llama", True), ("phi3", False), ("gemma", False)]
)
def test_fp32_matches_float64_and_unpatched_overwriting_gate_and_up(family, bias, device):
    """Fused: autograd keeps exactly gate and up (no product), and after the backward they hold
    dgate and dup (float64 autograd's): written in place, not into new buffers. Bias: Llama's
    mlp_bias (the only config of the three that has it)."""
    config = {"mlp_bias": True} if bias else {}
    mlp = _mlp(family, device, **config)
    patched, change = _patched(mlp)
    assert "product recomputed in the backward" in change.reason
    x, dy = _inputs(mlp, device)
    y, dx, grads, saved = _run(patched, x, dy)
    y_ref, dx_ref, grads_ref, _ = _run(mlp, x, dy)
    y64, dx64, grads64, dgate64, dup64 = _float64_reference(mlp, x, dy, FAMILIES[family])
    torch.testing.assert_close(y, y_ref, **FP32)
    torch.testing.assert_close(y.double(), y64, **FP32)
    torch.testing.assert_close(dx, dx_ref, **FP32)
    torch.testing.assert_close(dx.double(), dx64, **FP32)
    assert grads.keys() == grads_ref.keys() == grads64.keys()
    assert ("down_proj.bias" in grads) == bias
    for name in grads:
        torch.testing.assert_close(grads[name], grads_ref[name], **FP32, msg=name)
        torch.testing.assert_close(grads[name].double(), grads64[name], **FP32, msg=name)
    gate, up = saved.values()  # two [tokens, I] tensors saved, the product not among them
    torch.testing.assert_close(gate.double(), dgate64.reshape(gate.shape), **FP32)
    torch.testing.assert_close(up.double(), dup64.reshape(up.shape), **FP32)


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_error_no_larger_than_unpatched(family, device):
    """bf16 against float64: the patched MLP's error within the unpatched one's plus a slack
    (HF rounds act(gate) to bf16 before the product, the fused op does not)."""
    mlp = _mlp(family, device, torch.bfloat16)
    patched, _ = _patched(mlp)
    x, dy = _inputs(mlp, device)
    got = _run(patched, x, dy)
    hf = _run(mlp, x, dy)
    want = _float64_reference(mlp, x, dy, FAMILIES[family])
    pairs = [(got[0], hf[0], want[0]), (got[1], hf[1], want[1])]
    pairs += [(got[2][n], hf[2][n], want[2][n]) for n in want[2]]
    for ours, theirs, exact in pairs:
        err = (ours.double() - exact).abs().max().item()
        err_hf = (theirs.double() - exact).abs().max().item()
        assert err <= 2 * err_hf + 1e-2 * exact.abs().max().item(), (err, err_hf)


@pytest.mark.parametrize("hooks", [False, True])
def test_retain_graph_second_backward_raises_and_says_why(hooks, device):
    """gate and up hold their gradients after the first backward. A saved-tensor hook that packs
    by reference skips autograd's version check: the second backward then read gradients as
    activations and returned wrong gradients without a word. It must refuse either way."""
    mlp, _ = _patched(_mlp("llama", device))
    x, dy = _inputs(mlp, device)
    x.requires_grad_()
    if hooks:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            y = mlp(x)
    else:
        y = mlp(x)
    y.backward(dy, retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward through it"):
        y.backward(dy)


def test_retain_graph_twice_runs_when_nothing_was_overwritten(device):
    """Only down_proj trains and x needs no gradient: gate and up get no gradient, nothing is
    written over them, and a retained graph's second backward must run (the first version of
    the flag refused it)."""
    mlp = _mlp("llama", device)
    patched, _ = _patched(mlp)
    x, dy = _inputs(mlp, device)
    grads = []
    for m in (patched, mlp):
        for name, p in m.named_parameters():
            p.requires_grad_(name.startswith("down_proj"))
        m.zero_grad(set_to_none=True)
        y = m(x)
        y.backward(dy, retain_graph=True)
        y.backward(dy)
        grads.append(m.down_proj.weight.grad)
    torch.testing.assert_close(grads[0], grads[1], **FP32)


def test_create_graph_through_the_fused_mlp_is_a_clear_error(device):
    mlp, _ = _patched(_mlp("llama", device))
    x, _ = _inputs(mlp, device)
    y = mlp(x.requires_grad_())
    with pytest.raises(RuntimeError, match="fusewise.ops.swiglu has no second derivative"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_hook_on_an_input_projection_keeps_gate_and_up(family, device):
    """A forward hook that keeps the projection's output: the product is still recomputed, but
    gate/up are not overwritten (the hook's tensor keeps its values), and a retained graph runs
    twice."""
    mlp = _mlp(family, device)
    patched, _ = _patched(mlp)
    kept = []
    proj = patched.gate_up_proj if family == "phi3" else patched.gate_proj
    proj.register_forward_hook(lambda m, args, out: kept.append(out))
    x, dy = _inputs(mlp, device)
    y, dx, grads, saved = _run(patched, x, dy, retain=True)
    assert len(saved) == 2  # still gate and up only
    want = _run(mlp, x, dy)
    for name in grads:
        torch.testing.assert_close(grads[name], want[2][name], **FP32, msg=name)
    gate = _projections(mlp, x)[0]
    torch.testing.assert_close(kept[0][..., : gate.shape[-1]], gate, rtol=0, atol=0)
    first = {n: g.clone() for n, g in grads.items()}
    y.backward(dy)  # the retained graph is intact
    for name, g in patched.named_parameters():
        torch.testing.assert_close(g.grad, 2 * first[name], **FP32, msg=name)


class LoraLike(torch.nn.Linear):
    """A subclass of nn.Linear whose forward adds a low-rank term (what peft's layers do)."""

    def __init__(self, base: torch.nn.Linear):
        super().__init__(base.in_features, base.out_features, bias=False)
        self.weight = base.weight
        like = dict(device=base.weight.device, dtype=base.weight.dtype)  # the test's device
        self.a = torch.nn.Parameter(torch.randn(3, base.in_features, **like) * 0.1)
        self.b = torch.nn.Parameter(torch.randn(base.out_features, 3, **like) * 0.1)

    def forward(self, x):
        return super().forward(x) + F.linear(F.linear(x, self.a), self.b)


def _hook_on_down(mlp):
    mlp.down_proj.register_forward_hook(lambda m, args, out: None)


def _pre_hook_on_down(mlp):
    mlp.down_proj.register_forward_pre_hook(lambda m, args: None)


def _lora_down(mlp):
    mlp.down_proj = LoraLike(mlp.down_proj)


@pytest.mark.parametrize("change", [_hook_on_down, _pre_hook_on_down, _lora_down, "global"])
def test_down_proj_not_plain_falls_back_and_matches(change, device):
    """Hooks (its own or global) or a subclass of nn.Linear: swiglu then down_proj, which keeps
    the product (three [tokens, I] tensors saved), and the same gradients."""
    mlp = _mlp("llama", device)
    handle = None
    if change == "global":
        handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
    else:
        change(mlp)
    try:
        patched, report = _patched(mlp)
        lora = change is _lora_down
        assert ("not exactly torch.nn.Linear" in report.reason) == lora
        x, dy = _inputs(mlp, device)
        y, dx, grads, saved = _run(patched, x, dy)
        want = _run(mlp, x, dy)
    finally:
        if handle is not None:
            handle.remove()
    assert len(saved) == 3
    torch.testing.assert_close(y, want[0], **FP32)
    torch.testing.assert_close(dx, want[1], **FP32)
    assert grads.keys() == want[2].keys()
    for name in grads:
        torch.testing.assert_close(grads[name], want[2][name], **FP32, msg=name)


def test_autocast_to_bf16_over_fp32_weights_falls_back_and_matches(device):
    """Under autocast the projections give bf16 while down_proj's weight is fp32: the product
    and down_proj's own call (which autocast runs in bf16), saved as HF's is, same results."""
    mlp = _mlp("llama", device)
    patched, _ = _patched(mlp)
    x, dy = _inputs(mlp, device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        y, dx, grads, saved = _run(patched, x, dy.bfloat16())
        want = _run(mlp, x, dy.bfloat16())
    assert y.dtype == want[0].dtype == torch.bfloat16
    assert len(saved) == 3  # gate, up and the product (down_proj's)
    torch.testing.assert_close(y, want[0], atol=2e-2, rtol=2e-2)
    for name in grads:
        torch.testing.assert_close(grads[name], want[2][name], atol=2e-2, rtol=2e-2, msg=name)


def test_frozen_parameters_get_no_gradient(device):
    """needs_input_grad: with x and gate_proj frozen dgate is not needed, with down_proj's weight
    frozen dweight neither; the gradients asked for still match."""
    mlp = _mlp("llama", device, mlp_bias=True)
    patched, _ = _patched(mlp)
    x, dy = _inputs(mlp, device)
    grads = []
    for m in (patched, mlp):
        m.down_proj.weight.requires_grad_(False)
        m.gate_proj.requires_grad_(False)
        m(x).backward(dy)
        grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
    want = {"up_proj.weight", "up_proj.bias", "down_proj.bias"}
    assert grads[0].keys() == grads[1].keys() == want
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], **FP32, msg=name)


def test_compiled_patched_mlp_keeps_the_custom_op_path(device):
    """Under torch.compile the patched MLP keeps swiglu's custom op + down_proj (no graph
    break) and matches."""
    mlp = _mlp("llama", device)
    patched, _ = _patched(mlp)
    torch._dynamo.reset()
    compiled = torch.compile(patched, backend="aot_eager", fullgraph=True)
    x, dy = _inputs(mlp, device)
    outs = []
    for m in (compiled, mlp):
        xg = x.clone().requires_grad_()
        y = m(xg)
        y.backward(dy)
        outs.append((y, xg.grad, {n: p.grad for n, p in m.named_parameters()}))
    torch._dynamo.reset()
    (y, dx, grads), (y_ref, dx_ref, grads_ref) = outs
    torch.testing.assert_close(y, y_ref, **FP32)
    torch.testing.assert_close(dx, dx_ref, **FP32)
    assert {n.removeprefix("_orig_mod.") for n in grads} == grads_ref.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_ref[name.removeprefix("_orig_mod.")], **FP32)


@pytest.mark.parametrize("layout", ["flat", "halves"])
def test_launcher_out_buffers_over_the_inputs(layout, device):
    """out=(gate, up): the same gradients as new buffers, written into gate and up themselves
    (Phi-3's halves: row stride 2·N)."""
    both = torch.randn(7, 2 * 45, device=device)
    if layout == "halves":
        gate, up = both.chunk(2, dim=-1)
    else:
        gate, up = both[:, :45].contiguous(), both[:, 45:].contiguous()
    dy = torch.randn(7, 45, device=device)
    want = gated_launch.gated_backward(dy, gate, up, "gelu")
    g_ptr, u_ptr = gate.data_ptr(), up.data_ptr()
    dg, du = gated_launch.gated_backward(dy, gate, up, "gelu", out=(gate, up))
    assert (dg.data_ptr(), du.data_ptr()) == (g_ptr, u_ptr)
    torch.testing.assert_close(gate, want[0], rtol=0, atol=0)
    torch.testing.assert_close(up, want[1], rtol=0, atol=0)
    with pytest.raises(ValueError, match="non-overlapping rows"):
        gated_launch.gated_backward(dy, gate, up, "silu", out=(gate[:1].expand(7, 45), up))
