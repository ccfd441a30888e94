"""fusewise.patch on Hugging Face models: the attention modules' apply_rotary_pos_emb replaced by
fusewise.ops.apply_rotary per instance (hf_rotary.py, hf_rotary_forms.py), each swap probed."""

from __future__ import annotations

import ast
import copy
import functools
import glob
import importlib
import inspect
import os

import pytest
import torch
from hf_tiny import _COMMON, causal_lm, tf
from transformers.models.llama import modeling_llama
from transformers.models.llama.modeling_llama import LlamaAttention, rotate_half

import fusewise
from fusewise.patch import LEFT_ALONE, SWAPPED, _swap, hf_rotary, hf_rotary_forms
from fusewise.patch.hf_rotary_forms import GPTJ, QK, QK_POSITION_IDS, RotaryForm, X

FP32 = dict(atol=1e-5, rtol=1e-4)
NOW = "fusewise.ops.apply_rotary"


def _build(config: str, model: str, **kw):
    config = getattr(tf, config)(**kw)
    config._attn_implementation = "eager"
    return getattr(tf, model)(config)


_NO_KV = {k: v for k, v in _COMMON.items() if k != "num_key_value_heads"}
# family -> (builder, what the report's reason says)
FAMILIES = {
    "llama": (lambda: causal_lm("llama"), "(rotate_half)"),
    "mistral": (lambda: causal_lm("mistral"), "(rotate_half)"),
    "qwen3": (lambda: causal_lm("qwen3"), "(rotate_half)"),  # 4 query heads, 2 key heads
    "gemma": (lambda: causal_lm("gemma"), "(rotate_half)"),
    "phi3-partial": (lambda: causal_lm("phi3", partial_rotary_factor=0.5), "partial"),
    "gpt_neox": (
        lambda: _build("GPTNeoXConfig", "GPTNeoXForCausalLM", **_NO_KV, rotary_pct=0.5),
        "partial",
    ),
    "gptj": (  # apply_rotary_pos_emb(tensor, sin, cos), [B, S, H, D], 4 of 8 features rotated
        lambda: _build(
            "GPTJConfig",
            "GPTJForCausalLM",
            vocab_size=128,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            rotary_dim=4,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "interleaved=True, cos/sin repeat_interleave(2)",
    ),
    "cohere": (lambda: _build("CohereConfig", "CohereForCausalLM", **_COMMON), "interleaved"),
    "glm": (  # GLM's rotate pairs (2i, 2i+1), cos[..., :n/2] repeated, half the head rotated
        lambda: _build("GlmConfig", "GlmForCausalLM", **_COMMON, head_dim=8),
        "interleaved=True, partial (features past cos.shape[-1] kept), cos/sin first half",
    ),
}


def _attention_names(model) -> list[str]:
    return [n for n, m in model.named_modules() if hf_rotary.rotary_class(type(m)) is not None]


def _run(model, ids):
    model.zero_grad()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of fusewise.ops.apply_rotary (equal results alone would not show that
    the op ran at all)."""
    seen = []
    real = fusewise.ops.apply_rotary

    def counted(*args, **kwargs):
        seen.append(kwargs.get("interleaved"))
        return real(*args, **kwargs)

    monkeypatch.setattr(fusewise.ops, "apply_rotary", counted)
    return seen


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_attention_swapped_logits_and_gradients_match(family, calls):
    build, says = FAMILIES[family]
    model, other = build(), build()
    ref = copy.deepcopy(model)
    expected = _attention_names(ref)
    assert len(expected) == 2
    report = fusewise.patch(model, norms=False, loss=False, activations=False)
    assert [c.name for c in report] == expected  # every attention module, nothing else
    assert all(c.action == SWAPPED and c.now == NOW and c.what == "rotary" for c in report)
    assert all(says in c.reason for c in report), report
    calls.clear()  # the probe's calls
    ids = torch.randint(3, 128, (2, 8))
    out, grads = _run(model, ids)
    assert len(calls) in (2, 4)  # one per layer; GPT-J's one per tensor (q, k)
    assert all(i == ("interleaved" in says) for i in calls)
    want, want_grads = _run(ref, ids)
    torch.testing.assert_close(out.logits, want.logits, **FP32)
    assert grads.keys() == want_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], want_grads[name], **FP32, msg=name)

    # the HF class, its module's global and a second model of the same class are untouched
    hf_cls = _swap.original_class(dict(model.named_modules())[expected[0]])
    hf_global = inspect.unwrap(hf_cls.forward).__globals__[hf_rotary.GLOBAL]
    hf_function = hf_rotary_forms.hub_function(hf_global)  # a hub-kernel wrapper's function
    assert hf_function.__qualname__ == hf_rotary.GLOBAL and hf_rotary.GLOBAL not in vars(hf_cls)
    assert not hasattr(hf_function, "fusewise_form")
    for name in expected:
        patched = dict(model.named_modules())[name]
        untouched = dict(other.named_modules())[name]
        assert isinstance(patched, hf_cls) and type(patched) is not hf_cls
        assert inspect.unwrap(type(patched).forward).__globals__[hf_rotary.GLOBAL].fusewise_form
        assert type(untouched) is hf_cls and not _swap.is_patched(untouched)
        assert inspect.unwrap(type(untouched).forward).__globals__[hf_rotary.GLOBAL] is hf_global
    calls.clear()
    with torch.no_grad():
        other(ids)
    assert calls == []

    assert fusewise.patch(model, norms=False, loss=False, activations=False) == []  # idempotent
    assert fusewise.unpatch(model) == 2
    assert [type(m) for m in model.modules()] == [type(m) for m in ref.modules()]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=0, atol=0)
    assert calls == []


def test_bf16_swap_kept_and_close():
    model = causal_lm("llama").to(torch.bfloat16)
    ref = copy.deepcopy(model)
    report = fusewise.patch(model, norms=False, loss=False, activations=False)
    assert [c.action for c in report] == [SWAPPED] * 2
    ids = torch.randint(3, 128, (2, 8))
    with torch.no_grad():
        got, want = model(ids).logits.float(), ref(ids).logits.float()
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.05)


def test_copies_stay_patched():
    import pickle

    model = causal_lm("llama")
    fusewise.patch(model, norms=False, loss=False, activations=False)
    ids = torch.randint(3, 128, (2, 8))
    with torch.no_grad():
        want = model(ids).logits
    for twin in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert [type(m) for m in twin.modules()] == [type(m) for m in model.modules()]
        with torch.no_grad():
            torch.testing.assert_close(twin(ids).logits, want, rtol=0, atol=0)
        assert fusewise.unpatch(twin) == 2


def test_compiled_attention_has_no_graph_break_and_matches_eager():
    model = causal_lm("qwen3")
    fusewise.patch(model, norms=False, loss=False, activations=False)
    layer = model.model.layers[0]
    hidden = torch.randn(2, 8, 32, requires_grad=True)
    position_ids = torch.arange(8).expand(2, 8)
    kw = dict(position_embeddings=model.model.rotary_emb(hidden, position_ids=position_ids))
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    out = compiled(hidden, **kw)
    out = out[0] if isinstance(out, tuple) else out
    (g,) = torch.autograd.grad(out.sum(), hidden)
    want = layer(hidden, **kw)
    want = want[0] if isinstance(want, tuple) else want
    (g_want,) = torch.autograd.grad(want.sum(), hidden)
    torch.testing.assert_close(out, want, **FP32)
    torch.testing.assert_close(g, g_want, **FP32)


# --- left alone, with the reason -----------------------------------------------------------


def _rotate_last_features(q, k, cos, sin, unsqueeze_dim=1):
    """A variant fusewise does not know: the rotary features are the last ones."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    d = cos.shape[-1]
    q = torch.cat([q[..., :-d], q[..., -d:] * cos + rotate_half(q[..., -d:]) * sin], dim=-1)
    k = torch.cat([k[..., :-d], k[..., -d:] * cos + rotate_half(k[..., -d:]) * sin], dim=-1)
    return q, k


def _rotate_half_other_sign(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((x2, -x1), dim=-1)


@pytest.mark.parametrize(
    "name, replacement, says",
    [
        ("apply_rotary_pos_emb", _rotate_last_features, "not a form fusewise knows"),
        ("rotate_half", _rotate_half_other_sign, "rotate_half is not a pairing fusewise knows"),
        ("apply_rotary_pos_emb", torch.nn.Identity(), "not a plain function"),
    ],
    ids=["last-features", "rotate-sign", "not-a-function"],
)
def test_unrecognised_variant_left_alone_with_the_reason(monkeypatch, name, replacement, says):
    monkeypatch.setattr(modeling_llama, name, replacement)
    model = causal_lm("llama")
    report = fusewise.patch(model, norms=False, loss=False, activations=False)
    assert [c.name for c in report] == _attention_names(model)
    assert all(c.action == LEFT_ALONE and c.now is None and says in c.reason for c in report)
    assert all(type(layer.self_attn) is LlamaAttention for layer in model.model.layers)


def _hub_wrapped(func):
    """What kernels.use_kernel_forward_from_hub makes of a function (kernels 0.19, under
    transformers >= 5.25): an nn.Module instance whose class forward calls `func`."""

    class Func(torch.nn.Module):
        kernel_layer_name = "rotary_pos_emb"

        def forward(self, *args, **kwargs):
            return func(*args, **kwargs)

    return Func()


def test_a_hub_kernel_wrapper_is_seen_through_unless_kernelized(monkeypatch):
    """The function behind the wrapper is recognised and swapped; a wrapper kernelize() gave a
    forward of its own (a hub kernel), globally or in the attention instance's own copy
    (use_kernelized_func), is left alone with the reason."""
    plain = hf_rotary_forms.hub_function(modeling_llama.apply_rotary_pos_emb)
    assert inspect.isfunction(plain) and hf_rotary_forms.hub_function(plain) is plain
    wrapped = _hub_wrapped(plain)
    assert hf_rotary_forms.hub_function(wrapped) is plain
    assert hf_rotary_forms.hub_function(torch.nn.Identity()) is not plain
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", wrapped)
    model = causal_lm("llama")
    report = fusewise.patch(model, norms=False, loss=False, activations=False)
    assert [c.action for c in report] == [SWAPPED, SWAPPED]

    model = causal_lm("llama")
    for layer in model.model.layers:
        own = _hub_wrapped(plain)
        own.forward = lambda *args, **kwargs: plain(*args, **kwargs)  # what kernelize() sets
        vars(layer.self_attn)["_kernel_funcs"] = {"apply_rotary_pos_emb": own}
    report = fusewise.patch(model, norms=False, loss=False, activations=False)
    assert all(c.action == LEFT_ALONE and "kernelized" in c.reason for c in report) and report

    wrapped.forward = lambda *args, **kwargs: plain(*args, **kwargs)
    assert hf_rotary_forms.hub_function(wrapped) is wrapped
    model = causal_lm("llama")
    report = fusewise.patch(model, norms=False, loss=False, activations=False)
    assert all(c.action == LEFT_ALONE and "not a plain function" in c.reason for c in report)
    assert report


def test_probe_mismatch_is_left_alone_and_restored(monkeypatch):
    def wrong(q, k, cos, sin, *, interleaved=False):  # rotates the other way
        return fusewise.ops.rotary.apply_rotary(q, k, cos, -sin, interleaved=interleaved)

    monkeypatch.setattr(fusewise.ops, "apply_rotary", wrong)
    attention = causal_lm("llama").model.layers[0].self_attn
    model = torch.nn.ModuleDict({"attn": attention})
    (change,) = fusewise.patch(model, norms=False, loss=False, activations=False)
    assert change.action == LEFT_ALONE and "differs from the original" in change.reason
    assert type(attention) is LlamaAttention and not _swap.is_patched(attention)


def test_subclasses_instance_forwards_and_meta_parameters():
    class OwnForward(LlamaAttention):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    class Plain(LlamaAttention):
        pass

    config = causal_lm("llama").config
    (own,) = fusewise.patch(OwnForward(config, 0), norms=False, loss=False, activations=False)
    assert own.action == LEFT_ALONE and "its own forward" in own.reason
    plain = Plain(config, 0)
    (change,) = fusewise.patch(plain, norms=False, loss=False, activations=False)
    assert change.action == SWAPPED and "defines no forward of its own" in change.reason
    assert isinstance(plain, Plain) and _swap.original_class(plain) is Plain
    on_instance = LlamaAttention(config, 0)
    on_instance.forward = lambda *a, **k: None
    (change,) = fusewise.patch(on_instance, norms=False, loss=False, activations=False)
    assert change.action == LEFT_ALONE and "set on the instance" in change.reason
    with torch.device("meta"):
        meta = LlamaAttention(config, 0)
    (change,) = fusewise.patch(meta, norms=False, loss=False, activations=False)
    assert change.action == LEFT_ALONE and "meta device" in change.reason


def test_wrapped_forward_and_attribute_calls_left_alone():
    class Wrapped(LlamaAttention):
        @functools.wraps(LlamaAttention.forward)
        def forward(self, *args, **kwargs):
            return LlamaAttention.forward(self, *args, **kwargs)

    class Attribute(LlamaAttention):  # names apply_rotary_pos_emb, but not the global
        def forward(self, *args, **kwargs):
            self.apply_rotary_pos_emb = None
            return super().forward(*args, **kwargs)

    config = causal_lm("llama").config
    (change,) = fusewise.patch(Wrapped(config, 0), norms=False, loss=False, activations=False)
    assert change.action == LEFT_ALONE and "wrapped by a decorator" in change.reason
    (change,) = fusewise.patch(Attribute(config, 0), norms=False, loss=False, activations=False)
    assert change.action == LEFT_ALONE and "its own forward overrides" in change.reason


def _renaming(old_name, new_name):
    """A decorator like transformers' deprecate_kwarg: a functools.wraps closure over the
    function that renames a keyword argument before calling it."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if old_name in kwargs:
                kwargs[new_name] = kwargs.pop(old_name)
            return fn(*args, **kwargs)

        return wrapper

    return decorate


def test_a_forward_wrapped_in_a_closure_decorator_is_rebuilt_through_it(monkeypatch):
    class Decorated(LlamaAttention):
        pass

    # the same code as LlamaAttention.forward, under a wrapper that renames a keyword
    inner = inspect.unwrap(LlamaAttention.forward)
    Decorated.forward = _renaming("hidden", "hidden_states")(inner)
    torch.manual_seed(0)
    config = causal_lm("llama").config
    module, other = Decorated(config, 0), Decorated(config, 0)
    other.load_state_dict(module.state_dict())
    (change,) = fusewise.patch(module, norms=False, loss=False, activations=False)
    assert change.action == SWAPPED and change.now == NOW, change.reason
    patched = inspect.unwrap(type(module).forward)
    assert patched is not inner and patched.__code__ is inner.__code__
    assert patched.__globals__[hf_rotary.GLOBAL] is not inner.__globals__[hf_rotary.GLOBAL]
    x = torch.randn(2, 5, config.hidden_size)
    head_dim = config.hidden_size // config.num_attention_heads
    angles = torch.rand(2, 5, head_dim) * 6.3
    kwargs = dict(position_embeddings=(angles.cos(), angles.sin()), attention_mask=None)
    calls, real = [], fusewise.ops.apply_rotary
    monkeypatch.setattr(
        fusewise.ops, "apply_rotary", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    got = module(hidden=x, **kwargs)[0]  # the wrapper's renaming still runs
    want = other(hidden=x, **kwargs)[0]
    assert calls and torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert fusewise.unpatch(module) == 1 and type(module) is Decorated


def test_rotary_flag_off_and_default_on():
    model = causal_lm("llama")
    assert fusewise.patch(model, norms=False, loss=False, activations=False, rotary=False) == []
    report = fusewise.patch(causal_lm("llama"), loss=False)
    assert {c.what for c in report} == {"norm", "activation", "rotary"}


# --- the adaptor ---------------------------------------------------------------------------


def _qkcs(batch=2, heads=4, kv=2, seq=5, dim=8, rot=8, dtype=torch.float32):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(batch, seq, heads, dim, generator=gen).to(dtype).transpose(1, 2)  # strided
    k = torch.randn(batch, kv, seq, dim, generator=gen).to(dtype)
    angles = torch.rand(batch, seq, rot, generator=gen) * 6.3
    return q, k, angles.cos(), angles.sin()


def test_adaptor_has_the_hf_functions_parameters():
    from transformers.models.gemma3n import modeling_gemma3n
    from transformers.models.glmasr import modeling_glmasr
    from transformers.models.gptj import modeling_gptj

    for module, call in [
        (modeling_llama, QK),
        (modeling_glmasr, QK_POSITION_IDS),
        (modeling_gemma3n, X),
        (modeling_gptj, GPTJ),
    ]:
        hf = hf_rotary_forms.hub_function(module.apply_rotary_pos_emb)
        form, interleaved = hf_rotary_forms.recognise(hf, vars(module))
        assert form.call == call
        ours = inspect.signature(hf_rotary_forms.adaptor_for(form, interleaved)).parameters
        theirs = inspect.signature(hf).parameters
        assert [(p.name, p.default) for p in ours.values()] == [
            (p.name, p.default) for p in theirs.values()
        ]


@pytest.mark.parametrize("unsqueeze_dim", [1, 2, -3])
def test_adaptor_equals_hf_in_both_layouts_and_promotes_like_hf(unsqueeze_dim):
    adaptor = hf_rotary_forms.adaptor_for(RotaryForm(QK), False)
    q, k, cos, sin = _qkcs()
    if unsqueeze_dim == 2:  # q, k as [B, S, H, D]
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    want = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
    got = adaptor(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    q16, k16 = q.bfloat16(), k.bfloat16()  # HF: bf16 q times fp32 cos gives fp32
    want = modeling_llama.apply_rotary_pos_emb(q16, k16, cos, sin, unsqueeze_dim)
    got = adaptor(q16, k16, cos, sin, unsqueeze_dim)
    assert [g.dtype for g in got] == [w.dtype for w in want] == [torch.float32] * 2
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_one_tensor_and_gptj_adaptors_equal_hf():
    from transformers.models.gemma3n import modeling_gemma3n
    from transformers.models.gptj import modeling_gptj

    q, _, cos, sin = _qkcs()
    for module, args in [
        (modeling_gemma3n, (q, cos, sin)),
        (modeling_gemma3n, (q.transpose(1, 2), cos, sin, 2)),
        (modeling_gptj, (q.transpose(1, 2), sin[..., :4], cos[..., :4])),
    ]:
        hf = module.apply_rotary_pos_emb
        adaptor = hf_rotary_forms.adaptor_for(*hf_rotary_forms.recognise(hf, vars(module)))
        torch.testing.assert_close(adaptor(*args), hf(*args), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "form, args, says",
    [
        (RotaryForm(QK), dict(unsqueeze_dim=0), "unsqueeze_dim=0"),
        (RotaryForm(QK), dict(unsqueeze_dim=3), "unsqueeze_dim=3"),
        (RotaryForm(QK), dict(unsqueeze_dim=1.0), "unsqueeze_dim=1.0"),
        (RotaryForm(QK), dict(rot=4), "rotary width 4 other than the head's 8"),
        (RotaryForm(QK), dict(cos_2d=True), "wants [B, S, Dr]"),
        (RotaryForm(QK), dict(seq=3), "for q of 2 sequences of 5"),
    ],
    ids=["unsqueeze-0", "unsqueeze-3", "unsqueeze-float", "width", "cos-2d", "seq"],
)
def test_adaptor_errors_clearly_on_what_it_cannot_express(form, args, says):
    adaptor = hf_rotary_forms.adaptor_for(form, False)
    q, k, cos, sin = _qkcs(rot=args.get("rot", 8))
    if args.get("cos_2d"):
        cos, sin = cos[0], sin[0]
    if "seq" in args:
        cos, sin = cos[:, : args["seq"]], sin[:, : args["seq"]]
    with pytest.raises(ValueError, match="cannot express") as e:
        adaptor(q, k, cos, sin, unsqueeze_dim=args.get("unsqueeze_dim", 1))
    assert says in str(e.value)


# --- every modeling module of the installed transformers ----------------------------------


def _blocks(text: str, indent: str) -> dict[str, str]:
    """{name: source} of the defs and classes at `indent` in `text` (decorators included), split
    on lines alone: parsing ~180 whole modeling modules with ast takes a minute."""
    blocks, name, lines, decorating = {}, None, [], False
    for line in [*text.splitlines(), indent + "end"]:
        head = line[len(indent) :]
        if line.startswith(indent) and head[:1] not in ("", " ", ")", "#"):
            if not decorating:  # a statement at this level ends the block before it
                if name is not None:
                    blocks.setdefault(name, "\n".join(lines))
                name, lines = None, []
            decorating = head.startswith("@")
            if head.startswith(("def ", "class ")):
                name = head.split()[1].split("(")[0].split(":")[0]
        lines.append(line)
    return blocks


def _static_verdicts():
    """{"module.Class": (form, interleaved) or reason} for every class of every modeling module
    whose forward names apply_rotary_pos_emb, read from the source (no imports: ~180 modules)."""
    base = os.path.dirname(importlib.import_module("transformers.models").__file__)
    verdicts = {}
    for path in sorted(glob.glob(os.path.join(base, "*", "modeling_*.py"))):
        with open(path) as f:
            text = f.read()
        if hf_rotary.GLOBAL not in text:
            continue
        top = _blocks(text, "")
        functions = {k: v for k, v in top.items() if "\ndef " in "\n" + v}

        def helper(name, functions=functions):
            source = functions.get(name)
            return None if source is None else _normalised(source)

        for name, source in top.items():
            if not source.lstrip("@").startswith("class ") and "\nclass " not in source:
                continue
            forward = _blocks(source, "    ").get("forward", "")
            if hf_rotary.GLOBAL + "(" not in forward:
                continue
            key = f"{os.path.basename(path)[:-3]}.{name}"
            decorators = [ln.strip() for ln in forward.splitlines() if ln.strip().startswith("@")]
            # deprecate_kwarg (transformers >= 5.2x, on most attention forwards) is a
            # functools.wraps closure over the function: rebuilt through (hf_rotary._rebuilt)
            if any(not d.startswith("@deprecate_kwarg(") for d in decorators):
                verdicts[key] = "its forward is decorated"
            elif hf_rotary.GLOBAL not in functions:
                verdicts[key] = "no module-level apply_rotary_pos_emb"
            else:
                verdicts[key] = hf_rotary_forms.recognise_source(
                    _normalised(functions[hf_rotary.GLOBAL]), helper
                )
    return verdicts


def _normalised(source: str) -> str:
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef))
    return hf_rotary_forms.normalised_node(node)


def test_attention_classes_of_every_modeling_module_recognised():
    verdicts = _static_verdicts()
    unrecognised = {k: v for k, v in verdicts.items() if isinstance(v, str)}
    recognised = len(verdicts) - len(unrecognised)
    print(f"\n{recognised} of {len(verdicts)} classes calling apply_rotary_pos_emb recognised")
    for key, reason in sorted(unrecognised.items()):
        print(f"  not recognised: {key}: {reason}")
    assert recognised >= 150  # 161 of 181 in transformers 5.17
    for key in ("modeling_llama.LlamaAttention", "modeling_gptj.GPTJAttention"):
        assert not isinstance(verdicts[key], str), key


def test_a_forward_that_does_not_call_it_on_the_probe_is_left_alone():
    """DeepSeek-V3 (rope_interleave=True, its default) calls apply_rotary_pos_emb_interleave;
    apply_rotary_pos_emb only in the other branch. Both forwards then ran HF's code, agreed,
    and the report said swapped while the op never ran."""
    if not hasattr(tf, "DeepseekV3Config"):
        pytest.skip("this transformers has no DeepSeek-V3")
    config = dict(_COMMON, num_key_value_heads=4, moe_intermediate_size=16, n_routed_experts=4)
    config |= dict(num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1)
    config |= dict(q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8)
    config |= dict(v_head_dim=8)
    for interleave, action in [(True, LEFT_ALONE), (False, SWAPPED)]:
        model = _build(
            "DeepseekV3Config", "DeepseekV3ForCausalLM", **config, rope_interleave=interleave
        )
        report = fusewise.patch(model, norms=False, loss=False, activations=False)
        rotary = [c for c in report if c.what == "rotary"]
        assert len(rotary) == 2 and all(c.action == action for c in rotary), rotary
        if action == LEFT_ALONE:
            assert all("did not call apply_rotary_pos_emb on a probe" in c.reason for c in rotary)
            assert not any(_swap.is_patched(m) for m in model.modules())
