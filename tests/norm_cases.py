"""Shared helpers for the norm tests: inputs, float64 oracle, eager same-dtype baseline, errors."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fusewise
from fusewise.ops import reference
from fusewise.ops.norms import launch as norm_launch
from fusewise.ops.norms import reference as R

# Slack added to eager PyTorch's own error (relative Frobenius norm, same dtype): about 1/16 of
# the dtype's machine epsilon, so the fused op may round differently, never much worse.
SLACK = {torch.float32: 1e-6, torch.float16: 6e-5, torch.bfloat16: 5e-4}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
OPS = ("layer_norm", "rms_norm", "add_rms_norm")


def make_inputs(op, shape, dtype, device, *, weight_dtype=None, strided=False):
    """Random non-zero inputs; strided=True gives x as a column slice of a wider tensor."""
    n = shape[-1]
    # non-zero mean exercises the centring
    if strided:
        wide = torch.randn(*shape[:-1], n + 5, device=device, dtype=dtype) * 2 + 0.5
        x = wide[..., 2 : n + 2].requires_grad_()  # a leaf view: rows strided by n + 5
    else:
        x = (torch.randn(*shape, device=device, dtype=dtype) * 2 + 0.5).requires_grad_()
    wd = weight_dtype or dtype
    w = (1 + 0.3 * torch.randn(n, device=device, dtype=torch.float32)).to(wd).requires_grad_()
    b = (0.2 * torch.randn(n, device=device, dtype=torch.float32)).to(wd).requires_grad_()
    r = torch.randn(*shape, device=device, dtype=dtype).requires_grad_()
    if op == "layer_norm":
        return {"x": x, "weight": w, "bias": b}
    if op == "rms_norm":
        return {"x": x, "weight": w}
    return {"x": x, "residual": r, "weight": w}


def fused(op, a):
    if op == "layer_norm":
        return (fusewise.ops.layer_norm(a["x"], a["weight"], a["bias"]),)
    if op == "rms_norm":
        return (fusewise.ops.rms_norm(a["x"], a["weight"]),)
    return fusewise.ops.add_rms_norm(a["x"], a["residual"], a["weight"])


def oracle(op, a):
    """The reference in float64 (on the CPU)."""
    d = {k: v.detach().double().cpu().requires_grad_() for k, v in a.items()}
    if op == "layer_norm":
        return d, (reference.layer_norm(d["x"], d["weight"], d["bias"]),)
    if op == "rms_norm":
        return d, (reference.rms_norm(d["x"], d["weight"]),)
    return d, reference.add_rms_norm(d["x"], d["residual"], d["weight"])


def eager(op, a):
    """Eager PyTorch in the activation dtype: the error bar the fused op must meet."""
    d = {k: v.detach().clone().requires_grad_() for k, v in a.items()}
    x, w = d["x"], d["weight"]
    mixed = w.dtype != x.dtype  # eager mixed precision: compute in fp32, round the output
    xin = x.float() if mixed else x
    if op == "layer_norm":
        y = F.layer_norm(xin, xin.shape[-1:], w.to(xin.dtype), d["bias"].to(xin.dtype), 1e-5)
        return d, (y.to(x.dtype),)
    if op == "rms_norm":
        return d, (F.rms_norm(xin, xin.shape[-1:], w.to(xin.dtype), 1e-6).to(x.dtype),)
    h = x + d["residual"]
    hin = h.float() if mixed else h
    return d, (F.rms_norm(hin, hin.shape[-1:], w.to(hin.dtype), 1e-6).to(x.dtype), h)


def rel_err(got, ref, scale: float = 0.0):
    """‖got − ref‖ / max(‖ref‖, scale). scale is the size of the terms a result is computed
    from: where they cancel (dx of a 1-wide row is ~eps·dy), error is relative to them."""
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    assert torch.isfinite(got).all(), "non-finite values (an unwritten, NaN-poisoned element?)"
    denom = max(ref.norm().item(), scale)
    return (got - ref).norm().item() / denom if denom > 0 else (got - ref).norm().item()


def dx_term_scale(op, ref_inputs, grad):
    """‖rstd · w · dy‖ in float64: the size of the terms dx = rstd·(w·dy − x̂·c1 − c2) cancels."""
    x = ref_inputs["x"].detach()
    if op == "add_rms_norm":
        x = x + ref_inputs["residual"].detach()
    if op == "layer_norm":
        x = x - x.mean(-1, keepdim=True)
    rstd = torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)
    return (rstd * ref_inputs["weight"].detach() * grad.detach().double().cpu()).norm().item()


def backward(outs, grads, inputs):
    return torch.autograd.grad(outs, list(inputs.values()), grads, allow_unused=True)


def check_forward(op, a, slack):
    """The fused op's outputs against the float64 oracle, each within eager PyTorch's own error
    in the same dtype plus `slack`; returns what check_op goes on with."""
    outs = fused(op, a)
    ref_in, ref_outs = oracle(op, a)
    eag_in, eag_outs = eager(op, a)
    for got, ref, base in zip(outs, ref_outs, eag_outs):
        assert got.shape == ref.shape and got.dtype == a["x"].dtype
        assert rel_err(got, ref) <= rel_err(base, ref) + slack
    return outs, (ref_in, ref_outs), (eag_in, eag_outs)


def check_op(op, a, slack):
    """The fused op's outputs and gradients against the float64 oracle, each within eager
    PyTorch's own error in the same dtype plus `slack`."""
    outs, (ref_in, ref_outs), (eag_in, eag_outs) = check_forward(op, a, slack)
    grads = [torch.randn_like(o) for o in outs]
    got_g = backward(outs, grads, a)
    ref_g = backward(ref_outs, [g.double().cpu() for g in grads], ref_in)
    eag_g = backward(eag_outs, grads, eag_in)
    scale = dx_term_scale(op, ref_in, grads[0])
    for name, got, ref, base in zip(a, got_g, ref_g, eag_g):
        assert got is not None and got.dtype == a[name].dtype, name
        s = scale if name in ("x", "residual") else 0.0
        err, base_err = rel_err(got, ref, s), rel_err(base, ref, s)
        assert err <= base_err + slack, f"d{name}: {err:.3g} > eager {base_err:.3g} + {slack}"


def check_without_weight(op, dtype, rows, device):
    """The fused op with no weight (and no bias) on [rows, 100]: dx (and add+RMSNorm's residual
    gradient) against float64, held to eager PyTorch's error in the same dtype."""
    x = (torch.randn(rows, 100, device=device, dtype=dtype) * 2 + 0.5).requires_grad_()
    r = torch.randn(rows, 100, device=device, dtype=dtype).requires_grad_()

    def ref(x, r):  # torch's own ops, in x's dtype
        if op == "layer_norm":
            return (F.layer_norm(x, (100,)),)
        h = x + r if op == "add_rms_norm" else x
        y = F.rms_norm(h, (100,), eps=1e-6)
        return (y, h) if op == "add_rms_norm" else (y,)

    if op == "layer_norm":
        outs = (fusewise.ops.layer_norm(x),)
    elif op == "rms_norm":
        outs = (fusewise.ops.rms_norm(x),)
    else:
        outs = fusewise.ops.add_rms_norm(x, r, None)
    leaves = (x, r) if op == "add_rms_norm" else (x,)
    grads = [torch.randn_like(o) for o in outs]
    got = torch.autograd.grad(outs, leaves, grads)
    d64 = [t.detach().double().cpu().requires_grad_() for t in (x, r)]
    want = torch.autograd.grad(ref(*d64), d64[: len(leaves)], [g.double().cpu() for g in grads])
    dex = [t.detach().clone().requires_grad_() for t in (x, r)]
    base = torch.autograd.grad(ref(*dex), dex[: len(leaves)], grads)
    for g, w64, e in zip(got, want, base):
        assert rel_err(g, w64) <= rel_err(e, w64) + SLACK[dtype]


def _rows_of(t, layout):
    """t's values with rows strided past their width (padding NaN: a read of it shows), or all
    rows one row broadcast (row stride 0: the values become t[0]'s, rows alike)."""
    if layout == "padded":
        wide = torch.full(
            (t.shape[0], t.shape[1] + 7), float("nan"), dtype=t.dtype, device=t.device
        )
        wide[:, 3 : t.shape[1] + 3] = t
        return wide[:, 3 : t.shape[1] + 3]
    return t[:1].expand(t.shape)


def check_backward_through_row_strides(op, x_rows, dy_rows, device):
    """norm_backward on [37, 100] fp32 with x and dy laid out as `x_rows` / `dy_rows` ("padded"
    or "broadcast"; add+RMSNorm's dh padded), against the float64 analytic backward, with the
    settings the caller put in place."""
    is_rms, m, n = op != "layer_norm", 37, 100
    x = _rows_of(torch.randn(m, n, device=device) * 2 + 0.5, x_rows)
    dy = _rows_of(torch.randn(m, n, device=device), dy_rows)
    dh = _rows_of(torch.randn(m, n, device=device), "padded") if op == "add_rms_norm" else None
    w = 1 + 0.3 * torch.randn(n, device=device)
    b = 0.2 * torch.randn(n, device=device) if op == "layer_norm" else None
    xd = x.double()
    mean = None if is_rms else xd.mean(-1)
    centred = xd if is_rms else xd - mean[:, None]
    rstd = torch.rsqrt((centred * centred).mean(-1) + 1e-5)
    got = norm_launch.norm_backward(
        dy, dh, x, w, b, None if is_rms else mean.float(), rstd.float(), is_rms
    )
    f64 = [None if t is None else t.double() for t in (dy, dh, w, b)]
    want = R.norm_backward(f64[0], f64[1], xd, f64[2], f64[3], mean, rstd, is_rms)
    for g, r in zip(got, want):
        assert (g is None) == (r is None)
        if g is not None:
            assert rel_err(g, r) < 1e-5


def one_backward_setting(monkeypatch, **setting):
    """Every norm backward on one fused setting (launch.Bwd's fields over a default of tiles of
    256 on 4 warps, any width), 3 programs a wave on the GPU too (so the groups a test asserts
    are the same there); returns the kernels launched, with their constexprs, as launched."""
    L = norm_launch
    bwd = L.Bwd(**{"widest": 1 << 20, "tile": 256, "warps": 4, "per_sm": 1} | setting)
    monkeypatch.setattr(L, "BWD_CONFIGS", dict.fromkeys(L.BWD_CONFIGS, (bwd,)))
    monkeypatch.setattr(L, "_programs_per_wave", lambda device: 3)
    launched, launch = [], L.launch

    def spy(kernel, grid, *args, **meta):
        launched.append((kernel, meta))
        return launch(kernel, grid, *args, **meta)

    monkeypatch.setattr(L, "launch", spy)
    return launched
