"""fusewise.optim.AdamW as a drop-in for torch.optim.AdamW: every constructor argument and group
key torch takes is accepted with the same meaning, accepted with a warning that it has no effect,
or refused with an error naming it; parameters that would make the kernel race are refused."""

import inspect
import warnings

import pytest
import torch
from adamw_cases import clone, rel, run

import fusewise


def test_duplicate_parameter_in_a_group_raises(device):
    """torch warns (and will raise); two table rows on one tensor would race on the GPU."""
    p = torch.randn(5, device=device, requires_grad=True)
    with pytest.raises(ValueError, match="more than once"):
        fusewise.optim.AdamW([p, p])
    with pytest.raises(ValueError, match="more than once"):
        fusewise.optim.AdamW([{"params": [p, torch.randn(2, requires_grad=True), p]}])


def test_parameter_in_two_groups_raises(device):
    p = torch.randn(5, device=device, requires_grad=True)
    q = torch.randn(3, device=device, requires_grad=True)
    with pytest.raises(ValueError, match="more than one parameter group"):
        fusewise.optim.AdamW([{"params": [p]}, {"params": [q, p]}])
    opt = fusewise.optim.AdamW([p])
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [q, p]})
    assert len(opt.param_groups) == 1


def test_parameters_overlapping_in_memory_raise(device):
    """Distinct parameters that are views of one buffer, or state shared between parameters:
    one launch would write the same memory from two programs."""
    base = torch.zeros(10, device=device)
    a, b = base[:6].requires_grad_(), base[4:].requires_grad_()
    a.grad, b.grad = torch.ones(6, device=device), torch.ones(6, device=device)
    with pytest.raises(ValueError, match="overlap"):
        fusewise.optim.AdamW([a, b]).step()
    c = torch.randn(6, device=device, requires_grad=True)
    d = torch.randn(6, device=device, requires_grad=True)
    opt = fusewise.optim.AdamW([c, d])
    c.grad, d.grad = torch.ones_like(c), torch.ones_like(d)
    opt.step()
    opt.state[d]["exp_avg"] = opt.state[c]["exp_avg"]
    with pytest.raises(ValueError, match="overlap"):
        opt.step()


def test_signature_covers_torchs():
    """Every argument of torch.optim.AdamW, in its position; those with a meaning keep torch's
    default."""
    ours = inspect.signature(fusewise.optim.AdamW).parameters
    theirs = inspect.signature(torch.optim.AdamW).parameters
    assert list(theirs) == [n for n in ours if n in theirs]
    for name, par in theirs.items():
        assert ours[name].kind == par.kind and ours[name].default == par.default, name


OPTIONS = [("fused", True), ("foreach", True), ("capturable", True), ("foreach", False)]


@pytest.mark.parametrize("name, value", OPTIONS, ids=[f"{n}={v}" for n, v in OPTIONS])
def test_torch_implementation_options_are_accepted_with_one_warning(
    name, value, device, monkeypatch
):
    """nanoGPT's torch.optim.AdamW(groups, lr=..., betas=..., fused=True), swapped for fusewise's:
    fusewise is always fused and capturable, so these have no effect, said once per process."""
    monkeypatch.setattr(fusewise.optim, "_warned_no_effect", set())
    p = torch.randn(6, 4, device=device, requires_grad=True)
    b = torch.randn(4, device=device, requires_grad=True)
    groups = [{"params": [p], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}]
    with pytest.warns(UserWarning, match=f"{name}={value}.*no effect"):
        opt = fusewise.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), **{name: value})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        fusewise.optim.AdamW([torch.zeros(2, requires_grad=True)], **{name: value})
    p.grad, b.grad = torch.ones_like(p), torch.ones_like(b)
    opt.step()
    assert opt.state[p]["step"].item() == 1


def test_torch_implementation_options_in_a_group_warn_too(device, monkeypatch):
    monkeypatch.setattr(fusewise.optim, "_warned_no_effect", set())
    p = torch.randn(3, device=device, requires_grad=True)
    with pytest.warns(UserWarning, match="fused=True.*no effect"):
        fusewise.optim.AdamW([{"params": [p], "fused": True}])


def test_differentiable_is_refused_wherever_it_comes_from(device):
    p = torch.randn(3, device=device, requires_grad=True)
    with pytest.raises(ValueError, match="differentiable"):
        fusewise.optim.AdamW([p], differentiable=True)
    with pytest.raises(ValueError, match="differentiable"):
        fusewise.optim.AdamW([{"params": [p], "differentiable": True}])
    sd = torch.optim.AdamW([p], differentiable=True).state_dict()
    opt = fusewise.optim.AdamW([p])
    with pytest.raises(ValueError, match="differentiable"):
        opt.load_state_dict(sd)
    fusewise.optim.AdamW([p], differentiable=False)  # torch's default: fine


def test_decoupled_weight_decay_as_torchs_adamw(device):
    """torch.optim.AdamW has no such argument (TypeError); a group asking for Adam's coupled
    decay would be silently decoupled, so it raises; a loaded state_dict is decoupled, as in
    torch.optim.AdamW.__setstate__."""
    p = torch.randn(3, device=device, requires_grad=True)
    for cls in (torch.optim.AdamW, fusewise.optim.AdamW):
        with pytest.raises(TypeError):
            cls([p], decoupled_weight_decay=False)
    with pytest.raises(ValueError, match="decoupled_weight_decay"):
        fusewise.optim.AdamW([{"params": [p], "decoupled_weight_decay": False}])
    opt = fusewise.optim.AdamW([p])
    opt.load_state_dict(torch.optim.Adam([p], weight_decay=0.1).state_dict())
    assert opt.param_groups[0]["decoupled_weight_decay"] is True


def test_betas_as_tensors(device):
    """torch takes 1-element tensors; fusewise reads them on the host each step (1 - beta and
    log(beta) in double), so a tensor on a device, which would sync every step, is refused."""
    params = [torch.randn(50, device=device) for _ in range(2)]
    grads = [[torch.randn(50, device=device) for _ in range(2)] for _ in range(3)]
    betas = (torch.tensor(0.8), torch.tensor([0.99]))
    out = []
    # torch takes them on its for-loop path only (its foreach path, a GPU's default, refuses)
    for cls, kw in ((fusewise.optim.AdamW, {}), (torch.optim.AdamW, dict(foreach=False))):
        ps = clone(params)
        run(cls, ps, grads, 3, lambda ps: ps, lr=1e-2, betas=betas, **kw)
        out.append(ps)
    for a, b in zip(*out):
        assert rel(a, b) < 1e-6
    meta = (torch.tensor(0.9, device="meta"), torch.tensor(0.99, device="meta"))
    with pytest.raises(ValueError, match="betas"):
        fusewise.optim.AdamW(params, betas=meta)


def test_named_parameters_as_torch(device):
    model = torch.nn.Linear(3, 2).to(device)
    opt = fusewise.optim.AdamW(model.named_parameters(), lr=1e-2)
    assert opt.param_groups[0]["param_names"] == ["weight", "bias"]
    opt.add_param_group({"params": [("extra", torch.randn(2, device=device, requires_grad=True))]})
    model(torch.randn(4, 3, device=device)).sum().backward()
    opt.step()
    assert (
        torch.optim.AdamW(model.named_parameters()).state_dict()["param_groups"][0]["param_names"]
        == opt.state_dict()["param_groups"][0]["param_names"]
    )
