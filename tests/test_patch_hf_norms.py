"""fusewise.patch on Hugging Face models: their norm classes swapped per instance for
fusewise.ops.rms_norm (hf_norms.py, table in hf_norm_specs.py), each swap checked on a probe."""

from __future__ import annotations

import copy
import importlib
import inspect
import pickle
import re

import pytest
import torch
from hf_tiny import CAUSAL_LM, causal_lm, layer_norm_models
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import fusewise
from fusewise.patch import LEFT_ALONE, SWAPPED, UNRECOGNISED, _swap, hf_norms
from fusewise.patch import hf_norm_specs as specs

LLAMA_PATH = "transformers.models.llama.modeling_llama.LlamaRMSNorm"
FP32 = dict(atol=1e-5, rtol=1e-4)


def _bf16_ulp(t: torch.Tensor) -> torch.Tensor:
    """One bf16 ulp at each element of t (the spacing of bf16 numbers there)."""
    exp = torch.floor(torch.log2(t.float().abs().clamp_min(2.0**-126)))
    return torch.exp2(exp - 7)


def _randomize_norm_weights(model: torch.nn.Module) -> None:
    """Norm weights start as ones (zeros for Gemma): perturb them so the tests see them used."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() and p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device))


def _norm_names(model: torch.nn.Module, cls_name_end: str) -> list[str]:
    return [n for n, m in model.named_modules() if type(m).__name__.endswith(cls_name_end)]


def _run(model, inputs):
    model.zero_grad()
    out = model(**inputs)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def _compare(patched, ref, inputs, logits="logits"):
    out, grads = _run(patched, inputs)
    want, want_grads = _run(ref, inputs)
    torch.testing.assert_close(getattr(out, logits), getattr(want, logits), **FP32)
    torch.testing.assert_close(out.loss, want.loss, **FP32)
    assert grads.keys() == want_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], want_grads[name], **FP32, msg=name)


def _ids(device, vocab=128, shape=(2, 8)):
    return torch.randint(3, vocab, shape, device=device)


# --- the table against the installed transformers ----------------------------------------------

# The three forwards (with the _norm they call), as read in transformers 5.17.0, normalised by
# _source(): comments, annotations and whitespace dropped.
REFERENCE = {
    specs.LLAMA_ORDER: "def forward(self, hidden_states): input_dtype = hidden_states.dtype "
    "hidden_states = hidden_states.to(torch.float32) variance = hidden_states.pow(2).mean(-1, "
    "keepdim=True) hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon) "
    "return self.weight * hidden_states.to(input_dtype)",
    specs.OLMO2_ORDER: "def forward(self, hidden_states): input_dtype = hidden_states.dtype "
    "hidden_states = hidden_states.to(torch.float32) variance = hidden_states.pow(2).mean(-1, "
    "keepdim=True) hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon) "
    "return (self.weight * hidden_states).to(input_dtype)",
    specs.GEMMA_ORDER: "def forward(self, x): output = self._norm(x.float()) output = output * "
    "(1.0 + self.weight.float()) return output.type_as(x) def _norm(self, x): return x * "
    "torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)",
}


def _source(cls: type) -> str:
    text = inspect.getsource(cls.forward)
    if "_norm" in vars(cls):
        text += inspect.getsource(cls._norm)
    text = re.sub(r"#.*", "", text)
    text = re.sub(r"\s*->\s*torch\.Tensor", "", text)
    text = re.sub(r":\s*torch\.Tensor", "", text)
    return re.sub(r"\s+", " ", text).strip()


def _table_class(key):
    module, name = key
    return getattr(importlib.import_module(module), name)


def _bare_norm(cls, spec, n=48, weight_dtype=torch.float32):
    """An instance of cls without its constructor (their signatures differ): weight + eps."""
    m = cls.__new__(cls)
    torch.nn.Module.__init__(m)
    gen = torch.Generator().manual_seed(2)
    w = (spec.offset == 0) + 0.5 * torch.randn(n, generator=gen)
    m.weight = torch.nn.Parameter(w.to(weight_dtype))
    setattr(m, spec.eps_attr, 1e-5)
    return m


@pytest.mark.parametrize("key", sorted(specs.SPECS), ids=lambda k: k[1])
def test_table_class_forward_is_its_orders_and_patches(key, device):
    """Each table class's installed forward is its order's, token for token; an instance swaps,
    and on bf16 input matches the HF forward (fp32 and bf16 weights) in dtype and value."""
    spec = specs.SPECS[key]
    cls = _table_class(key)
    assert _source(cls) == REFERENCE[spec.order]
    assert spec.eps_attr in _source(cls)
    for weight_dtype in (torch.float32, torch.bfloat16):
        norm = _bare_norm(cls, spec, weight_dtype=weight_dtype).to(device)
        x = torch.randn(3, 5, 48, dtype=torch.bfloat16, device=device)
        want = norm(x)
        (change,) = fusewise.patch(torch.nn.ModuleDict({"n": norm}))
        assert (change.action, change.was, change.now) == (
            SWAPPED,
            _swap.qualname(cls),
            hf_norms.NOW,
        )
        assert isinstance(norm, cls) and type(norm) is not cls
        got = norm(x)
        assert got.dtype == want.dtype
        assert ((got.float() - want.float()).abs() <= _bf16_ulp(want)).all()


# --- whole models -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(CAUSAL_LM))
def test_causal_lm_norms_swapped_outputs_and_gradients_match(family, device):
    model = causal_lm(family).to(device)
    _randomize_norm_weights(model)
    ref = copy.deepcopy(model)
    expected = _norm_names(ref, "RMSNorm")
    assert expected
    norm_cls = type(dict(ref.named_modules())[expected[0]])
    report = fusewise.patch(model, loss=False, activations=False, rotary=False)
    assert [c.name for c in report] == expected  # every norm, nothing else
    assert all(c.action == SWAPPED and c.now == hf_norms.NOW for c in report)
    assert {c.was for c in report} == {_swap.qualname(norm_cls)}
    assert norm_cls.__module__ == f"transformers.models.{family}.modeling_{family}"
    ids = _ids(device)
    _compare(model, ref, dict(input_ids=ids, labels=ids))


@pytest.mark.parametrize("family", ["gpt2", "bert", "vit"])
def test_layer_norm_models_swap_to_fusewise_layer_norm(family, device):
    model = layer_norm_models()[family].to(device).eval()  # dropout off: the same computation twice
    _randomize_norm_weights(model)
    ref = copy.deepcopy(model)
    expected = [n for n, m in ref.named_modules() if type(m) is torch.nn.LayerNorm]
    assert expected
    report = fusewise.patch(model, loss=False)
    assert [c.name for c in report] == expected
    assert {(c.action, c.was, c.now) for c in report} == {
        (SWAPPED, "torch.nn.modules.normalization.LayerNorm", "fusewise.nn.LayerNorm")
    }
    if family == "vit":
        pixels = torch.randn(2, 3, 16, 16, device=device)
        out, want = model(pixel_values=pixels), ref(pixel_values=pixels)
        torch.testing.assert_close(out.last_hidden_state, want.last_hidden_state, **FP32)
        (out.last_hidden_state**2).mean().backward()
        (want.last_hidden_state**2).mean().backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **FP32, msg=name)
    else:
        ids = _ids(device)
        _compare(model, ref, dict(input_ids=ids, labels=ids))


# --- dtypes -------------------------------------------------------------------------------------


def test_llama_norm_bf16_input_follows_hf_cast_order(device):
    x = torch.randn(4, 7, 64, dtype=torch.bfloat16, device=device)
    # fp32 weight: HF returns fp32, weight * x_hat rounded to bf16; the fused path computes that
    norm = LlamaRMSNorm(64, eps=1e-5).to(device)
    _randomize_norm_weights(torch.nn.ModuleDict({"norm": norm}))
    want = norm(x)
    assert fusewise.patch(norm)[0].action == SWAPPED
    got = norm(x)
    assert got.dtype == want.dtype == torch.float32
    if device.type == "cpu":
        assert torch.equal(got, want)
    else:  # x_hat's fp32 sum may round differently on the GPU: a bf16 ulp of x_hat, rarely
        x_hat = want / norm.weight
        assert (got == want).float().mean() > 0.99
        assert ((got - want).abs() <= norm.weight.abs() * _bf16_ulp(x_hat)).all()
    # bf16 weight: bf16 out; HF rounds twice (x_hat, product), fused once: within 1 ulp
    norm16 = LlamaRMSNorm(64, eps=1e-5)
    _randomize_norm_weights(torch.nn.ModuleDict({"norm": norm16}))
    norm16.to(device, torch.bfloat16)
    want = norm16(x)
    fusewise.patch(norm16)
    got = norm16(x)
    assert got.dtype == want.dtype == torch.bfloat16
    assert ((got.float() - want.float()).abs() <= _bf16_ulp(want)).all()
    assert not torch.equal(got, want)  # the one-rounding path is the one taken


def test_gemma_norm_bf16_and_weight_gradient(device):
    norm = GemmaRMSNorm(64, eps=1e-6).to(device)
    _randomize_norm_weights(torch.nn.ModuleDict({"norm": norm}))
    ref = copy.deepcopy(norm)
    fusewise.patch(norm)
    x = torch.randn(4, 7, 64, dtype=torch.bfloat16, device=device)
    got, want = norm(x), ref(x)
    assert got.dtype == want.dtype == torch.bfloat16
    assert ((got.float() - want.float()).abs() <= _bf16_ulp(want)).all()
    x32 = torch.randn(4, 7, 64, device=device, requires_grad=True)
    dy = torch.randn(4, 7, 64, device=device)
    g = torch.autograd.grad(norm(x32), (x32, norm.weight), dy)
    w = torch.autograd.grad(ref(x32), (x32, ref.weight), dy)
    for a, b in zip(g, w):
        torch.testing.assert_close(a, b, **FP32)


# --- recognition: not recognised, left alone -----------------------------------------------------


class MyRMSNorm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class ScaledLlamaNorm(LlamaRMSNorm):
    def forward(self, x):
        return super().forward(x) * 2


class OwnNormGemma(GemmaRMSNorm):
    def _norm(self, x):
        return x / x.abs().max()


class PlainLlamaNorm(LlamaRMSNorm):
    def extra_repr(self):
        return "plain " + super().extra_repr()


def test_unknown_norms_reported_untouched_and_fusewise_ones_skipped():
    model = torch.nn.ModuleDict(
        {
            "mine": MyRMSNorm(16),
            "group": torch.nn.GroupNorm(2, 16),
            "batch": torch.nn.BatchNorm1d(16),
            "fused": fusewise.nn.RMSNorm(16),  # already fusewise's: not reported
            "llama": LlamaRMSNorm(16),
            "linear": torch.nn.Linear(16, 16),
        }
    )
    report = fusewise.patch(model)
    by_name = {c.name: c for c in report}
    assert list(by_name) == ["mine", "group", "batch", "llama"]
    for name, path in [
        ("mine", "test_patch_hf_norms.MyRMSNorm"),
        ("group", "torch.nn.modules.normalization.GroupNorm"),
        ("batch", "torch.nn.modules.batchnorm.BatchNorm1d"),
    ]:
        c = by_name[name]
        assert (c.action, c.was, c.now) == (UNRECOGNISED, path, None)
        assert c.reason == "no rule for this class; left as it is"
        assert not _swap.is_patched(model[name])
    assert type(model["mine"]) is MyRMSNorm and type(model["batch"]) is torch.nn.BatchNorm1d
    assert by_name["llama"].action == SWAPPED


def test_subclasses_with_their_own_code_are_left_alone_plain_ones_swapped():
    model = torch.nn.ModuleDict(
        {"scaled": ScaledLlamaNorm(16), "gemma": OwnNormGemma(16), "plain": PlainLlamaNorm(16)}
    )
    x = torch.randn(2, 16)
    before = {k: m(x) for k, m in model.items()}
    scaled, gemma, plain = fusewise.patch(model)
    assert (scaled.action, scaled.now) == (LEFT_ALONE, None)
    assert "test_patch_hf_norms.ScaledLlamaNorm.forward" in scaled.reason
    assert (gemma.action, gemma.now) == (LEFT_ALONE, None)
    assert "test_patch_hf_norms.OwnNormGemma._norm" in gemma.reason
    assert type(model["scaled"]) is ScaledLlamaNorm and type(model["gemma"]) is OwnNormGemma
    assert (plain.action, plain.was) == (SWAPPED, "test_patch_hf_norms.PlainLlamaNorm")
    assert "still a test_patch_hf_norms.PlainLlamaNorm" in plain.reason
    assert isinstance(model["plain"], PlainLlamaNorm) and "plain" in repr(model["plain"])
    assert type(model["plain"]).__name__ == "PlainLlamaNorm"
    for k, m in model.items():
        torch.testing.assert_close(m(x), before[k], **FP32)


def test_forward_set_on_the_instance_is_left_alone():
    norm = LlamaRMSNorm(16)
    norm.forward = lambda x: x
    (change,) = fusewise.patch(norm)
    assert change.action == LEFT_ALONE and "set on the instance" in change.reason
    assert type(norm) is LlamaRMSNorm


# --- the probe ----------------------------------------------------------------------------------


def _assert_restored(norm, cls=LlamaRMSNorm):
    assert type(norm) is cls and not _swap.is_patched(norm)
    assert hf_norms.SPEC_ATTR not in vars(norm)


def test_probe_mismatch_from_a_wrong_table_entry_is_left_alone(monkeypatch):
    wrong = specs.NormSpec("variance_epsilon", 1, specs.LLAMA_ORDER)  # an offset Llama lacks
    monkeypatch.setitem(
        hf_norms.SPECS, ("transformers.models.llama.modeling_llama", "LlamaRMSNorm"), wrong
    )
    norm = LlamaRMSNorm(16)
    (change,) = fusewise.patch(norm)
    assert (change.action, change.was, change.now) == (LEFT_ALONE, LLAMA_PATH, None)
    assert "differs from the original on a probe input: max |difference|" in change.reason
    assert "left as it is" in change.reason
    _assert_restored(norm)


def test_probe_mismatch_from_a_changed_hf_forward_is_left_alone(monkeypatch):
    """A transformers version whose LlamaRMSNorm no longer computes what the table says."""
    hf_forward = LlamaRMSNorm.forward
    monkeypatch.setattr(LlamaRMSNorm, "forward", lambda self, x: hf_forward(self, x) + 0.01)
    norm = LlamaRMSNorm(16)
    (change,) = fusewise.patch(norm)
    assert change.action == LEFT_ALONE and "max |difference| 0.01" in change.reason
    _assert_restored(norm)


def test_probe_that_raises_is_left_alone():
    norm = LlamaRMSNorm(16)
    norm.variance_epsilon = -1.0  # HF takes it (NaN), the fused op refuses it
    (change,) = fusewise.patch(norm)
    assert change.action == LEFT_ALONE and "could not be probed (ValueError" in change.reason
    _assert_restored(norm)


def test_meta_parameters_left_alone_until_loaded():
    with torch.device("meta"):
        norm = LlamaRMSNorm(16)
    (change,) = fusewise.patch(norm)
    assert change.action == LEFT_ALONE and "meta device" in change.reason
    assert "again after the weights are loaded" in change.reason
    _assert_restored(norm)
    norm.to_empty(device="cpu")
    with torch.no_grad():
        norm.weight.fill_(1.5)
    assert fusewise.patch(norm)[0].action == SWAPPED


def test_probe_leaves_global_rng_and_grad_mode_alone():
    model = causal_lm("llama")
    state = torch.get_rng_state()
    fusewise.patch(model, loss=False)
    assert torch.equal(torch.get_rng_state(), state) and torch.is_grad_enabled()


# --- per instance, unpatch, copies, compile ------------------------------------------------------


def test_per_instance_the_transformers_class_is_untouched():
    forward, attrs = LlamaRMSNorm.forward, dict(vars(LlamaRMSNorm))
    patched = causal_lm("llama")
    fusewise.patch(patched, loss=False)
    other = causal_lm("llama")
    assert LlamaRMSNorm.forward is forward and dict(vars(LlamaRMSNorm)) == attrs
    assert all(type(other.model.layers[i].input_layernorm) is LlamaRMSNorm for i in range(2))
    assert type(other.model.norm) is LlamaRMSNorm and not _swap.is_patched(other.model.norm)
    assert type(patched.model.norm) is not LlamaRMSNorm
    assert isinstance(patched.model.norm, LlamaRMSNorm)


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_unpatch_restores_classes_and_bit_identical_outputs(family, device):
    model = causal_lm(family).to(device)
    _randomize_norm_weights(model)
    ref = copy.deepcopy(model)
    n = len(fusewise.patch(model, loss=False).swapped)
    assert fusewise.unpatch(model) == n
    assert [type(m) for m in model.modules()] == [type(m) for m in ref.modules()]
    assert not any(_swap.is_patched(m) for m in model.modules())
    ids = _ids(device)
    assert torch.equal(model(input_ids=ids).logits, ref(input_ids=ids).logits)


def test_patched_model_pickles_and_deepcopies(device):
    model = causal_lm("gemma").to(device)
    _randomize_norm_weights(model)
    fusewise.patch(model, loss=False, activations=False, rotary=False)
    ids = _ids(device)
    want = model(input_ids=ids).logits
    for twin in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert [type(m) for m in twin.modules()] == [type(m) for m in model.modules()]
        assert vars(twin.model.norm)[hf_norms.SPEC_ATTR] == specs.GEMMA
        assert torch.equal(twin(input_ids=ids).logits, want)
        assert fusewise.unpatch(twin) == 5
        assert type(twin.model.norm) is GemmaRMSNorm


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_compiled_decoder_layer_has_no_graph_break_and_matches_eager(family, device):
    model = causal_lm(family).to(device)
    _randomize_norm_weights(model)
    fusewise.patch(model, loss=False)
    layer = model.model.layers[0]
    hidden = torch.randn(2, 8, 32, device=device, requires_grad=True)
    position_ids = torch.arange(8, device=device).expand(2, 8)
    rope = model.model.rotary_emb(hidden, position_ids=position_ids)
    kw = dict(position_ids=position_ids, position_embeddings=rope)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    out = compiled(hidden, **kw)
    out = out[0] if isinstance(out, tuple) else out
    (g,) = torch.autograd.grad(out.sum(), hidden)
    want = layer(hidden, **kw)
    want = want[0] if isinstance(want, tuple) else want
    (g_want,) = torch.autograd.grad(want.sum(), hidden)
    assert len(graphs) == 1 and graphs[0].count("fusewise.norm_fwd") == 2  # both norms fused
    torch.testing.assert_close(out, want, **FP32)
    torch.testing.assert_close(g, g_want, **FP32)
