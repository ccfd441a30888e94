"""The norm ops as a user meets them: errors, empty input, the CPU path, modules, compile,
opcheck, CUDA graphs, and very large tensors."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from norm_cases import DTYPES, SLACK, make_inputs, rel_err

import fusewise
from fusewise.ops import _dispatch

# --- bad input: a clear error naming the argument ----------------------------------------------


def test_weight_shape_mismatch_names_weight(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        fusewise.ops.layer_norm(x, torch.ones(7, device=device))
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        fusewise.ops.layer_norm(x, torch.ones(8, device=device), torch.ones(8, 1, device=device))
    with pytest.raises(ValueError, match="weight"):
        fusewise.ops.rms_norm(x, torch.ones(16, device=device))


def test_integer_dtype_names_argument(device):
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        fusewise.ops.rms_norm(torch.ones(4, 8, dtype=torch.int32, device=device))
    x = torch.randn(4, 8, device=device)
    with pytest.raises(TypeError, match="weight must be a floating-point"):
        fusewise.ops.layer_norm(x, torch.ones(8, dtype=torch.int64, device=device))


def test_device_mismatch_names_argument():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="weight is on meta but x is on cpu"):
        fusewise.ops.rms_norm(x, torch.ones(8, device="meta"))
    with pytest.raises(ValueError, match="residual is on meta"):
        fusewise.ops.add_rms_norm(x, torch.ones(4, 8, device="meta"), None)


def test_residual_mismatch(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        fusewise.ops.add_rms_norm(x, torch.randn(4, 9, device=device), None)
    with pytest.raises(TypeError, match="residual must have x's dtype"):
        fusewise.ops.add_rms_norm(x, torch.randn(4, 8, device=device, dtype=torch.float16), None)


def _call(op, x, **kw):
    if op == "add_rms_norm":
        return fusewise.ops.add_rms_norm(x, x.clone(), None, **kw)
    return getattr(fusewise.ops, op)(x, **kw)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_rms_norm"])
def test_zero_dim_x_names_x_and_the_shape_needed(op, device):
    with pytest.raises(ValueError, match=r"x must have at least one dimension \(\[\.\.\., N\]"):
        _call(op, torch.tensor(1.0, device=device))


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_rms_norm"])
def test_sparse_x_names_x(op, device):
    with pytest.raises(TypeError, match="x must be a dense"):
        _call(op, torch.randn(3, 8).to_sparse().to(device))


BAD_EPS = {
    "negative": (-1e-5, ValueError, "eps must be a finite number >= 0, got -1e-05"),
    "nan": (float("nan"), ValueError, "eps must be a finite number >= 0, got nan"),
    "inf": (float("inf"), ValueError, "eps must be a finite number >= 0, got inf"),
    "str": ("1e-5", TypeError, "eps must be a number .*, got str"),
    "bool": (True, TypeError, "eps must be a number .*, got bool"),
    "tensor": (
        torch.tensor(1e-5),
        TypeError,
        r"eps must be a number .*, got a Tensor; .*float\(eps\)",
    ),
}


@pytest.mark.parametrize("what", list(BAD_EPS))
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_rms_norm"])
def test_bad_eps_names_eps(op, what, device):
    eps, error, message = BAD_EPS[what]
    with pytest.raises(error, match=message):
        _call(op, torch.randn(3, 8, device=device), eps=eps)
    with pytest.raises(error, match=message):  # also on the empty-input path
        _call(op, torch.randn(0, 8, device=device), eps=eps)


def test_layer_norm_eps_none_is_an_error_naming_eps(device):
    """F.layer_norm refuses eps=None (F.rms_norm takes it: see the RMSNorm eps tests)."""
    with pytest.raises(TypeError, match="eps must be a number .*, got None"):
        fusewise.ops.layer_norm(torch.randn(3, 8, device=device), eps=None)
    with pytest.raises(TypeError, match="eps must be a number"):
        fusewise.nn.LayerNorm(8, eps=None).to(device)(torch.randn(3, 8, device=device))


def test_numpy_and_integer_eps_are_numbers(device):
    """Eagerly and under torch.compile (where a numpy scalar is traced, not a numbers.Real)."""
    import numpy as np

    x = torch.randn(3, 8, device=device)
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    for op in ("layer_norm", "rms_norm"):
        f = getattr(fusewise.ops, op)
        assert torch.equal(f(x, eps=np.float32(0.25)), f(x, eps=0.25))
        assert torch.equal(f(x, eps=np.int64(1)), f(x, eps=1.0))
        compiled = torch.compile(
            lambda t, f=f: f(t, eps=np.float32(0.25)), backend=backend, fullgraph=True
        )
        assert rel_err(compiled(x), f(x, eps=0.25)) < 1e-6


def test_normalized_shape_where_weight_goes_says_so(device):
    """F.layer_norm(x, normalized_shape, weight) habits: fusewise's ops take no normalized_shape."""
    x = torch.randn(3, 8, device=device)
    with pytest.raises(
        TypeError, match=r"weight must be a torch.Tensor or None, got tuple.*normali"
    ):
        fusewise.ops.layer_norm(x, (8,))
    with pytest.raises(TypeError, match=r"weight must be a torch.Tensor or None, got float"):
        fusewise.ops.rms_norm(x, 1e-6)


def test_module_wrong_normalized_shape(device):
    ln = fusewise.nn.LayerNorm(16).to(device)
    with pytest.raises(ValueError, match=r"normalized_shape \(16,\)"):
        ln(torch.randn(3, 15, device=device))
    rms = fusewise.nn.RMSNorm([4, 4]).to(device)
    with pytest.raises(ValueError, match=r"normalized_shape \(4, 4\)"):
        rms(torch.randn(3, 16, device=device))
    with pytest.raises(ValueError, match=r"normalized_shape \(16,\), got \(\)"):
        ln(torch.tensor(1.0, device=device))
    with pytest.raises(TypeError, match="RMSNorm expects a torch.Tensor, got list"):
        rms([[1.0] * 4] * 4)


# --- empty input ------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_rms_norm"])
def test_zero_rows(op, device):
    a = make_inputs(op, (0, 64), torch.float32, device)
    from norm_cases import fused

    outs = fused(op, a)
    assert all(o.shape == (0, 64) for o in outs)
    grads = torch.autograd.grad(outs[0].sum(), list(a.values()), allow_unused=True)
    assert grads[1 if op != "add_rms_norm" else 2].abs().sum() == 0  # dweight of nothing is 0


# --- the CPU path: reference with a once-per-reason warning, or an error when strict -----------


def test_cpu_without_interpreter_warns_once_and_matches(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("FUSEWISE_STRICT", raising=False)
    _dispatch._warned.clear()
    x, w = torch.randn(5, 32), torch.randn(32)
    with pytest.warns(UserWarning, match="tensors are on the CPU.*eager reference"):
        y = fusewise.ops.rms_norm(x, w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call is silent
        fusewise.ops.rms_norm(x, w)
    assert fusewise.ops.paths()["rms_norm"] == "reference"
    assert rel_err(y, F.rms_norm(x.double(), (32,), w.double(), 1e-6)) < 1e-6


def test_strict_turns_fallback_into_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("FUSEWISE_STRICT", "1")
    with pytest.raises(fusewise.ops.FusewiseFallbackError, match="FUSEWISE_STRICT=1"):
        fusewise.ops.layer_norm(torch.randn(3, 8))


def test_float64_takes_reference_with_reason(device):
    _dispatch._warned.clear()
    x = torch.randn(3, 8, dtype=torch.float64, device=device)
    with pytest.warns(UserWarning, match="dtype torch.float64"):
        y = fusewise.ops.layer_norm(x)
    assert rel_err(y, F.layer_norm(x, (8,))) < 1e-12


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_rms_norm"])
@pytest.mark.parametrize("loss", ["sum", "square"])
def test_create_graph_is_a_clear_error(op, loss, device):
    """create_graph=True asks for gradients with a graph; the kernels' have none. With y.sum()
    the incoming gradient does not require grad, and torch's once_differentiable (used before)
    let that pass: a gradient penalty lost its terms through the norm without a word."""
    x = torch.randn(4, 16, device=device, requires_grad=True)
    args = (torch.randn(4, 16, device=device), None) if op == "add_rms_norm" else ()
    y = getattr(fusewise.ops, op)(x, *args)
    y = y[0] if isinstance(y, tuple) else y
    z = y.sum() if loss == "sum" else y.square().sum()
    with pytest.raises(RuntimeError, match=rf"fusewise.ops.{op} has no second derivative"):
        torch.autograd.grad(z, x, create_graph=True)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_rms_norm"])
def test_forward_mode_ad_is_refused_not_dropped(op, device):
    """Dual tensors do not require grad: without the Function the kernels would run on the
    primal and the tangent would vanish. The ops have no jvp, and must say so."""
    import torch.autograd.forward_ad as fwAD

    x, t = torch.randn(4, 16, device=device), torch.randn(4, 16, device=device)
    w = torch.randn(16, device=device)
    call = {
        "layer_norm": lambda x: fusewise.ops.layer_norm(x, w),
        "rms_norm": lambda x: fusewise.ops.rms_norm(x, w),
        "add_rms_norm": lambda x: fusewise.ops.add_rms_norm(x, torch.randn_like(x), w)[0],
    }[op]
    with fwAD.dual_level(), pytest.raises((NotImplementedError, RuntimeError), match="jvp"):
        call(fwAD.make_dual(x, t))


def test_add_rms_norm_with_only_the_sum_used_passes_its_gradient_through(device):
    """h = x + residual reaches the loss and y does not: x and residual get h's gradient as it
    is, and the weight gets none (as torch's unfused code leaves it), with no kernel run."""
    x = torch.randn(4, 16, device=device, requires_grad=True)
    r = torch.randn(4, 16, device=device, requires_grad=True)
    w = torch.randn(16, device=device, requires_grad=True)
    _, h = fusewise.ops.add_rms_norm(x, r, w)
    g = torch.randn_like(h)
    h.backward(g)
    torch.testing.assert_close(x.grad, g, rtol=0, atol=0)
    torch.testing.assert_close(r.grad, g, rtol=0, atol=0)
    assert w.grad is None
    y, h = fusewise.ops.add_rms_norm(x, r, w)  # and both used: the weight gets its gradient
    (y.sum() + h.sum()).backward()
    assert w.grad is not None and w.grad.abs().sum() > 0


def test_paths_report_the_kernel(device):
    fusewise.ops.add_rms_norm(
        torch.randn(2, 8, device=device), torch.randn(2, 8, device=device), None
    )
    assert fusewise.ops.paths()["add_rms_norm"] in ("triton", "triton-interpreter")


# --- modules: drop-in for torch.nn.LayerNorm / RMSNorm -----------------------------------------


@pytest.mark.parametrize("shape", [(48,), (4, 12)])
def test_layernorm_module_matches_torch_and_shares_state_dict(shape, device):
    ours, theirs = fusewise.nn.LayerNorm(shape).to(device), torch.nn.LayerNorm(shape).to(device)
    with torch.no_grad():
        theirs.weight.normal_()
        theirs.bias.normal_()
    ours.load_state_dict(theirs.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, *shape, device=device)
    assert rel_err(ours(x), theirs(x)) < 1e-6
    assert fusewise.nn.LayerNorm(shape, elementwise_affine=False).to(device)(x).shape == x.shape
    assert "bias" not in fusewise.nn.LayerNorm(shape, bias=False).state_dict()


def test_rmsnorm_module_matches_torch(device):
    ours, theirs = fusewise.nn.RMSNorm(40).to(device), torch.nn.RMSNorm(40).to(device)
    with torch.no_grad():
        theirs.weight.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(6, 40, device=device)
    assert rel_err(ours(x), theirs(x)) < 1e-6  # eps=None: torch's default, as torch
    ours_eps = fusewise.nn.RMSNorm(40, eps=1e-3).to(device)
    ours_eps.load_state_dict(theirs.state_dict())
    assert rel_err(ours_eps(x), F.rms_norm(x, (40,), theirs.weight, 1e-3)) < 1e-6


@pytest.mark.parametrize("dname", ["fp32", "bf16", "fp16"])
def test_rmsnorm_eps_none_is_torchs_rule(dname, device):
    """eps=None (nn.RMSNorm's default) is the eps of the op-math dtype: float32's for bf16 and
    fp16, not the activation dtype's (bf16's is 0.0078: a 2.1 difference on small inputs). Held
    to torch.nn.RMSNorm's own error against float64 with that eps; reached through the module,
    a patched torch module, rms_norm and add_rms_norm."""
    dtype = DTYPES[dname]
    x = (1e-3 * torch.randn(6, 40, device=device)).to(dtype)  # small inputs: eps matters
    r = (1e-3 * torch.randn(6, 40, device=device)).to(dtype)
    theirs = torch.nn.RMSNorm(40, device=device, dtype=dtype)
    with torch.no_grad():
        theirs.weight.normal_()
    w = theirs.weight
    eps32 = torch.finfo(torch.float32).eps
    ref = F.rms_norm(x.double(), (40,), w.double(), eps32)
    base_err = rel_err(theirs(x), ref)
    assert base_err < 1e-2  # torch's rule, checked against torch itself
    patched = torch.nn.Sequential(torch.nn.RMSNorm(40, device=device, dtype=dtype))
    patched.load_state_dict({"0.weight": w.detach()})
    fusewise.patch(patched)
    ours = fusewise.nn.RMSNorm(40, device=device, dtype=dtype)
    ours.load_state_dict(theirs.state_dict())
    for y in (ours(x), patched(x), fusewise.ops.rms_norm(x, w, eps=None)):
        assert rel_err(y, ref) <= base_err + SLACK[dtype]
    h = x + r
    y, _ = fusewise.ops.add_rms_norm(x, r, w, eps=None)
    ref_h = F.rms_norm(h.double(), (40,), w.double(), eps32)
    assert rel_err(y, ref_h) <= rel_err(F.rms_norm(h, (40,), w), ref_h) + SLACK[dtype]


def test_rmsnorm_eps_none_float64_is_float64s(device):
    """Float64 (the reference path) takes float64's eps, as F.rms_norm does."""
    x = 1e-8 * torch.randn(3, 8, dtype=torch.float64, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the float64 fallback warning, tested elsewhere
        y = fusewise.ops.rms_norm(x, None, eps=None)
    assert rel_err(y, F.rms_norm(x, (8,), None, None)) < 1e-12


# --- torch.library: opcheck, torch.compile, CUDA graphs -----------------------------------------


def test_opcheck(device):
    x = torch.randn(6, 40, device=device, requires_grad=True)
    w = torch.randn(40, device=device, requires_grad=True)
    b = torch.randn(40, device=device, requires_grad=True)
    r = torch.randn(6, 40, device=device, requires_grad=True)
    ops = torch.ops.fusewise
    torch.library.opcheck(ops.norm_fwd.default, (x, None, w, b, 1e-5, False))
    torch.library.opcheck(ops.norm_fwd.default, (x, r, w, None, 1e-6, True))
    _, _, mean, rstd = ops.norm_fwd(x, None, w, b, 1e-5, False)
    dy = torch.randn(6, 40, device=device)
    # norm_bwd has no autograd of its own (no double backward), so its inputs carry no grad
    bwd_args = (dy, None, x.detach(), w.detach(), b.detach(), mean.detach(), rstd.detach(), False)
    torch.library.opcheck(ops.norm_bwd.default, bwd_args)


def test_custom_op_called_directly_refuses_layouts_the_kernels_cannot_read(device):
    """fusewise.ops copies a strided weight and gives the kernels unit-stride rows; the custom op
    called directly gets the same layouts checked, not read wrongly."""
    x, w = torch.randn(4, 8, device=device), torch.randn(16, device=device)[::2]
    with pytest.raises(ValueError, match="weight must be contiguous"):
        torch.ops.fusewise.norm_fwd(x, None, w, None, 1e-5, False)
    xt = torch.randn(8, 4, device=device).t()
    with pytest.raises(ValueError, match="x must have unit stride along its last dim"):
        torch.ops.fusewise.norm_fwd(xt, None, None, None, 1e-6, True)


def test_compile_fullgraph_matches_eager(device):
    backend = "inductor" if device.type == "cuda" else "aot_eager"

    def block(x, r, w1, w2, b):
        y, h = fusewise.ops.add_rms_norm(x, r, w1)
        return fusewise.ops.layer_norm(y * 2, w2, b), h

    compiled = torch.compile(block, fullgraph=True, backend=backend)
    args = [torch.randn(8, 64, device=device, requires_grad=True) for _ in range(2)]
    args += [torch.randn(64, device=device, requires_grad=True) for _ in range(3)]
    out_c, h_c = compiled(*args)
    g_c = torch.autograd.grad(out_c.sum() + h_c.square().sum(), args)
    out_e, h_e = block(*args)
    g_e = torch.autograd.grad(out_e.sum() + h_e.square().sum(), args)
    assert rel_err(out_c, out_e) < 1e-6 and rel_err(h_c, h_e) < 1e-6
    for a, b in zip(g_c, g_e):
        assert rel_err(a, b) < 1e-5


def test_compile_fullgraph_with_views(device):
    """Under torch.compile too: a broadcast x and weight, a transposed residual, a strided weight
    and bias; gradients reach the tensors the views come from."""
    backend = "inductor" if device.type == "cuda" else "aot_eager"

    def block(x0, r, w1, wb):
        y, h = fusewise.ops.add_rms_norm(x0.expand(5, 8), r, w1.expand(8))
        return fusewise.ops.layer_norm(y, wb[::2], wb[1::2]).sum() + h.square().sum()

    args = [torch.randn(1, 8, device=device), torch.randn(8, 5, device=device).t()]
    args += [torch.randn(1, device=device), torch.randn(16, device=device)]
    args = [a.requires_grad_() for a in args]
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    out_c, out_e = compiled(*args), block(*args)
    assert rel_err(out_c, out_e) < 1e-6
    for a, b in zip(torch.autograd.grad(out_c, args), torch.autograd.grad(out_e, args)):
        assert rel_err(a, b) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_rms_norm"])
@pytest.mark.parametrize("shape", [(64, 512), (4096, 256)])
def test_cuda_graph_capture_replays_forward_and_backward(op, shape):
    from cuda_graphs import replay_matches_eager
    from norm_cases import fused

    a = make_inputs(op, shape, torch.bfloat16, "cuda")
    grads = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(2)]

    def step():
        outs = fused(op, a)
        return (*outs, *torch.autograd.grad(outs, list(a.values()), grads[: len(outs)]))

    replay_matches_eager(step, lambda: a["x"].copy_(torch.randn_like(a["x"])))


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_rows_2_31_elements_apart(op):
    """Two rows 2**31 + 8 elements apart (a stride past int32 that 8 divides, 16 does not: one
    the kernels must not take divided by ALIGN, whose product would overflow int32), forward
    and backward against float64; the width 8 divides too."""
    n, stride = 1000, 2**31 + 8
    storage = torch.empty(stride + n, device="cuda", dtype=torch.bfloat16)
    x = storage.as_strided((2, n), (stride, 1))
    x.copy_(torch.randn(2, n, device="cuda") * 2 + 0.5)
    w = (1 + 0.3 * torch.randn(n, device="cuda")).to(torch.bfloat16)
    dy = torch.randn(2, n, device="cuda", dtype=torch.bfloat16)
    x64 = x.detach().double().requires_grad_()
    if op == "layer_norm":
        y = fusewise.ops.layer_norm(x.requires_grad_(), w)
        ref = F.layer_norm(x64, (n,), w.double())
    else:
        y = fusewise.ops.rms_norm(x.requires_grad_(), w)
        ref = F.rms_norm(x64, (n,), w.double(), 1e-6)
    assert rel_err(y, ref) < 5e-3
    (dx,) = torch.autograd.grad(y, [x], dy)
    (dx_ref,) = torch.autograd.grad(ref, [x64], dy.double())
    assert rel_err(dx, dx_ref) < 5e-3
    del storage


@pytest.mark.gpu
def test_past_2_31_elements_uses_64_bit_offsets():
    n = 8192
    m = (1 << 31) // n + 3  # the last rows start past element 2**31
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = fusewise.ops.rms_norm(x, w)
    tail = slice(m - 4, m)
    assert rel_err(y[tail], F.rms_norm(x[tail].double(), (n,), w.double(), 1e-6)) < 5e-3
    xg = x.requires_grad_()
    dy = torch.randn_like(x)
    (dx,) = torch.autograd.grad(fusewise.ops.rms_norm(xg, w), [xg], dy)
    xt = x[tail].detach().double().requires_grad_()
    (dxt,) = torch.autograd.grad(F.rms_norm(xt, (n,), w.double(), 1e-6), [xt], dy[tail].double())
    assert rel_err(dx[tail], dxt) < 5e-3
