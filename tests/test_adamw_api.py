"""fusewise.optim.AdamW as a drop-in for torch.optim.AdamW: every constructor argument and group
key torch takes is accepted with the same meaning, accepted with a warning that it has no effect,
or refused with an error naming it; parameters that would make the kernel race are refused."""

import pytest
import torch

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
