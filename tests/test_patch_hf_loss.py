"""fusewise.patch(model) on Hugging Face causal LMs: the training loss from
fusewise.ops.linear_cross_entropy (no logits), equal to HF's, per instance, undone by unpatch.

Every patched model is a deepcopy of an HF one, patched with norms=False so only the loss
changes; HF's own model on the same batch is the oracle (fp32 on the CPU).
"""

import copy
import inspect
import pickle

import pytest
import torch
from hf_tiny import CAUSAL_LM, causal_lm, layer_norm_models
from torch._dynamo.utils import counters

import fusewise
from fusewise.patch import LEFT_ALONE, SWAPPED

tf = pytest.importorskip("transformers")

V = 128
LOSS_TOL = dict(rtol=1e-5, atol=1e-6)
GRAD_TOL = dict(rtol=1e-4, atol=1e-6)


def pair(family, **config):
    """(HF's model, a patched deepcopy), both in training mode."""
    hf = causal_lm(family, **config) if family != "gpt2" else layer_norm_models()["gpt2"]
    hf.train()
    patched = copy.deepcopy(hf)
    report = fusewise.patch(patched, norms=False, activations=False, rotary=False)
    return hf, patched, report


def batch(b=2, t=9, ignored=True):
    ids = torch.randint(3, V, (b, t))
    labels = ids.clone()
    if ignored:
        labels[0, :3] = -100  # a prompt left out
        labels[1, -2] = -100
    return ids, labels


def assert_same_grads(hf, patched):
    for (name, a), b in zip(hf.named_parameters(), patched.parameters()):
        if a.grad is None:
            assert b.grad is None, name
            continue
        assert b.grad is not None, name
        torch.testing.assert_close(b.grad, a.grad, **GRAD_TOL, msg=name)


def call(model, **kw):
    torch.manual_seed(1)  # the same dropout masks (GPT-2's) in both models
    return model(**kw)


def step(model, **kw):
    out = call(model, **kw)
    out.loss.backward()
    return out


@pytest.mark.parametrize("family", [*CAUSAL_LM, "gpt2"])
def test_loss_and_grads_equal_hf(family):
    hf, patched, report = pair(family)
    assert [(c.what, c.action) for c in report] == [("loss", SWAPPED)]
    assert inspect.signature(patched.forward) == inspect.signature(hf.forward)
    assert type(patched).__name__ == type(hf).__name__ and isinstance(patched, type(hf))
    ids, labels = batch()
    ref = step(hf, input_ids=ids, labels=labels)
    out = step(patched, input_ids=ids, labels=labels)
    assert out.logits is None and "logits" not in out
    torch.testing.assert_close(out.loss, ref.loss, **LOSS_TOL)
    assert_same_grads(hf, patched)
    # without labels (training) and in eval (with and without labels): HF's logits, exactly
    with torch.no_grad():
        assert torch.equal(call(patched, input_ids=ids).logits, call(hf, input_ids=ids).logits)
        hf.eval(), patched.eval()
        a, b = hf(input_ids=ids, labels=labels), patched(input_ids=ids, labels=labels)
        assert torch.equal(b.logits, a.logits) and torch.equal(b.loss, a.loss)


def test_no_logits_ever_materialised():
    """lm_head's output in training with labels is the [..., 0] stand-in, not [B, T, V]."""
    _, patched, _ = pair("llama")
    seen = []
    patched.lm_head.register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    ids, labels = batch()
    patched(input_ids=ids, labels=labels)
    assert seen == [(2, 9, 0)]
    patched.eval()
    patched(input_ids=ids, labels=labels)
    assert seen[-1] == (2, 9, V)


def test_shift_labels():
    hf, patched, _ = pair("llama")
    ids, labels = batch()
    shift = torch.randint(0, V, labels.shape)
    shift[:, -3:] = -100
    ref = step(hf, input_ids=ids, shift_labels=shift, labels=labels)
    out = step(patched, input_ids=ids, shift_labels=shift, labels=labels)
    torch.testing.assert_close(out.loss, ref.loss, **LOSS_TOL)
    assert_same_grads(hf, patched)


def test_num_items_in_batch_gradient_accumulation():
    """Two micro-batches, each loss summed and divided by the tokens of both (HF's Trainer)."""
    hf, patched, _ = pair("qwen2")
    micro = [batch(), batch(t=7)]
    n = sum(int((lab[:, 1:] != -100).sum()) for _, lab in micro)
    losses = [], []
    for ids, labels in micro:
        for model, seen in zip((hf, patched), losses):
            kw = dict(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(n))
            seen.append(step(model, **kw).loss)
    torch.testing.assert_close(torch.stack(losses[1]), torch.stack(losses[0]), **LOSS_TOL)
    assert_same_grads(hf, patched)


@pytest.mark.parametrize(
    "family,config", [("llama", dict(tie_word_embeddings=True)), ("gemma", {})]
)
def test_tied_embeddings(family, config):
    hf, patched, _ = pair(family, **config)
    assert patched.lm_head.weight is patched.model.embed_tokens.weight
    ids, labels = batch()
    ref = step(hf, input_ids=ids, labels=labels)
    out = step(patched, input_ids=ids, labels=labels)
    torch.testing.assert_close(out.loss, ref.loss, **LOSS_TOL)
    # the shared tensor's gradient: the embedding's and lm_head's, each counted once
    torch.testing.assert_close(patched.lm_head.weight.grad, hf.lm_head.weight.grad, **GRAD_TOL)


def test_lm_head_bias():
    hf, patched, _ = pair("llama")
    for model in (hf, patched):
        torch.manual_seed(1)
        model.lm_head.bias = torch.nn.Parameter(torch.randn(V))
    ids, labels = batch()
    ref = step(hf, input_ids=ids, labels=labels)
    out = step(patched, input_ids=ids, labels=labels)
    torch.testing.assert_close(out.loss, ref.loss, **LOSS_TOL)
    assert_same_grads(hf, patched)


def test_logits_to_keep():
    hf, patched, _ = pair("llama")
    ids, labels = batch()
    shift = labels[:, -3:].clone()
    kw = dict(input_ids=ids, labels=labels, shift_labels=shift, logits_to_keep=3)
    ref, out = step(hf, **kw), step(patched, **kw)
    torch.testing.assert_close(out.loss, ref.loss, **LOSS_TOL)
    assert_same_grads(hf, patched)
    for model in (hf, patched):  # the kept positions and the labels disagree: both refuse
        with pytest.raises(ValueError):
            model(input_ids=ids, labels=labels, logits_to_keep=3)


def test_gemma2_softcap_applied():
    """A cap small enough to change the loss: without softcap= the patched loss would differ."""
    hf, patched, report = pair("gemma2", final_logit_softcapping=0.5)
    assert "softcap" in report[0].reason
    with torch.no_grad():  # logits of a few units (tied: the embedding scales too)
        for model in (hf, patched):
            model.lm_head.weight.mul_(100)
    ids, labels = batch()
    ref = step(hf, input_ids=ids, labels=labels)
    out = step(patched, input_ids=ids, labels=labels)
    torch.testing.assert_close(out.loss, ref.loss, **LOSS_TOL)
    assert_same_grads(hf, patched)
    hf.config.final_logit_softcapping = None
    with torch.no_grad():
        uncapped = hf(input_ids=ids, labels=labels).loss
    assert abs(uncapped - ref.loss) > 1e-2


def test_mixtral_aux_loss_added():
    hf, patched, _ = pair("mixtral", output_router_logits=True)
    ids, labels = batch()
    ref = step(hf, input_ids=ids, labels=labels)
    out = step(patched, input_ids=ids, labels=labels)
    assert out.aux_loss is not None and out.logits is None
    torch.testing.assert_close(out.aux_loss, ref.aux_loss, **LOSS_TOL)
    torch.testing.assert_close(out.loss, ref.loss, **LOSS_TOL)
    assert_same_grads(hf, patched)  # the router's gradient comes from the aux loss too


def test_return_logits_gives_hf_path():
    hf, patched, _ = pair("llama")
    ids, labels = batch()
    ref = step(hf, input_ids=ids, labels=labels)
    out = step(patched, input_ids=ids, labels=labels, return_logits=True)
    assert torch.equal(out.logits, ref.logits) and torch.equal(out.loss, ref.loss)
    assert_same_grads(hf, patched)


def test_return_dict_false_tuple_has_no_logits():
    hf, patched, _ = pair("llama")
    ids, labels = batch()
    ref = hf(input_ids=ids, labels=labels, return_dict=False, use_cache=False)
    out = patched(input_ids=ids, labels=labels, return_dict=False, use_cache=False)
    assert isinstance(out, tuple) and len(ref) == 2 and len(out) == 1
    torch.testing.assert_close(out[0], ref[0], **LOSS_TOL)


def test_other_instances_and_classes_untouched():
    cls = tf.LlamaForCausalLM
    forward, loss_function = cls.forward, cls.loss_function
    _, patched, _ = pair("llama")
    other = causal_lm("llama")  # built after the patch
    other.train()
    assert type(other) is cls and cls.forward is forward and cls.loss_function is loss_function
    assert type(other.lm_head) is torch.nn.Linear and "_loss_function" not in other.__dict__
    ids, labels = batch()
    out = other(input_ids=ids, labels=labels)
    assert out.logits.shape == (2, 9, V)


def test_unpatch_restores_hf():
    hf, patched, _ = pair("gemma2")
    before = dict(patched.__dict__), dict(patched.lm_head.__dict__)
    assert fusewise.unpatch(patched) == 2
    assert type(patched) is type(hf) and type(patched.lm_head) is torch.nn.Linear
    assert "_loss_function" not in patched.__dict__ and "_fusewise_hidden" not in before[0]
    assert set(patched.lm_head.__dict__) == set(hf.lm_head.__dict__)
    assert set(patched.__dict__) == set(hf.__dict__)
    ids, labels = batch()
    ref, out = step(hf, input_ids=ids, labels=labels), step(patched, input_ids=ids, labels=labels)
    assert torch.equal(out.logits, ref.logits) and torch.equal(out.loss, ref.loss)
    assert_same_grads(hf, patched)
    assert (
        len(fusewise.patch(patched, norms=False, activations=False, rotary=False).swapped) == 1
    )  # and patches again


def test_report_and_second_patch():
    _, patched, report = pair("llama")
    (change,) = report
    assert change.name == "" and change.what == "loss" and change.action == SWAPPED
    assert change.was == "transformers.models.llama.modeling_llama.LlamaForCausalLM"
    assert change.now == "fusewise.ops.linear_cross_entropy"
    assert "training" in change.reason and "labels" in change.reason
    assert "return_logits=True" in change.reason
    assert (
        len(fusewise.patch(patched, norms=False, activations=False, rotary=False)) == 0
    )  # routed already: not listed again


def test_copies_stay_routed():
    hf, patched, _ = pair("llama")
    ids, labels = batch()
    ref = hf(input_ids=ids, labels=labels)
    for copied in (pickle.loads(pickle.dumps(patched)), copy.deepcopy(patched)):
        assert copied.lm_head.weight is not patched.lm_head.weight
        out = copied(input_ids=ids, labels=labels)
        assert out.logits is None
        torch.testing.assert_close(out.loss, ref.loss, **LOSS_TOL)
        assert fusewise.unpatch(copied) == 2


def test_models_without_a_causal_lm_head():
    models = layer_norm_models()
    (bert,) = fusewise.patch(models["bert"], norms=False, activations=False, rotary=False)
    assert (bert.what, bert.action, bert.now) == ("loss", LEFT_ALONE, None)
    assert "ForMaskedLM" in bert.reason
    assert "_loss_function" not in models["bert"].__dict__
    assert (
        len(fusewise.patch(models["vit"], norms=False, activations=False, rotary=False)) == 0
    )  # no LM head at all


class _ScaledLlama(tf.LlamaForCausalLM):  # a forward changing the logits before the loss
    def forward(self, input_ids=None, labels=None, **kwargs):
        hidden_states = self.model(input_ids=input_ids).last_hidden_state
        logits = self.lm_head(hidden_states)
        logits = logits * 2.0
        return self.loss_function(logits, labels, self.config.vocab_size)


class _InlineScaledLlama(tf.LlamaForCausalLM):  # the same, on lm_head's line
    def forward(self, input_ids=None, labels=None, **kwargs):
        hidden_states = self.model(input_ids=input_ids).last_hidden_state
        logits = self.lm_head(hidden_states) * torch.exp(torch.ones(()))
        return self.loss_function(logits, labels, self.config.vocab_size)


class _ZLossLlama(tf.LlamaForCausalLM):  # the logits used again after the loss
    def forward(self, input_ids=None, labels=None, **kwargs):
        hidden_states = self.model(input_ids=input_ids).last_hidden_state
        logits = self.lm_head(hidden_states)
        loss = self.loss_function(logits, labels, self.config.vocab_size)
        z_loss = logits.logsumexp(dim=-1).pow(2).mean()
        return loss + z_loss


class _OwnLossLlama(tf.LlamaForCausalLM):  # a forward with a loss of its own
    def forward(self, input_ids=None, labels=None, **kwargs):
        logits = self.lm_head(self.model(input_ids=input_ids).last_hidden_state)
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:])


def _left_alone_cases():
    def build(cls):
        return lambda: cls(causal_lm("llama").config)

    def not_linear():
        model = causal_lm("llama")
        model.lm_head = torch.nn.Sequential(model.lm_head)
        return model

    def own_loss_function():
        model = causal_lm("llama")
        model.loss_function = lambda logits, labels, vocab_size, **kw: logits.sum()
        return model

    return {
        "changes the logits before the loss": build(_ScaledLlama),
        "changes lm_head's output": build(_InlineScaledLlama),
        "uses the logits after the loss": build(_ZLossLlama),
        "does not call self.loss_function": build(_OwnLossLlama),
        "not a torch.nn.Linear": not_linear,
        "not HF's ForCausalLMLoss": own_loss_function,
    }


@pytest.mark.parametrize("why", list(_left_alone_cases()))
def test_left_alone_with_reason(why):
    model = _left_alone_cases()[why]()
    cls = type(model)
    (change,) = fusewise.patch(model, norms=False, activations=False, rotary=False)
    assert (change.what, change.action, change.now) == ("loss", LEFT_ALONE, None)
    assert why in change.reason
    assert type(model) is cls and not any("fusewise" in k for k in model.__dict__)


def test_torch_compile_same_loss():
    hf, patched, _ = pair("llama")
    ids, labels = batch()
    ref = step(hf, input_ids=ids, labels=labels)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(patched, backend="aot_eager")
    out = step(compiled, input_ids=ids, labels=labels)
    assert out.logits is None
    # HF's own llama compiles without a graph break (transformers 5.17): the routing adds none
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch.testing.assert_close(out.loss, ref.loss, **LOSS_TOL)
    assert_same_grads(hf, patched)
    torch._dynamo.reset()


def test_a_compiled_model_is_routed_inside_its_wrapper():
    """fusewise.patch(torch.compile(model)): the loss is routed on the model inside (the wrapper
    is no PreTrainedModel), reported under its path, and the compiled model picks it up."""
    hf = causal_lm("llama")
    hf.train()
    inner = copy.deepcopy(hf)
    ids, labels = batch()
    ref = step(hf, input_ids=ids, labels=labels)
    torch._dynamo.reset()
    compiled = torch.compile(inner, backend="aot_eager")
    report = fusewise.patch(compiled, norms=False, activations=False, rotary=False)
    (change,) = report.swapped
    assert (change.what, change.name) == ("loss", "_orig_mod")
    assert change.was.endswith("LlamaForCausalLM")
    out = step(compiled, input_ids=ids, labels=labels)
    assert out.logits is None
    torch.testing.assert_close(out.loss, ref.loss, **LOSS_TOL)
    assert_same_grads(hf, inner)
    assert fusewise.unpatch(compiled) == 2  # the model and its lm_head
    torch._dynamo.reset()


def test_every_label_ignored_gives_nan_as_hf():
    """HF's loss is a mean over the labels not ignored: NaN when there are none (a batch of
    padding), with zero gradients (F.cross_entropy's backward). The routed loss keeps both."""
    hf, patched, _ = pair("llama")
    ids, _ = batch()
    labels = torch.full_like(ids, -100)
    ref = step(hf, input_ids=ids, labels=labels)
    out = step(patched, input_ids=ids, labels=labels)
    assert torch.isnan(ref.loss) and torch.isnan(out.loss)
    assert_same_grads(hf, patched)  # zeros in both
