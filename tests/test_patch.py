import pickle

import pytest
import torch

import fusewise
from fusewise.examples.gpt import GPT, GPTConfig


class MyNorm(torch.nn.LayerNorm):
    def forward(self, x):
        return super().forward(x) * 2


class MyNormChild(MyNorm):  # inherits MyNorm's forward: its own code too
    def extra_repr(self):
        return "child"


class CallNorm(torch.nn.RMSNorm):
    def __call__(self, x):
        return super().__call__(x) + 1


class PlainNorm(torch.nn.LayerNorm):
    """No computation of its own: a repr and a state-dict hook (harmless to swap)."""

    def extra_repr(self):
        return "plain " + super().extra_repr()

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)


class PlainRMS(torch.nn.RMSNorm):
    pass


def test_patch_swaps_norms_in_place_and_keeps_parameters(device):
    c = GPTConfig(vocab=64, seq=16, d_model=32, heads=2, layers=2, batch=2)
    model = GPT(c, "clean").to(device)
    model.extra = torch.nn.Sequential(torch.nn.RMSNorm(32), MyNorm(32)).to(device)
    params = {n: p for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 32, device=device)
    before = [model.blocks[0].ln1(x), model.extra[0](x)]
    changes = fusewise.patch(model)
    swapped = {ch.name: ch.now for ch in changes}
    assert swapped["blocks.0.ln1"] == "fusewise.nn.LayerNorm"
    assert swapped["extra.0"] == "fusewise.nn.RMSNorm"
    assert next(ch for ch in changes if ch.name == "extra.0").was == (
        "torch.nn.modules.normalization.RMSNorm"
    )
    assert swapped["extra.1"] is None  # the user's forward is reported, not replaced
    left = next(ch for ch in changes if ch.name == "extra.1")
    assert left.was == "test_patch.MyNorm" and "test_patch.MyNorm.forward" in left.reason
    assert type(model.blocks[0].ln1) is fusewise.nn.LayerNorm and type(model.extra[1]) is MyNorm
    assert {n: p for n, p in model.named_parameters()} == params  # the same Parameter objects
    assert opt.param_groups[0]["params"][0] is next(model.parameters())
    after = [model.blocks[0].ln1(x), model.extra[0](x)]
    for a, b in zip(after, before):
        assert torch.allclose(a, b, atol=1e-5)
    assert fusewise.patch(model) == [ch for ch in changes if ch.now is None]  # idempotent


def test_subclass_without_its_own_forward_is_swapped_and_stays_the_users_class(device):
    model = torch.nn.Sequential(PlainNorm(32), PlainRMS(32), PlainNorm(32)).to(device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    x = torch.randn(3, 32, device=device)
    before = model(x)
    changes = fusewise.patch(model)
    assert [(ch.was, ch.now) for ch in changes] == [
        ("test_patch.PlainNorm", "fusewise.nn.LayerNorm"),
        ("test_patch.PlainRMS", "fusewise.nn.RMSNorm"),
        ("test_patch.PlainNorm", "fusewise.nn.LayerNorm"),
    ]
    assert "still a test_patch.PlainNorm" in changes[0].reason
    ln, rms = model[0], model[1]
    assert isinstance(ln, PlainNorm) and isinstance(ln, fusewise.nn.LayerNorm)
    assert isinstance(rms, PlainRMS) and isinstance(rms, fusewise.nn.RMSNorm)
    assert type(model[2]) is type(ln)  # one class per (user class, fused class)
    assert type(ln).forward is fusewise.nn.LayerNorm.forward
    assert "plain" in repr(ln)  # the user's other methods stay
    assert torch.allclose(model(x), before, atol=1e-5)
    ln.load_state_dict(ln.state_dict())
    assert fusewise.patch(model) == []  # idempotent


def test_swapped_subclass_pickles_and_copies(device):
    model = torch.nn.Sequential(PlainNorm(16), PlainRMS(16)).to(device)
    fusewise.patch(model)
    x = torch.randn(2, 16, device=device)
    for copy in (pickle.loads(pickle.dumps(model)), __import__("copy").deepcopy(model)):
        assert [type(m) for m in copy] == [type(m) for m in model]
        assert torch.equal(copy(x), model(x))


def test_subclass_with_its_own_forward_or_call_is_left_alone(device):
    model = torch.nn.Sequential(MyNormChild(8), CallNorm(8)).to(device)
    changes = fusewise.patch(model)
    assert [ch.now for ch in changes] == [None, None]
    assert "test_patch.MyNorm.forward" in changes[0].reason  # inherited from MyNorm
    assert "test_patch.CallNorm.__call__" in changes[1].reason
    assert type(model[0]) is MyNormChild and type(model[1]) is CallNorm


def test_patch_of_something_else_names_model():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got function"):
        fusewise.patch(lambda x: x)
