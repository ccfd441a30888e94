"""Every public norm op with every input in every memory layout, against a float64 oracle.

x, residual, weight, bias and the output gradients each come contiguous, at a storage offset,
strided, with padded rows, transposed (tests/layouts.py, inside NaN-poisoned buffers) or
broadcast with stride 0 (a slice expanded, as ``w.expand(N)`` or the gradient of ``y.sum()``
gives); shapes with 1 row, N=1, odd N and 3-D inputs; fp32, bf16, fp16 with the weight in the
activation dtype or fp32; forward and backward. Gradients are taken with respect to the tensors
the user holds (the base of a broadcast), so they must reach it with its shape. Every result is
held to eager PyTorch's own error in the same dtype plus norm_cases.SLACK. The cases come from a
seeded generator, so a failing id reproduces (select it with -k).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from layouts import KINDS, relayout
from norm_cases import DTYPES, SLACK, rel_err

import fusewise
from fusewise.ops import reference
from fusewise.ops.norms import launch as norm_launch

OPS = ("layer_norm", "rms_norm", "add_rms_norm", "nn.LayerNorm", "nn.RMSNorm")
LN_OPS = ("layer_norm", "nn.LayerNorm")
ROLES = {
    "layer_norm": ("x", "weight", "bias"),
    "rms_norm": ("x", "weight"),
    "add_rms_norm": ("x", "residual", "weight"),
    "nn.LayerNorm": ("x", "weight", "bias"),
    "nn.RMSNorm": ("x", "weight"),
}
# stride 0: "expand-rows" on the leading dim, "expand-last" on the last, "scalar" on every dim
# (the gradient of y.sum()); "expand" for a weight is a 1-element tensor broadcast to [N];
# "absent": weight/bias None; "unused": that output takes no part in the loss.
INPUT_KINDS = KINDS + ("expand-rows",)
PARAM_KINDS = KINDS + ("expand", "absent")
GRAD_KINDS = KINDS + ("expand-rows", "expand-last", "scalar")
# rows wider than 16 take the chunked forward (8-element chunks) and the split backward (row sums
# in steps of two 8-element chunks, 8-column tiles) when a case says `wide`
WIDE_LIMITS = {
    "MAX_BLOCK_N": 16,
    "MAX_BLOCK_N_FWD": 16,
    "WIDE_CHUNK_FWD": 8,
    "SUMS_CHUNK": 8,
    "SUMS_UNROLL": 2,
    "TILES_N": 8,
}


def _kinds(op: str, role: str) -> tuple[str, ...]:
    if role in ("x", "residual"):
        return INPUT_KINDS
    if role in ("dy", "dh"):
        return GRAD_KINDS + (("unused",) if op == "add_rms_norm" else ())
    if op.startswith("nn.") and role == "weight":
        return PARAM_KINDS[:-1]  # a module's weight is absent only with its bias
    return PARAM_KINDS


@dataclass(frozen=True)
class Case:
    op: str
    shape: tuple[int, ...]
    dtype: str  # key of norm_cases.DTYPES
    w_fp32: bool = False  # weight and bias in fp32 under bf16/fp16 activations
    layouts: tuple[tuple[str, str], ...] = ()  # (role, kind); roles not named are contiguous
    norm_dims: int = 1  # modules: normalise over the last 1 or 2 dims
    wide: bool = False  # lower the block limit so the chunked (wide-row) kernels run

    def kind(self, role: str) -> str:
        return dict(self.layouts).get(role, "contiguous")

    @property
    def id(self) -> str:
        names = {1: "N", 2: "MN", 3: "BTN"}[len(self.shape)]
        dims = "-".join(f"{k}{s}" for k, s in zip(names, self.shape))
        tags = [self.op, dims, self.dtype + ("-w32" if self.w_fp32 else "")]
        tags += ["norm2d"] * (self.norm_dims == 2) + ["wide"] * self.wide
        return "-".join(tags + [f"{r}:{k}" for r, k in self.layouts if k != "contiguous"])


def _draw_cases(seed: int = 9, per_op: int = 12) -> list[Case]:
    """per_op cases per op; each role cycles through its kinds (so every kind of every input
    and gradient is drawn for every op), the first four cases are 3-D, N=1, one row and 1-D."""
    rng = random.Random(seed)
    cases = []
    for op in OPS:
        roles = ROLES[op] + (("dy", "dh") if op == "add_rms_norm" else ("dy",))
        order = {r: rng.sample(_kinds(op, r), len(_kinds(op, r))) for r in roles}
        for j in range(per_op):
            n = rng.choice((1, 2, 7, 16, 33, 40))
            shape = (rng.choice((1, 2, 3, 5)), n)
            if j == 0 or (j > 2 and rng.random() < 0.3):
                shape = (rng.choice((1, 2)), rng.choice((1, 3)), n)
            shape = {1: (3, 1), 2: (1, rng.choice((7, 33))), 3: (n,)}.get(j, shape)
            layouts = {r: order[r][j % len(order[r])] for r in roles}
            for r in ("x", "residual"):  # 1-D: no rows to broadcast (that is "expand-last")
                if len(shape) == 1 and layouts.get(r) == "expand-rows":
                    layouts[r] = "strided"
            if layouts.get("dy") == layouts.get("dh") == "unused":
                layouts["dh"] = "contiguous"
            if layouts.get("weight") == "absent" and op.startswith("nn."):
                layouts["weight"] = "contiguous"
            dtype = rng.choice(list(DTYPES))
            norm_dims = 2 if op.startswith("nn.") and len(shape) == 3 and rng.random() < 0.5 else 1
            width = shape[-1] * (shape[-2] if norm_dims == 2 else 1)
            w_fp32 = dtype != "fp32" and rng.random() < 0.4
            wide = width > 16 and rng.random() < 0.3
            cases.append(Case(op, shape, dtype, w_fp32, tuple(layouts.items()), norm_dims, wide))
    return cases


CASES = _draw_cases()


def _leaf_and_view(value: torch.Tensor, kind: str):
    """(leaf the user holds, tensor passed to the op) with `value`'s shape in layout `kind`.
    A broadcast's base sits at the start of a NaN buffer, so reading past it shows."""
    if kind in KINDS:
        leaf = relayout(value, kind).requires_grad_()
        return leaf, leaf
    dims = {
        "expand-rows": [0],
        "expand": [0],
        "expand-last": [value.dim() - 1],
        "scalar": list(range(value.dim())),
    }[kind]
    part = value
    for d in dims:
        part = part.narrow(d, 0, 1)
    buf = torch.full((2 * value.numel() + 2,), float("nan"), dtype=value.dtype, device=value.device)
    leaf = buf[: part.numel()].view(part.shape)
    leaf.copy_(part)
    leaf.requires_grad_()
    return leaf, leaf.expand(value.shape)


def _values(case: Case, device):
    """Random values per role (x with a non-zero mean, weight near 1), independent of layout."""
    dtype = DTYPES[case.dtype]
    pdtype = torch.float32 if case.w_fp32 else dtype
    pshape = case.shape[-case.norm_dims :]
    make = {
        "x": lambda: torch.randn(case.shape, device=device) * 2 + 0.5,
        "residual": lambda: torch.randn(case.shape, device=device),
        "weight": lambda: 1 + 0.3 * torch.randn(pshape, device=device),
        "bias": lambda: 0.2 * torch.randn(pshape, device=device),
    }
    return {r: make[r]().to(pdtype if r in ("weight", "bias") else dtype) for r in ROLES[case.op]}


def _eps(case: Case) -> float | None:
    if case.op == "nn.RMSNorm":
        return None  # nn.RMSNorm's default: the eps of the op-math dtype
    return 1e-5 if case.op in LN_OPS else 1e-6


def _fused(case: Case, t: dict):
    x, w, b = t["x"], t.get("weight"), t.get("bias")
    if case.op == "layer_norm":
        return (fusewise.ops.layer_norm(x, w, b),)
    if case.op == "rms_norm":
        return (fusewise.ops.rms_norm(x, w),)
    if case.op == "add_rms_norm":
        return fusewise.ops.add_rms_norm(x, t["residual"], w)
    pshape = case.shape[-case.norm_dims :]
    if case.op == "nn.LayerNorm":
        m = fusewise.nn.LayerNorm(pshape, bias=b is not None, device=x.device)
    else:
        m = fusewise.nn.RMSNorm(pshape, device=x.device)
    for name in ("weight", "bias"):  # the module holds a view, as a parametrization gives
        if getattr(m, name, None) is not None:
            delattr(m, name)
            setattr(m, name, t[name])
    return (m(x),)


def _oracle(case: Case, t: dict):
    """ops/reference.py in float64 on the CPU, over the flattened normalised dims."""
    x = t["x"]
    rows = x.shape[: x.dim() - case.norm_dims]
    f = {r: v.reshape(*rows, -1) if r in ("x", "residual") else v.reshape(-1) for r, v in t.items()}
    eps = _eps(case)
    eps = torch.finfo(torch.float32).eps if eps is None else eps  # float32: the op-math dtype
    w, b = f.get("weight"), f.get("bias")
    if case.op in LN_OPS:
        outs = (reference.layer_norm(f["x"], w, b, eps),)
    elif case.op == "add_rms_norm":
        outs = reference.add_rms_norm(f["x"], f["residual"], w, eps)
    else:
        outs = (reference.rms_norm(f["x"], w, eps),)
    return tuple(o.reshape(x.shape) for o in outs)


def _eager(case: Case, t: dict):
    """torch.nn.functional in the activation dtype (fp32 when the weight is fp32, rounded)."""
    x, w, b = t["x"], t.get("weight"), t.get("bias")
    up = (
        (lambda v: v.float() if v is not None else None)
        if w is not None and w.dtype != x.dtype
        else (lambda v: v)
    )
    pshape = x.shape[-case.norm_dims :]
    eps = _eps(case)
    if case.op in LN_OPS:
        return (F.layer_norm(up(x), pshape, up(w), up(b), eps).to(x.dtype),)
    if case.op == "add_rms_norm":
        h = x + t["residual"]
        return F.rms_norm(up(h), pshape, up(w), eps).to(x.dtype), h
    return (F.rms_norm(up(x), pshape, up(w), eps).to(x.dtype),)


def _dx_scale(case: Case, t64: dict, dy64: torch.Tensor) -> float:
    """‖rstd·w·dy‖: the size of the terms dx cancels (norm_cases.dx_term_scale, for any case)."""
    x = t64["x"] + t64["residual"] if "residual" in t64 else t64["x"]
    dims = tuple(range(-case.norm_dims, 0))
    if case.op in LN_OPS:
        x = x - x.mean(dims, keepdim=True)
    eps = _eps(case) or torch.finfo(torch.float32).eps
    rstd = torch.rsqrt((x * x).mean(dims, keepdim=True) + eps)
    w = t64.get("weight")
    return (rstd * (w if w is not None else 1.0) * dy64).norm().item()


def run_case(case: Case, device, monkeypatch) -> None:
    if case.wide:
        for name, value in WIDE_LIMITS.items():
            monkeypatch.setattr(norm_launch, name, value)
    slack = SLACK[DTYPES[case.dtype]]
    leaves, views = {}, {}
    for role, value in _values(case, device).items():
        if case.kind(role) == "absent":
            continue
        leaves[role], views[role] = _leaf_and_view(value, case.kind(role))
    outs = _fused(case, views)
    # the same tensors, built the same way from float64 (oracle) and same-dtype (eager) leaves
    leaves64 = {r: v.detach().double().cpu().requires_grad_() for r, v in leaves.items()}
    leaves_e = {r: v.detach().clone().requires_grad_() for r, v in leaves.items()}
    rebuild = lambda ls: {r: ls[r].expand(views[r].shape) for r in ls}  # noqa: E731
    views64, views_e = rebuild(leaves64), rebuild(leaves_e)
    ref_outs, eager_outs = _oracle(case, views64), _eager(case, views_e)
    for name, got, ref, base in zip(("y", "h"), outs, ref_outs, eager_outs):
        assert got.shape == ref.shape and got.dtype == views["x"].dtype, name
        err, base_err = rel_err(got, ref), rel_err(base, ref)
        assert err <= base_err + slack, f"{name}: {err:.3g} > eager {base_err:.3g} + {slack}"

    grad_roles = ("dy", "dh")[: len(outs)]
    grads = {}
    for role, out in zip(grad_roles, outs):
        if case.kind(role) != "unused":
            grads[role] = _leaf_and_view(torch.randn_like(out), case.kind(role))[1].detach()
    used = [i for i, r in enumerate(grad_roles) if r in grads]

    def grads_of(outputs, ls):
        g = [grads[grad_roles[i]].to(outputs[i].device, outputs[i].dtype) for i in used]
        got = torch.autograd.grad(
            [outputs[i] for i in used], list(ls.values()), g, allow_unused=True
        )
        return {r: (v if v is not None else torch.zeros_like(ls[r])) for r, v in zip(ls, got)}

    got_g, ref_g = grads_of(outs, leaves), grads_of(ref_outs, leaves64)
    eager_g = grads_of(eager_outs, leaves_e)
    dy64 = grads["dy"].double().cpu() if "dy" in grads else torch.zeros(case.shape).double()
    scale = _dx_scale(case, views64, dy64)
    for role, leaf in leaves.items():
        got = got_g[role]
        assert got.shape == leaf.shape and got.dtype == leaf.dtype, role
        s = scale if role in ("x", "residual") else 0.0
        err, base_err = rel_err(got, ref_g[role], s), rel_err(eager_g[role], ref_g[role], s)
        assert err <= base_err + slack, f"d{role}: {err:.3g} > eager {base_err:.3g} + {slack}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_layouts(case, device, monkeypatch):
    run_case(case, device, monkeypatch)


def test_cases_cover_every_kind_and_shape():
    """The draw is what the module docstring promises (a seed change must keep it so)."""
    for op in OPS:
        mine = [c for c in CASES if c.op == op]
        roles = ROLES[op] + (("dy", "dh") if op == "add_rms_norm" else ("dy",))
        for role in roles:
            assert {c.kind(role) for c in mine} >= set(_kinds(op, role)) - {"unused"}, (op, role)
        assert any(c.shape[-1] == 1 for c in mine) and any(c.shape[-1] % 2 for c in mine)
        assert any(math.prod(c.shape[:-1]) == 1 for c in mine)
        assert any(len(c.shape) == 3 for c in mine) and any(len(c.shape) == 1 for c in mine)
    assert {c.dtype for c in CASES} == set(DTYPES) and any(c.w_fp32 for c in CASES)
    assert any(c.wide for c in CASES) and any(c.norm_dims == 2 for c in CASES)


# --- the layouts of issue #9, named ----------------------------------------------------------

ISSUE_9 = [
    Case(
        op, (4, 16), "fp32", layouts=tuple((r, kind) for r in ("weight", "bias") if r in ROLES[op])
    )
    for op in OPS
    for kind in ("strided", "expand")
] + [
    Case("layer_norm", (3, 16), "bf16", w_fp32=True, layouts=(("weight", "expand"),)),
    Case("rms_norm", (5, 33), "fp16", layouts=(("x", "expand-rows"), ("dy", "scalar"))),
    Case(
        "add_rms_norm",
        (2, 3, 7),
        "bf16",
        layouts=(
            ("x", "transposed"),
            ("residual", "offset"),
            ("dy", "transposed"),
            ("dh", "expand-last"),
        ),
    ),
    Case("nn.LayerNorm", (2, 3, 8), "fp32", layouts=(("weight", "transposed"),), norm_dims=2),
]


@pytest.mark.parametrize("case", ISSUE_9, ids=[c.id for c in ISSUE_9])
def test_issue_9_layouts(case, device, monkeypatch):
    """A weight or bias that is a view (every other element, a 1-element broadcast): the kernels
    once read it as contiguous (a 4.0 error, reads past the storage)."""
    run_case(case, device, monkeypatch)
