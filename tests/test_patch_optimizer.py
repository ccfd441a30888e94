"""fusewise.patch_optimizer: a torch.optim.AdamW becomes fusewise.optim.AdamW in place, mid-run,
and the run goes on as torch's would (params, state, LR schedule, GradScaler, hooks); what it
cannot swap exactly is left alone and said why."""

import warnings

import pytest
import torch
import torch.optim.optimizer as torch_optimizer
from adamw_cases import rel

import fusewise
from fusewise.ops import _dispatch
from fusewise.patch import LEFT_ALONE, SWAPPED, patch_optimizer, unpatch_optimizer

SHAPES = [(17, 5), (33,), (3, 4, 6), (1,)]
STEPS = 6
SWAP_AT = 3
TORCH_CLASSES = (torch.optim.AdamW, torch.optim.Adam)


@pytest.fixture
def spy(monkeypatch):
    """Counts fusewise's fused group steps; paths() starts empty so it says what ran here."""
    calls = []
    real = fusewise.optim.step_group

    def step_group(*args, **kwargs):
        calls.append(len(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(fusewise.optim, "step_group", step_group)
    monkeypatch.setattr(_dispatch, "_last_path", {})
    return calls


def make(device, dtype=torch.float32):
    gen = torch.Generator().manual_seed(1)
    p0 = [torch.randn(s, generator=gen).to(device, dtype) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen).to(device, dtype) for s in SHAPES] for _ in range(9)]
    return p0, grads


def fresh(p0):
    return [p.clone().requires_grad_() for p in p0]


def step(opt, params, grads, sched=None):
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()
    if sched is not None:
        sched.step()


def assert_same(opt_a, pa, opt_b, pb, tol=1e-5):
    for a, b in zip(pa, pb):
        assert rel(a, b) < tol
        sa, sb = opt_a.state[a], opt_b.state[b]
        assert sa.keys() - {"master_param"} == sb.keys() - {"master_param"}
        for key in sa.keys() & sb.keys():
            if key == "step":
                assert float(sa[key]) == float(sb[key])
            else:
                assert rel(sa[key], sb[key]) < tol, key


CASES = {
    "plain": dict(lr=1e-2, weight_decay=0.0),
    "decay+amsgrad": dict(lr=1e-2, weight_decay=0.1, amsgrad=True),
    "maximize": dict(lr=5e-3, weight_decay=0.05, maximize=True, betas=(0.8, 0.95), eps=1e-6),
    "tensor-lr": dict(lr=torch.tensor(1e-2), weight_decay=0.1, foreach=False),
    "fused": dict(lr=1e-2, weight_decay=0.1, amsgrad=True, fused=True),
}


@pytest.mark.parametrize("case", CASES)
def test_swap_midway_equals_torch(case, device, spy):
    """torch AdamW for SWAP_AT steps, swapped, then the rest == torch AdamW for all steps; two
    groups with their own hyper-parameters; the fused step is what ran after the swap."""
    kw = CASES[case]
    if kw.get("fused") and device.type == "cpu" and not hasattr(torch, "_fused_adamw_"):
        pytest.skip("no fused AdamW in this torch")
    p0, grads = make(device)
    ref, pat = fresh(p0), fresh(p0)

    def groups(ps):
        return [{"params": ps[:2]}, {"params": ps[2:], "lr": 3e-3, "weight_decay": 0.0}]

    opt_ref = torch.optim.AdamW(groups(ref), **kw)
    opt = torch.optim.AdamW(groups(pat), **kw)
    for t in range(STEPS):
        if t == SWAP_AT:
            change = patch_optimizer(opt)
            assert (change.action, change.was, change.now, change.what) == (
                SWAPPED,
                "torch.optim.adamw.AdamW",
                "fusewise.optim.AdamW",
                "optimizer",
            )
            assert type(opt) is fusewise.optim.AdamW and spy == []
        step(opt_ref, ref, grads[t])
        step(opt, pat, grads[t])
    assert_same(opt_ref, ref, opt, pat)
    assert spy == [2, 2] * (STEPS - SWAP_AT)  # two groups a step
    assert fusewise.ops.paths()["adamw"] in (_dispatch.TRITON, _dispatch.INTERPRETER)


def test_lr_scheduler_made_before_the_swap(device, spy):
    """The scheduler's instance-level step wrapper bound torch's step: after the swap the fused
    step runs, the scheduler counts it (no 'lr_scheduler.step() before optimizer.step()'), and
    lr follows the schedule as in the torch run."""
    p0, grads = make(device)
    ref, pat = fresh(p0), fresh(p0)
    opts = [torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1) for ps in (ref, pat)]
    scheds = [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=2e-2, total_steps=10) for o in opts]
    patch_optimizer(opts[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(STEPS):
            for o, s, ps in zip(opts, scheds, (ref, pat)):
                step(o, ps, grads[t], s)
            assert opts[1].param_groups[0]["lr"] == opts[0].param_groups[0]["lr"]
    assert not [w for w in caught if "lr_scheduler" in str(w.message)], caught
    assert scheds[1].last_epoch == STEPS and len(spy) == STEPS
    assert_same(opts[0], ref, opts[1], pat)
    assert unpatch_optimizer(opts[1])  # the scheduler's own wrapper back: torch's step again
    step(opts[1], pat, grads[STEPS], scheds[1])
    step(opts[0], ref, grads[STEPS], scheds[0])
    assert len(spy) == STEPS
    assert_same(opts[0], ref, opts[1], pat)


def test_lr_scheduler_made_while_patched_then_unpatched(device, spy):
    """A scheduler made after the swap binds fusewise's step; unpatch makes it run torch's."""
    p0, grads = make(device)
    ref, pat = fresh(p0), fresh(p0)
    opt_ref = torch.optim.AdamW(ref, lr=1e-2)
    opt = torch.optim.AdamW(pat, lr=1e-2)
    patch_optimizer(opt)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)
    sched_ref = torch.optim.lr_scheduler.StepLR(opt_ref, 2, gamma=0.5)
    step(opt, pat, grads[0], sched)
    step(opt_ref, ref, grads[0], sched_ref)
    unpatch_optimizer(opt)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(1, 4):
            step(opt, pat, grads[t], sched)
            step(opt_ref, ref, grads[t], sched_ref)
    assert not [w for w in caught if "lr_scheduler" in str(w.message)], caught
    assert len(spy) == 1 and type(opt) is torch.optim.AdamW
    assert_same(opt_ref, ref, opt, pat)


def test_unpatch_restores_torch_class_state_and_behaviour(device, spy):
    p0, grads = make(device)
    ref, pat = fresh(p0), fresh(p0)
    opt_ref = torch.optim.AdamW(ref, lr=1e-2, amsgrad=True)
    opt = torch.optim.AdamW(pat, lr=1e-2, amsgrad=True)
    groups_before = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    for t in range(4):
        if t == 1:
            patch_optimizer(opt)
        if t == 3:
            assert unpatch_optimizer(opt) and not unpatch_optimizer(opt)
        step(opt, pat, grads[t])
        step(opt_ref, ref, grads[t])
    assert type(opt) is torch.optim.AdamW and len(spy) == 2
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == (
        groups_before
    )
    assert not [k for k in vars(opt) if "fusewise" in k or k in ("_buckets", "_synced")]
    st = opt.state[pat[0]]
    assert st["step"].device.type == "cpu" and st["step"].dtype == torch.float32
    assert_same(opt_ref, ref, opt, pat)


def test_step_hooks_fire_once_per_step(device):
    """Instance hooks registered before the swap and torch's global post hook (the diagnosis
    uses it) fire once per step, with or without a scheduler's wrapper."""
    p0, grads = make(device)
    pat = fresh(p0)
    opt = torch.optim.AdamW(pat, lr=1e-2)
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: seen.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: seen.append("post"))
    handle = torch_optimizer.register_optimizer_step_post_hook(
        lambda o, a, k: seen.append(type(o).__module__)
    )
    try:
        patch_optimizer(opt)
        step(opt, pat, grads[0])
        torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
        step(opt, pat, grads[1])
    finally:
        handle.remove()
    assert seen == ["pre", "post", "fusewise.optim"] * 2


def test_grad_scaler(device, spy):
    """GradScaler hands fusewise the scale and found_inf (unscaled in the kernel, a step with an
    inf skipped on the device): the same run as torch's, the inf step skipped in both."""
    if not hasattr(torch.amp, "GradScaler"):
        pytest.skip("no torch.amp.GradScaler")
    gen = torch.Generator().manual_seed(2)
    w0, x = torch.randn(8, 4, generator=gen), torch.randn(16, 8, generator=gen)
    runs = []
    for patched in (False, True):
        w = w0.to(device, copy=True).requires_grad_()
        opt = torch.optim.AdamW([w], lr=1e-2, weight_decay=0.1)
        scaler = torch.amp.GradScaler(device.type, init_scale=2.0**8, growth_interval=2)
        for t in range(6):
            if t == 2 and patched:
                patch_optimizer(opt)
            loss = ((x.to(device) @ w) ** 2).mean() * (t + 1)
            scaler.scale(loss).backward()
            if t == 3:
                w.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
        runs.append((w, opt, scaler.get_scale()))
    (wa, oa, sa), (wb, ob, sb) = runs
    assert sa == sb and float(ob.state[wb]["step"]) == 5.0
    assert_same(oa, [wa], ob, [wb])
    assert len(spy) == 4  # steps 2..5 went to fusewise, the inf one skipped on the device


def test_state_dict_round_trips_with_torch(device):
    p0, grads = make(device)
    ref, pat, other = fresh(p0), fresh(p0), fresh(p0)
    opt_ref = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1)
    opt = torch.optim.AdamW(pat, lr=1e-2, weight_decay=0.1)
    for t in range(2):
        step(opt_ref, ref, grads[t])
        step(opt, pat, grads[t])
    patch_optimizer(opt)
    opt.load_state_dict(opt_ref.state_dict())  # a torch checkpoint into the swapped one
    step(opt, pat, grads[2])
    step(opt_ref, ref, grads[2])
    back = torch.optim.AdamW(other, lr=1.0)  # the swapped one's checkpoint into torch's
    with torch.no_grad():
        for o, p in zip(other, pat):
            o.copy_(p)
    back.load_state_dict(opt.state_dict())
    step(back, other, grads[3])
    step(opt_ref, ref, grads[3])
    assert_same(opt_ref, ref, back, other)


def test_adam_without_l2_decay_is_swapped(device, spy):
    p0, grads = make(device)
    for kw in (dict(weight_decay=0.0), dict(weight_decay=0.1, decoupled_weight_decay=True)):
        ref, pat = fresh(p0), fresh(p0)
        opt_ref, opt = torch.optim.Adam(ref, lr=1e-2, **kw), torch.optim.Adam(pat, lr=1e-2, **kw)
        step(opt_ref, ref, grads[0])
        step(opt, pat, grads[0])
        change = patch_optimizer(opt)
        assert change.action == SWAPPED and change.was == "torch.optim.adam.Adam"
        for t in (1, 2):
            step(opt_ref, ref, grads[t])
            step(opt, pat, grads[t])
        assert_same(opt_ref, ref, opt, pat)
        unpatch_optimizer(opt)
        assert opt.param_groups[0]["decoupled_weight_decay"] == kw.get(
            "decoupled_weight_decay", False
        )
    assert len(spy) == 4


class OwnStep(torch.optim.AdamW):
    def step(self, closure=None):
        return super().step(closure)


class NoOwnStep(torch.optim.AdamW):
    def extra(self):
        return "mine"


def _left_alone(make_opt, device):
    p0, grads = make(device)
    pat = fresh(p0)
    opt = make_opt(pat)
    for p, g in zip(pat, grads[0]):
        p.grad = g.clone()
    return opt


LEFT = {
    "sgd": (lambda ps: torch.optim.SGD(ps, lr=0.1), "not an AdamW"),
    "adam-l2": (lambda ps: torch.optim.Adam(ps, weight_decay=0.1), "adds L2 decay"),
    "differentiable": (lambda ps: torch.optim.AdamW(ps, differentiable=True), "differentiable"),
    "own-step": (lambda ps: OwnStep(ps), "its own step"),
    "twice": (lambda ps: torch.optim.AdamW([{"params": ps + ps[:1]}]), "appears twice"),
}


@pytest.mark.parametrize("case", LEFT)
def test_left_alone_with_a_reason(case, device):
    make_opt, why = LEFT[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about a parameter listed twice
        opt = _left_alone(make_opt, device)
    cls, keys = type(opt), set(vars(opt))
    change = patch_optimizer(opt)
    assert change.action == LEFT_ALONE and change.now is None and why in change.reason
    assert change.what == "optimizer" and type(opt) is cls and set(vars(opt)) == keys
    assert not unpatch_optimizer(opt)


@pytest.mark.parametrize("kind", ["sparse", "complex", "float64", "strided"])
def test_parameters_fusewise_refuses_are_left_alone(kind, device):
    p = torch.randn(6, 4, device=device)
    if kind == "complex":
        p = torch.randn(6, 4, dtype=torch.complex64, device=device)
    if kind == "float64":
        p = p.double()
    if kind == "strided":
        p = p.t()
    p.requires_grad_()
    if kind == "sparse":
        p.grad = torch.randn(6, 4, device=device).to_sparse()
    opt = torch.optim.AdamW([p])
    change = patch_optimizer(opt)
    assert change.action == LEFT_ALONE and type(opt) is torch.optim.AdamW, change


def test_subclass_without_a_step_of_its_own(device, spy):
    p0, grads = make(device)
    ref, pat = fresh(p0), fresh(p0)
    opt_ref, opt = torch.optim.AdamW(ref, lr=1e-2), NoOwnStep(pat, lr=1e-2)
    change = patch_optimizer(opt)
    assert change.action == SWAPPED and change.was.endswith("NoOwnStep")
    assert isinstance(opt, NoOwnStep) and isinstance(opt, fusewise.optim.AdamW)
    assert opt.extra() == "mine"
    for t in range(2):
        step(opt_ref, ref, grads[t])
        step(opt, pat, grads[t])
    assert_same(opt_ref, ref, opt, pat) is None and len(spy) == 2
    again = patch_optimizer(opt)
    assert again.action == LEFT_ALONE and "already patched" in again.reason
    assert unpatch_optimizer(opt) and type(opt) is NoOwnStep


def test_fusewise_adamw_and_non_optimizers():
    opt = fusewise.optim.AdamW([torch.zeros(3, requires_grad=True)])
    change = patch_optimizer(opt)
    assert change.action == LEFT_ALONE and "already fusewise" in change.reason
    assert not unpatch_optimizer(opt)
    with pytest.raises(TypeError):
        patch_optimizer(torch.nn.Linear(2, 2))
