"""fusewise.optim.AdamW's state: what a loaded checkpoint or a changed parameter may hold
(layouts, shapes, group keys, masters) against what the kernel's pointer table needs."""

import copy

import pytest
import torch
from adamw_cases import clone, rel, resume_and_compare, run
from layouts import relayout

import fusewise


def test_torch_checkpoint_with_non_contiguous_state_resumes(device):
    """torch keeps a transposed parameter's moments transposed (zeros_like, preserve_format);
    resumed on a contiguous parameter they must be read in logical order, not storage order."""
    w0 = torch.randn(24, 40, device=device)
    grads = [[torch.randn(40, 24, device=device)] for _ in range(5)]
    kw = dict(lr=1e-2, amsgrad=True)
    a = [w0.t().detach().clone().requires_grad_()]  # stored transposed, as a leaf
    ta = run(torch.optim.AdamW, a, grads[:2], 2, lambda ps: ps, **kw)
    assert not ta.state[a[0]]["exp_avg"].is_contiguous()
    ref = [w0.t().detach().clone().requires_grad_()]
    run(torch.optim.AdamW, ref, grads, 5, lambda ps: ps, **kw)
    b = [a[0].detach().contiguous().requires_grad_()]
    fb = fusewise.optim.AdamW(b, **kw)
    fb.load_state_dict(ta.state_dict())
    resume_and_compare(fb, b, [[g.contiguous() for g in gs] for gs in grads[2:]], ref)


@pytest.mark.parametrize("key", ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"])
@pytest.mark.parametrize("kind", ["strided", "padded", "transposed", "offset"])
def test_state_tensors_in_any_layout_are_read_in_logical_order(kind, key, device):
    """A state tensor the kernel is handed (by a checkpoint, or directly) in another layout, or
    at a misaligned offset (the kernel's alignment hint must then be off): same as torch."""
    w0 = torch.randn(16, 24, device=device)
    g = torch.randn(16, 24, device=device)
    m, v = torch.randn(16, 24, device=device), torch.rand(16, 24, device=device)
    vmax = v + torch.rand(16, 24, device=device)
    out = []
    for cls in (fusewise.optim.AdamW, torch.optim.AdamW):
        p = w0.clone().requires_grad_()
        opt = cls([p], lr=1e-2, amsgrad=True)
        st = {"step": torch.tensor(3.0), "exp_avg": m, "exp_avg_sq": v, "max_exp_avg_sq": vmax}
        st = {k: t.clone() for k, t in st.items()}
        st[key] = relayout(st[key], kind)
        opt.state[p] = st
        p.grad = g.clone()
        opt.step()
        out.append(p)
    assert rel(*out) < 1e-6


def test_master_param_at_a_misaligned_offset(device):
    """Every pointer in the table counts for the alignment hint, the master's too."""
    p = torch.randn(64, device=device).bfloat16().requires_grad_()
    opt = fusewise.optim.AdamW([p], lr=1e-2, master_weights=True)
    p.grad = torch.randn_like(p)
    opt.step()
    st = opt.state[p]
    st["master_param"] = relayout(st["master_param"], "offset")
    expected = st["master_param"].clone()
    p.grad = torch.randn_like(p)
    ref = torch.optim.AdamW([expected.requires_grad_()], lr=1e-2)
    ref.state[expected] = {k: st[k].clone() for k in ("exp_avg", "exp_avg_sq")}
    ref.state[expected]["step"] = st["step"].cpu().clone()
    expected.grad = p.grad.float()
    opt.step()
    ref.step()
    assert rel(st["master_param"], expected) < 1e-6


@pytest.mark.parametrize("key", ["exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"])
def test_checkpoint_with_a_wrong_shape_raises(key, device):
    p = torch.randn(8, 5, device=device, requires_grad=True)
    opt = run(fusewise.optim.AdamW, [p], [[torch.randn_like(p)]], 1, lambda ps: ps, amsgrad=True)
    sd = opt.state_dict()
    sd["state"][0][key] = torch.zeros(2) if key == "step" else torch.zeros(5, 8, device=device)
    q = p.detach().clone().requires_grad_()
    with pytest.raises(ValueError, match=f"{key}.*shape"):
        fusewise.optim.AdamW([q], amsgrad=True).load_state_dict(sd)
    opt.state[p][key] = sd["state"][0][key]  # set directly: caught before the kernel runs
    p.grad = torch.randn_like(p)
    with pytest.raises(ValueError, match=f"{key}.*shape"):
        opt.step()


def test_parameter_reshaped_under_its_gradient_raises(device):
    p = torch.randn(6, device=device, requires_grad=True)
    p.grad = torch.randn(6, device=device)
    p.data = torch.randn(9, device=device)  # torch leaves the old 6-element grad in place
    with pytest.raises(ValueError, match="gradient"):
        fusewise.optim.AdamW([p]).step()


def test_loaded_state_is_a_copy(device):
    """A state_dict loaded into a second optimizer must not share tensors with the first (torch
    hands the step tensor over as is): stepping one leaves the other's step count alone."""
    p = torch.randn(10, device=device, requires_grad=True)
    a = run(fusewise.optim.AdamW, [p], [[torch.randn_like(p)]] * 2, 2, lambda ps: ps)
    q = clone([p])
    b = fusewise.optim.AdamW(q)
    b.load_state_dict(a.state_dict())
    q[0].grad = torch.randn_like(q[0])
    b.step()
    assert a.state[p]["step"].item() == 2 and b.state[q[0]]["step"].item() == 3


def test_checkpoint_with_a_number_as_step(device):
    """Checkpoints of torch < 1.12 keep the step as a number; torch's Adam converts it."""
    p = torch.randn(10, device=device, requires_grad=True)
    a = run(torch.optim.AdamW, [p], [[torch.randn_like(p)]] * 2, 2, lambda ps: ps)
    sd = a.state_dict()
    sd["state"][0]["step"] = 2
    out = []
    for cls in (fusewise.optim.AdamW, torch.optim.AdamW):
        q = clone([p])
        opt = cls(q)
        opt.load_state_dict(sd)
        q[0].grad = torch.ones_like(p)
        opt.step()
        out.append(q[0])
    assert rel(*out) < 1e-6


def test_torch_checkpoint_keeps_master_weights_on(device):
    """torch's state_dict has no master_weights key: the optimizer's own setting stays, the
    masters are the parameters upcast and the bf16 moments become fp32."""
    w0 = torch.randn(300, device=device).bfloat16()
    grads = [torch.randn(300, device=device).bfloat16() for _ in range(5)]
    a = [w0.clone().requires_grad_()]
    ta = run(torch.optim.AdamW, a, [[g] for g in grads[:2]], 2, lambda ps: ps, lr=1e-2)
    sd = ta.state_dict()
    b = [a[0].detach().clone().requires_grad_()]
    fb = fusewise.optim.AdamW(b, lr=1e-2, master_weights=True)
    fb.load_state_dict(sd)
    assert fb.param_groups[0]["master_weights"] is True
    # fp32 reference: the bf16 parameter and moments upcast, then fp32 AdamW
    ref = [b[0].detach().float().requires_grad_()]
    tref = torch.optim.AdamW(ref, lr=1e-2)
    tref.load_state_dict(sd)
    tref.state[ref[0]].update({k: ta.state[a[0]][k].float() for k in ("exp_avg", "exp_avg_sq")})
    for g in grads[2:]:
        b[0].grad, ref[0].grad = g.clone(), g.float()
        fb.step()
        tref.step()
    st = fb.state[b[0]]
    assert {st[k].dtype for k in ("master_param", "exp_avg", "exp_avg_sq")} == {torch.float32}
    assert rel(st["master_param"], ref[0]) < 2e-6
    assert torch.equal(b[0].detach(), st["master_param"].bfloat16())


def test_fusewise_checkpoint_keeps_its_master_weights(device):
    p = torch.randn(100, device=device).bfloat16().requires_grad_()
    grads = [[torch.randn_like(p)]]
    opt = run(fusewise.optim.AdamW, [p], grads, 1, lambda ps: ps, master_weights=True)
    q = p.detach().clone().requires_grad_()
    opt2 = fusewise.optim.AdamW([q])  # master_weights=False, but the checkpoint says True
    opt2.load_state_dict(opt.state_dict())
    assert opt2.param_groups[0]["master_weights"] is True
    assert torch.equal(opt2.state[q]["master_param"], opt.state[p]["master_param"])


def _fill(model, p):
    with torch.no_grad():
        p.fill_(0.5)


def _copy(model, p):
    with torch.no_grad():
        p.copy_(torch.randn_like(p))


def _load_model(model, p):
    model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})


def _replace_data(model, p):
    p.data = torch.randn_like(p)


def _restore_after_diagnosis(model, p):
    """What fusewise.diagnose(restore=[model]) does: save, run steps, load the saved state."""
    saved = copy.deepcopy(model.state_dict())
    for _ in range(2):
        _step(model)
    model.load_state_dict(saved)


def _data_write_then_sync(model, p):
    """p.data has a version counter of its own: the documented case for sync_master_weights."""
    p.data.mul_(-1.0)
    model.opt.sync_master_weights()


def _nothing(model, p):
    pass


def _step(model):
    for q in model.parameters():
        q.grad = torch.randn_like(q)
    model.opt.step()


CHANGES = [_fill, _copy, _load_model, _replace_data, _restore_after_diagnosis]
CHANGES += [_data_write_then_sync, _nothing]


@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__.strip("_"))
def test_master_follows_parameters_changed_outside_the_optimizer(change, device):
    """The master is the parameter's fp32 copy: a parameter changed outside the optimizer must
    not be undone by the stale master at the next step. Where the master still rounds to the
    parameter's value it keeps its extra precision; elsewhere it is the parameter upcast."""
    model = torch.nn.Linear(40, 24).to(device=device, dtype=torch.bfloat16)
    model.opt = fusewise.optim.AdamW(model.parameters(), lr=1e-2, master_weights=True)
    for _ in range(2):
        _step(model)
    p = model.weight
    version = p._version
    _step(model)
    assert p._version == version  # the kernel writes through pointers: no version bump of its own
    change(model, p)
    st = model.opt.state[p]
    p_now = p.detach()
    master = torch.where(st["master_param"].bfloat16() == p_now, st["master_param"], p_now.float())
    ref = [master.clone().requires_grad_()]
    tref = torch.optim.AdamW(ref, lr=1e-2)
    tref.state[ref[0]] = {k: st[k].clone() for k in ("exp_avg", "exp_avg_sq")}
    tref.state[ref[0]]["step"] = st["step"].cpu().clone()
    _step(model)
    ref[0].grad = p.grad.float()
    tref.step()
    assert rel(st["master_param"], ref[0]) < 2e-6
    assert torch.equal(p.detach(), st["master_param"].bfloat16())


@pytest.mark.gpu
def test_changed_parameter_before_a_cuda_graph_capture_raises():
    p = torch.randn(64, device="cuda").bfloat16().requires_grad_()
    p.grad = torch.randn_like(p)
    opt = fusewise.optim.AdamW([p], lr=torch.tensor(1e-2, device="cuda"), master_weights=True)
    opt.step()
    with torch.no_grad():
        p.fill_(1.0)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="sync_master_weights"):
        with torch.cuda.graph(g):
            opt.step()
