"""Property test of fusewise.optim.AdamW: random parameter shapes and counts, dtypes (fp32; bf16
and fp16 with and without fp32 masters), options, parameters and gradients at misaligned storage
offsets, and a torch checkpoint whose state tensors are in other layouts, resumed for a few
steps and held to a float64 run of torch's AdamW: fusewise's error is at most twice that of
torch.optim.AdamW in the same precision (plus a small slack), as in test_adamw.py.

Each case is drawn from its seed (shapes, layouts); dtypes and options cycle over the seeds so
that every combination of the two appears."""

import copy
import random

import pytest
import torch
from adamw_cases import rel
from layouts import KINDS, relayout

import fusewise

DTYPES = {  # id: (parameter dtype, fp32 masters)
    "fp32": (torch.float32, False),
    "bf16": (torch.bfloat16, False),
    "bf16-master": (torch.bfloat16, True),
    "fp16": (torch.float16, False),
    "fp16-master": (torch.float16, True),
}
OPTIONS = [(), ("amsgrad",), ("maximize", "wd"), ("groups",), ("amsgrad", "wd", "groups")]
# one element, odd sizes, exactly one chunk of the kernel (4096) and one more, 2-D
SPECIAL = [(1,), (4097,), (64, 64), (7,), (17, 241), (4096,), (3, 5)]
CKPT_STEPS, STEPS = 2, 3  # torch's steps before the checkpoint, fusewise's after it


def make_case(seed):
    rng = random.Random(seed)
    dtype_id = list(DTYPES)[seed % len(DTYPES)]
    options = OPTIONS[(seed // len(DTYPES) + seed) % len(OPTIONS)]
    shapes = [SPECIAL[seed % len(SPECIAL)]]
    for _ in range(rng.randint(0, 3)):
        n, rows, cols = rng.randint(1, 300), rng.randint(1, 40), rng.randint(1, 40)
        shapes.append(rng.choice([(n,), (rows, cols)]))
    layouts = {
        "param": [rng.choice(["contiguous", "offset"]) for _ in shapes],  # offset: misaligned
        "grad": [rng.choice(["contiguous", "offset"]) for _ in shapes],
        "state": [[rng.choice(KINDS[1:]) for _ in range(3)] for _ in shapes],  # m, v, vmax
    }
    case_id = "-".join([dtype_id, *options, f"{len(shapes)}p", f"s{seed}"])
    return pytest.param(seed, dtype_id, options, shapes, layouts, id=case_id)


CASES = [make_case(seed) for seed in range(len(DTYPES) * len(OPTIONS))]  # each pair once


def hyper(options, dtype):
    # fp16: torch's fp16 arithmetic rounds eps = 1e-8 to 0, and a second moment that underflowed
    # to 0 then divides by 0 (inf, nan) in the checkpoint run
    kw = dict(lr=1e-2, eps=1e-4 if dtype == torch.float16 else 1e-8)
    kw.update(weight_decay=0.1 if "wd" in options else 0.0)
    kw.update(amsgrad="amsgrad" in options, maximize="maximize" in options)
    return kw


def groups(params, options):
    if "groups" not in options or len(params) < 2:
        return params
    return [
        {"params": params[:1], "lr": 5e-3, "betas": (0.8, 0.95), "weight_decay": 0.05},
        {"params": params[1:], "eps": 1e-6},
    ]


def torch_run(start, grads, sd, dtype, options):
    """torch.optim.AdamW resumed from the checkpoint with parameters and state in `dtype`."""
    params = [p.to(dtype).requires_grad_() for p in start]
    opt = torch.optim.AdamW(groups(params, options), **hyper(options, start[0].dtype))
    opt.load_state_dict(copy.deepcopy(sd))  # casts the state to the parameters' dtype; torch
    # takes the step tensors as they are and increments them in place: a copy for each run
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.to(dtype)
        opt.step()
    return params


def poison_intact(t):
    """The NaN poison around a tensor relaid out inside a larger buffer was never written."""
    whole = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
    outside = torch.ones(whole.numel(), dtype=torch.bool, device=t.device)
    outside[t.storage_offset() : t.storage_offset() + t.numel()] = False
    return bool(whole[outside].isnan().all())


@pytest.mark.parametrize("seed, dtype_id, options, shapes, layouts", CASES)
def test_resumes_torch_checkpoint_in_any_layout(seed, dtype_id, options, shapes, layouts, device):
    dtype, master = DTYPES[dtype_id]
    torch.manual_seed(seed)
    start = [torch.randn(s, device=device).to(dtype) for s in shapes]
    grads = [
        [torch.randn(s, device=device).to(dtype) for s in shapes] for _ in range(CKPT_STEPS + STEPS)
    ]
    # the checkpoint: torch.optim.AdamW in the parameters' dtype
    kw = hyper(options, dtype)
    ckpt = [p.clone().requires_grad_() for p in start]
    topt = torch.optim.AdamW(groups(ckpt, options), **kw)
    for step_grads in grads[:CKPT_STEPS]:
        for p, g in zip(ckpt, step_grads):
            p.grad = g.clone()
        topt.step()
    sd = topt.state_dict()
    resumed = [p.detach() for p in ckpt]
    # fusewise: parameters, gradients and the checkpoint's state tensors in other layouts
    moved = {}
    for i, st in sd["state"].items():
        kinds = dict(zip(["exp_avg", "exp_avg_sq", "max_exp_avg_sq"], layouts["state"][i]))
        moved[i] = {k: relayout(v, kinds[k]) if k in kinds else v for k, v in st.items()}
    params = [relayout(p, kind).requires_grad_() for p, kind in zip(resumed, layouts["param"])]
    opt = fusewise.optim.AdamW(groups(params, options), master_weights=master, **kw)
    opt.load_state_dict({**sd, "state": moved})
    for step_grads in grads[CKPT_STEPS:]:
        for p, g, kind in zip(params, step_grads, layouts["grad"]):
            p.grad = relayout(g, kind)
        opt.step()
    exact = torch_run(resumed, grads[CKPT_STEPS:], sd, torch.float64, options)
    # torch in the precision fusewise computes: fp32 with masters (bf16 gradients upcast)
    theirs = torch_run(resumed, grads[CKPT_STEPS:], sd, torch.float32 if master else dtype, options)
    slack = 1e-6 if dtype == torch.float32 or master else torch.finfo(dtype).eps / 16
    for p, t, e in zip(params, theirs, exact):
        ours = opt.state[p]["master_param"] if master else p
        assert rel(ours, e) <= 2 * rel(t, e) + slack, (tuple(p.shape), rel(ours, e), rel(t, e))
        if master:
            assert torch.equal(p.detach(), ours.to(dtype))
        assert poison_intact(p) and poison_intact(p.grad)
