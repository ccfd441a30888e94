"""fusewise.patch on Hugging Face models: their gated MLPs swapped per instance so that act(gate) *
up runs in fusewise.ops.swiglu / geglu (hf_mlp.py), each swap checked on a probe."""

from __future__ import annotations

import copy
import importlib
import inspect
import re

import pytest
import torch
from hf_tiny import causal_lm
from transformers.models.llama.modeling_llama import LlamaMLP

import fusewise
from fusewise.ops import _dispatch
from fusewise.patch import LEFT_ALONE, SWAPPED, _swap, hf_mlp

FP32 = dict(atol=1e-5, rtol=1e-4)
# the interpreter's numpy exp overflows to inf in sigmoid's tail (giving the right 0)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


def _run(model, ids):
    model.zero_grad()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _mlp_names(model) -> list[str]:
    return [n for n, m in model.named_modules() if type(m).__name__.endswith("MLP")]


def _source(cls: type) -> str:
    """forward's body, comments, annotations and whitespace dropped."""
    text = inspect.getsource(cls.forward).split(":", 1)[1]
    text = re.sub(r"^[^\n]*?->[^\n]*?:", "", text) if text.lstrip().startswith("torch") else text
    text = re.sub(r"#.*", "", text)
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.parametrize("key", sorted(hf_mlp.MLPS))
def test_table_class_forward_is_its_layouts(key):
    cls = getattr(importlib.import_module(key[0]), key[1])
    want = re.sub(r"\s+", " ", hf_mlp.FORWARDS[hf_mlp.MLPS[key]])
    assert _source(cls).endswith(want), key


@pytest.mark.parametrize(
    "family, now",
    [
        ("llama", "fusewise.ops.swiglu"),
        ("qwen3", "fusewise.ops.swiglu"),
        ("gemma", "fusewise.ops.geglu"),  # gelu_pytorch_tanh
        ("phi3", "fusewise.ops.swiglu"),  # gate_up_proj, chunked
    ],
)
def test_causal_lm_mlps_swapped_outputs_and_gradients_match(family, now, device):
    model = causal_lm(family).to(device)
    ref = copy.deepcopy(model)
    expected = _mlp_names(ref)
    assert len(expected) == 2
    report = fusewise.patch(model, norms=False, loss=False, rotary=False)
    assert [c.name for c in report] == expected  # every MLP, nothing else
    assert all(c.action == SWAPPED and c.now == now and c.what == "activation" for c in report)
    if family == "gemma":
        assert all('approximate="tanh"' in c.reason for c in report)
    ids = torch.randint(3, 128, (2, 8), device=device)
    out, grads = _run(model, ids)
    want, want_grads = _run(ref, ids)
    torch.testing.assert_close(out.logits, want.logits, **FP32)
    torch.testing.assert_close(out.loss, want.loss, **FP32)
    assert grads.keys() == want_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], want_grads[name], **FP32, msg=name)
    assert fusewise.ops.paths()[now.rsplit(".", 1)[1] + ".backward"] != "reference"

    assert fusewise.patch(model, norms=False, loss=False, rotary=False) == []  # idempotent
    assert fusewise.unpatch(model) == 2
    assert [type(m) for m in model.modules()] == [type(m) for m in ref.modules()]
    assert not any(hf_mlp.ACT_ATTR in vars(m) for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=0, atol=0)


def test_exact_gelu_is_geglu_none_and_matches(device):
    model = causal_lm("llama", hidden_act="gelu").to(device)
    ref = copy.deepcopy(model)
    report = fusewise.patch(model, norms=False, loss=False, rotary=False)
    assert [c.now for c in report] == ["fusewise.ops.geglu"] * 2
    assert all('approximate="none"' in c.reason for c in report)
    ids = torch.randint(3, 128, (2, 8), device=device)
    torch.testing.assert_close(_run(model, ids)[0].loss, _run(ref, ids)[0].loss, **FP32)


def test_unsupported_activation_left_alone_with_the_reason():
    model = causal_lm("llama", hidden_act="relu")
    report = fusewise.patch(model, norms=False, loss=False, rotary=False)
    assert [c.name for c in report] == _mlp_names(model)
    assert all(c.action == LEFT_ALONE and c.now is None for c in report)
    assert all("torch.nn.modules.activation.ReLU" in c.reason for c in report)
    assert all(type(m) is LlamaMLP for n, m in model.named_modules() if n.endswith("mlp"))


def test_autograd_keeps_gate_and_up_only(device):
    """Unfused, an MLP keeps gate, act(gate), up and the product; patched, only gate and up (the
    product is recomputed in down_proj's backward: ops/gated/down.py)."""
    mlp = causal_lm("llama").model.layers[0].mlp.to(device)
    x = torch.randn(2, 5, 32, device=device, requires_grad=True)

    def wide_saved(module):
        saved = []

        def pack(t):
            if t.numel() == 2 * 5 * 64:  # [tokens, intermediate_size], not the weights
                saved.append(t.data_ptr())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            module(x).sum().backward()
        return len(set(saved))

    assert wide_saved(mlp) == 4
    fusewise.patch(mlp, norms=False, loss=False, rotary=False)
    assert wide_saved(mlp) == 2


def test_subclasses_with_their_own_forward_left_alone_plain_ones_swapped():
    class OwnForward(LlamaMLP):
        def forward(self, x):
            return super().forward(x) * 2

    class Plain(LlamaMLP):
        pass

    config = causal_lm("llama").config
    own, plain = OwnForward(config), Plain(config)
    (c_own,) = fusewise.patch(own, norms=False, loss=False, rotary=False)
    assert c_own.action == LEFT_ALONE and "its own forward" in c_own.reason
    assert type(own) is OwnForward
    (c_plain,) = fusewise.patch(plain, norms=False, loss=False, rotary=False)
    assert c_plain.action == SWAPPED and "defines no forward of its own" in c_plain.reason
    assert isinstance(plain, Plain) and _swap.original_class(plain) is Plain


def test_forward_on_the_instance_and_meta_parameters_left_alone():
    config = causal_lm("llama").config
    mlp = LlamaMLP(config)
    mlp.forward = lambda x: x
    (change,) = fusewise.patch(mlp, norms=False, loss=False, rotary=False)
    assert change.action == LEFT_ALONE and "set on the instance" in change.reason
    with torch.device("meta"):
        meta = LlamaMLP(config)
    (change,) = fusewise.patch(meta, norms=False, loss=False, rotary=False)
    assert change.action == LEFT_ALONE and "meta device" in change.reason
    assert type(meta) is LlamaMLP


def test_probe_mismatch_is_left_alone_and_restored(monkeypatch):
    key = ("transformers.activations", "SiLUActivation")
    monkeypatch.setitem(hf_mlp.ACTIVATIONS, key, "gelu")  # a wrong table entry
    mlp = causal_lm("llama").model.layers[0].mlp
    (change,) = fusewise.patch(mlp, norms=False, loss=False, rotary=False)
    assert change.action == LEFT_ALONE and "differs from the original" in change.reason
    assert type(mlp) is LlamaMLP and not _swap.is_patched(mlp)


def test_per_instance_the_transformers_class_and_other_models_untouched():
    forward = LlamaMLP.forward
    model, other = causal_lm("llama"), causal_lm("llama")
    fusewise.patch(model, norms=False, loss=False, rotary=False)
    assert LlamaMLP.forward is forward
    assert isinstance(model.model.layers[0].mlp, LlamaMLP)
    assert type(model.model.layers[0].mlp) is not LlamaMLP
    assert all(type(layer.mlp) is LlamaMLP for layer in other.model.layers)


def test_activations_flag_off_leaves_mlps():
    model = causal_lm("llama")
    report = fusewise.patch(model, norms=False, loss=False, activations=False, rotary=False)
    assert report == []
    model = causal_lm("llama")
    assert {c.what for c in fusewise.patch(model, loss=False, rotary=False)} == {
        "norm",
        "activation",
    }


@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_activation_replaced_after_patching_is_used(family, device):
    """The patched forward read the activation decided at patch time: a later mlp.act_fn = ...
    was ignored and the logits silently differed from the unpatched model's. A supported one is
    now fused, anything else runs the MLP's own forward with a warning."""
    model = causal_lm(family).to(device)
    ref = copy.deepcopy(model)
    fusewise.patch(model, norms=False, loss=False, rotary=False)
    attr = "activation_fn" if family == "phi3" else "act_fn"
    ids = torch.randint(3, 128, (2, 8), device=device)
    for new, fused in [(torch.nn.GELU(approximate="tanh"), True), (torch.nn.ReLU(), False)]:
        for m in (model, ref):
            setattr(m.model.layers[0].mlp, attr, copy.deepcopy(new))
        _dispatch.forget_paths()
        if fused:
            out, grads = _run(model, ids)
            assert fusewise.ops.paths().get("geglu") not in (None, "reference")
        else:
            with pytest.warns(UserWarning, match=rf"{attr} was replaced after fusewise.patch"):
                out, grads = _run(model, ids)
        want, want_grads = _run(ref, ids)
        torch.testing.assert_close(out.logits, want.logits, **FP32)
        for name in want_grads:
            torch.testing.assert_close(grads[name], want_grads[name], **FP32, msg=name)
    # the layer left alone keeps its fused activation
    assert getattr(model.model.layers[1].mlp, hf_mlp.ACT_ATTR) == "silu"


def test_a_model_patched_before_the_activation_module_was_kept_still_runs(device):
    """A patched model pickled by an earlier fusewise has ACT_ATTR but not ACT_MODULE_ATTR: it
    must still run (the activation decided again), not raise KeyError."""
    model = causal_lm("llama").to(device)
    ref = copy.deepcopy(model)
    fusewise.patch(model, norms=False, loss=False, rotary=False)
    for m in model.modules():
        m.__dict__.pop(hf_mlp.ACT_MODULE_ATTR, None)
        m.__dict__.get(_swap.SAVED_ATTRS, {}).pop(hf_mlp.ACT_MODULE_ATTR, None)
    ids = torch.randint(3, 128, (2, 8), device=device)
    out, grads = _run(model, ids)
    want, want_grads = _run(ref, ids)
    torch.testing.assert_close(out.logits, want.logits, **FP32)
    for name in want_grads:
        torch.testing.assert_close(grads[name], want_grads[name], **FP32, msg=name)


def test_compiled_after_an_unsupported_activation_is_set(device):
    """The fallback's warning cannot be traced: under torch.compile(fullgraph=True) the MLP's
    own forward runs without it."""
    mlp = causal_lm("llama").model.layers[0].mlp.to(device)
    ref = copy.deepcopy(mlp)
    fusewise.patch(mlp, norms=False, loss=False, rotary=False)
    mlp.act_fn, ref.act_fn = torch.nn.ReLU(), torch.nn.ReLU()
    x = torch.randn(2, 5, 32, device=device)
    compiled = torch.compile(mlp, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), ref(x), **FP32)
