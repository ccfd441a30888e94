"""fusewise.optim.AdamW against torch.optim.AdamW: trajectories (held to a float64 run, no worse
than torch's own fp32 error), master weights, GradScaler, checkpoints both ways, errors.
The kernel runs for real: on the GPU, or on the CPU under the Triton interpreter."""

import pytest
import torch
from adamw_cases import clone, make_params, rel, resume_and_compare, run

import fusewise
from fusewise.ops import _dispatch

CASES = {
    "plain": dict(kw=dict(lr=1e-2), groups=lambda ps: ps),
    "weight-decay": dict(kw=dict(lr=3e-3, weight_decay=0.3), groups=lambda ps: ps),
    "amsgrad": dict(kw=dict(lr=1e-2, amsgrad=True), groups=lambda ps: ps),
    "maximize": dict(kw=dict(lr=1e-2, maximize=True), groups=lambda ps: ps),
    "groups": dict(
        kw=dict(lr=1e-2),
        groups=lambda ps: [
            {"params": ps[:3], "lr": 5e-3, "betas": (0.8, 0.95), "weight_decay": 0.0},
            {"params": ps[3:], "eps": 1e-6, "amsgrad": True},
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_trajectory_matches_torch(case, device):
    c = CASES[case]
    params = make_params(device)
    steps = 20
    grads = [[torch.randn_like(p) for p in params] for _ in range(steps)]
    set_none = {(3, 0), (4, 0), (7, 2)}  # zero_grad(set_to_none) left these grads None
    ours = clone(params)
    run(fusewise.optim.AdamW, ours, grads, steps, c["groups"], set_none, **c["kw"])
    theirs = clone(params)
    run(torch.optim.AdamW, theirs, grads, steps, c["groups"], set_none, **c["kw"])
    exact = clone(params, torch.float64)
    run(torch.optim.AdamW, exact, grads, steps, c["groups"], set_none, **c["kw"])
    for o, t, e in zip(ours, theirs, exact):
        assert rel(o, e) <= 2 * rel(t, e) + 1e-6, (rel(o, e), rel(t, e))


def test_master_weights_track_an_fp32_optimizer(device):
    params = make_params(device)
    steps = 12
    grads = [[torch.randn_like(p).bfloat16() for p in params] for _ in range(steps)]
    model = clone(params, torch.bfloat16)
    opt = run(
        fusewise.optim.AdamW,
        model,
        grads,
        steps,
        lambda ps: ps,
        lr=1e-2,
        weight_decay=0.1,
        master_weights=True,
    )
    # fp32 reference: the same bf16 gradients, upcast, on fp32 copies of the bf16 start
    ref = clone([p.bfloat16().float() for p in params])
    run(
        torch.optim.AdamW,
        ref,
        [[g.float() for g in gs] for gs in grads],
        steps,
        lambda ps: ps,
        lr=1e-2,
        weight_decay=0.1,
    )
    for p, r in zip(model, ref):
        st = opt.state[p]
        assert st["master_param"].dtype == torch.float32
        assert st["exp_avg"].dtype == torch.float32 and st["exp_avg_sq"].dtype == torch.float32
        assert rel(st["master_param"], r) < 2e-6
        assert torch.equal(
            p.detach(), st["master_param"].bfloat16()
        )  # the model is the master, rounded


def test_bf16_without_master_keeps_bf16_state(device):
    p = torch.randn(300, device=device, dtype=torch.bfloat16, requires_grad=True)
    opt = fusewise.optim.AdamW([p], lr=1e-2)
    p.grad = torch.randn_like(p)
    opt.step()
    assert opt.state[p]["exp_avg"].dtype == torch.bfloat16
    assert "master_param" not in opt.state[p]


@pytest.mark.parametrize("inf_at", [None, 2])
def test_grad_scaler_unscales_and_skips_inf_steps(inf_at, device):
    torch.manual_seed(1)
    w0 = torch.randn(64, 32, device=device)
    x = torch.randn(16, 64, device=device)
    results = []
    for opt_cls in (fusewise.optim.AdamW, torch.optim.AdamW):
        w = w0.clone().requires_grad_()
        opt = opt_cls([w], lr=1e-2)
        scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
        for t in range(4):
            opt.zero_grad()
            loss = (x @ w).square().mean()
            scaler.scale(loss).backward()
            if t == inf_at:
                w.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
        results.append((w.detach().clone(), opt.state[w]["step"].item(), scaler.get_scale()))
    (ours, our_steps, our_scale), (theirs, their_steps, their_scale) = results
    assert our_steps == their_steps == (3 if inf_at is not None else 4)
    assert our_scale == their_scale
    assert rel(ours, theirs) < 1e-5


def test_checkpoint_round_trips_with_torch(device):
    params = make_params(device)
    grads = [[torch.randn_like(p) for p in params] for _ in range(6)]
    kw = dict(lr=1e-2, weight_decay=0.05, amsgrad=True)
    # torch -> fusewise: 3 steps in torch, resume in fusewise; against 6 steps in torch
    a = clone(params)
    ta = run(torch.optim.AdamW, a, grads[:3], 3, lambda ps: ps, **kw)
    b = clone(a)
    fb = fusewise.optim.AdamW(b, **kw)
    fb.load_state_dict(ta.state_dict())
    ref = clone(params)
    run(torch.optim.AdamW, ref, grads, 6, lambda ps: ps, **kw)
    resume_and_compare(fb, b, grads[3:], ref)
    # fusewise -> torch, and the state keys are torch's
    c = clone(params)
    fc = run(fusewise.optim.AdamW, c, grads[:3], 3, lambda ps: ps, **kw)
    sd = fc.state_dict()
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
    d = clone(c)
    td = torch.optim.AdamW(d, **kw)
    td.load_state_dict(sd)
    assert td.param_groups[0]["decoupled_weight_decay"] is True
    resume_and_compare(td, d, grads[3:], ref)


def test_master_weights_survive_a_checkpoint(device):
    p = torch.randn(1000, device=device).bfloat16().requires_grad_()
    opt = fusewise.optim.AdamW([p], lr=1e-2, master_weights=True)
    for _ in range(3):
        p.grad = torch.randn_like(p)
        opt.step()
    sd = opt.state_dict()
    q = p.detach().clone().requires_grad_()
    opt2 = fusewise.optim.AdamW([q], lr=1e-2, master_weights=True)
    opt2.load_state_dict(sd)
    for key in ("master_param", "exp_avg", "exp_avg_sq"):
        assert opt2.state[q][key].dtype == torch.float32  # not rounded to the bf16 param dtype
        assert torch.equal(opt2.state[q][key], opt.state[p][key])


def test_lr_scheduler_and_tensor_lr(device):
    params = make_params(device, sizes=[100, 33])
    grads = [[torch.randn_like(p) for p in params] for _ in range(6)]
    out = []
    for cls, lr in (
        (fusewise.optim.AdamW, torch.tensor(0.01, device=device)),
        (torch.optim.AdamW, 0.01),
    ):
        ps = clone(params)
        opt = cls(ps, lr=lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        for t in range(6):
            for p, g in zip(ps, grads[t]):
                p.grad = g.clone()
            opt.step()
            sched.step()
        out.append(ps)
    for a, b in zip(*out):
        assert rel(a, b) < 1e-5


def test_errors_name_the_problem(device):
    c = torch.randn(4, dtype=torch.complex64, device=device, requires_grad=True)
    with pytest.raises(TypeError, match="complex"):
        fusewise.optim.AdamW([c])
    e = torch.nn.Embedding(10, 4, sparse=True).to(device)
    opt = fusewise.optim.AdamW(e.parameters())
    e(torch.tensor([1, 2], device=device)).sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradients"):
        opt.step()
    t = torch.randn(4, 6, device=device).t().requires_grad_()  # a non-contiguous leaf
    t.grad = torch.randn(4, 6, device=device).t()
    with pytest.raises(ValueError, match="make it contiguous"):
        fusewise.optim.AdamW([t]).step()
    with pytest.raises(ValueError, match="Invalid learning rate"):
        fusewise.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=-1)


def test_cpu_without_interpreter_runs_reference_with_warning(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("FUSEWISE_STRICT", raising=False)
    _dispatch._warned.clear()
    params = make_params("cpu", sizes=[50, 7])
    grads = [[torch.randn_like(p) for p in params] for _ in range(3)]
    ours = clone(params)
    with pytest.warns(UserWarning, match="adamw: tensors are on the CPU"):
        run(fusewise.optim.AdamW, ours, grads, 3, lambda ps: ps, lr=1e-2)
    assert fusewise.ops.paths()["adamw"] == "reference"
    theirs = clone(params)
    run(torch.optim.AdamW, theirs, grads, 3, lambda ps: ps, lr=1e-2)
    for a, b in zip(ours, theirs):
        assert rel(a, b) < 1e-6


@pytest.mark.gpu
def test_step_captures_in_a_cuda_graph():
    params = clone(make_params("cuda", dtype=torch.bfloat16))
    for p in params:
        p.grad = torch.randn_like(p)
    opt = fusewise.optim.AdamW(params, lr=torch.tensor(1e-2, device="cuda"), master_weights=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        opt.step()  # creates the state and the tables outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        opt.step()
    before = [p.detach().clone() for p in params]
    g.replay()
    assert all(not torch.equal(a, p) for a, p in zip(before, params))
    assert opt.state[params[0]]["step"].item() == 2  # the captured increment ran on replay


@pytest.mark.gpu
def test_parameter_past_2_31_elements():
    n = (1 << 31) + 5
    p = torch.randn(n, device="cuda").requires_grad_()
    p.grad = torch.randn_like(p)
    tail = slice(n - 4096, n)
    p_tail, g_tail = p.detach()[tail].clone().requires_grad_(), p.grad[tail].clone()
    fusewise.optim.AdamW([p], lr=1e-2).step()
    ref = torch.optim.AdamW([p_tail], lr=1e-2)
    p_tail.grad = g_tail
    ref.step()
    assert rel(p.detach()[tail], p_tail) < 1e-6


def test_param_group_forms_like_torch(device):
    a = torch.randn(5, device=device, requires_grad=True)
    b = torch.randn(6, device=device, requires_grad=True)
    opt = fusewise.optim.AdamW((a,), lr=1e-2)  # a tuple, as torch accepts
    opt.add_param_group({"params": b, "lr": 5e-3})  # a lone tensor, as torch accepts
    assert [len(g["params"]) for g in opt.param_groups] == [1, 1]
    c = torch.randn(2, dtype=torch.complex64, device=device, requires_grad=True)
    with pytest.raises(TypeError, match="complex"):
        opt.add_param_group({"params": (x for x in [c])})  # checked whatever the container


BIAS_BETAS = [(0.9, 0.999), (0.99, 0.999999), (0.5, 0.99999)]


@pytest.mark.parametrize("step", [1, 2, 10, 1000, 10**6])
@pytest.mark.parametrize("betas", BIAS_BETAS, ids=lambda b: f"b{b[0]}-{b[1]}")
@pytest.mark.parametrize("path", ["kernel", "reference"])
@pytest.mark.filterwarnings("ignore:fusewise.ops.adamw")  # the reference path's; tested below
def test_bias_corrections_as_exact_as_torch(path, betas, step, device, monkeypatch):
    """One update at `step` (the count a device fp32 tensor, as fusewise keeps it) from a zero
    parameter without decay, so the result is the update itself, unrounded by the parameter:
    its error against float64 must be torch's own (fp32, bias corrections in Python double)."""
    if path == "reference":  # the eager path: CPU tensors without the interpreter
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        monkeypatch.delenv("FUSEWISE_STRICT", raising=False)
        monkeypatch.setattr(_dispatch, "_warned", set())
        device = torch.device("cpu")
    n = 256
    g = torch.randn(n, device=device)
    first = step == 1  # the real first step starts from zero moments
    m0 = torch.zeros(n, device=device) if first else torch.randn(n, device=device)
    v0 = torch.zeros(n, device=device) if first else torch.rand(n, device=device) + 0.1
    out = {}
    runs = [
        ("ours", fusewise.optim.AdamW, torch.float32, device),  # step on the device
        ("torch", torch.optim.AdamW, torch.float32, "cpu"),
        ("exact", torch.optim.AdamW, torch.float64, "cpu"),
    ]
    for name, cls, dtype, step_device in runs:
        p = torch.zeros(n, device=device, dtype=dtype, requires_grad=True)
        opt = cls([p], lr=1e-2, betas=betas, weight_decay=0.0)
        opt.state[p] = {
            "step": torch.tensor(float(step - 1), device=step_device),
            "exp_avg": m0.to(dtype, copy=True),
            "exp_avg_sq": v0.to(dtype, copy=True),
        }
        p.grad = g.to(dtype)
        opt.step()
        out[name] = p
        assert opt.state[p]["step"].item() == step
    kernel = "triton" if device.type == "cuda" else "triton-interpreter"
    assert fusewise.ops.paths()["adamw"] == ("reference" if path == "reference" else kernel)
    ours, theirs = rel(out["ours"], out["exact"]), rel(out["torch"], out["exact"])
    assert ours <= 2 * theirs + 1e-8, (ours, theirs)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_parameters_on_a_gpu_other_than_the_current_one():
    """Triton launches on the current device: the step must launch on the parameters' one (and
    on its stream), with GradScaler's flags brought there."""
    p = torch.randn(5000, device="cuda:1", requires_grad=True)
    q = p.detach().clone().requires_grad_()
    p.grad = torch.randn_like(p)
    q.grad = p.grad.clone()
    opt = fusewise.optim.AdamW([p], lr=1e-2)
    opt.grad_scale = torch.tensor(2.0, device="cuda:0")  # as GradScaler.step sets them
    opt.found_inf = torch.tensor(0.0, device="cuda:0")
    with torch.cuda.device(0):
        opt.step()
    q.grad /= 2.0
    torch.optim.AdamW([q], lr=1e-2).step()
    assert rel(p, q) < 1e-6


@pytest.mark.gpu
def test_step_never_syncs_with_the_host():
    """CPU tensors as lr and betas (read on the host, copied without a sync), master weights,
    and a parameter changed outside the optimizer (resynced on the device): no sync."""
    params = clone(make_params("cuda", dtype=torch.bfloat16))
    for p in params:
        p.grad = torch.randn_like(p)
    betas = (torch.tensor(0.9), torch.tensor(0.999))
    opt = fusewise.optim.AdamW(params, lr=torch.tensor(1e-2), betas=betas, master_weights=True)
    opt.step()  # creates the state
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
        with torch.no_grad():
            params[0].fill_(1.0)
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(params[0].detach(), opt.state[params[0]]["master_param"].bfloat16())
