"""linear_cross_entropy eager against torch.compile(fullgraph=True): the same forward and the same
backward implementation (launch.forward, launch.scale_grad / launch.backward) behind the
autograd.Function and behind the custom ops, so loss and gradients are bitwise equal for every
option, in fp32 and bf16. grad_output is not 1 (a scalar 0.37 for "mean"/"sum", random per token
for "none"), so the backward's scaling pass does real work; a few ignored rows, several chunks.
On the CPU the compiled graph runs under aot_eager (the custom ops' implementations run as
written, the Triton kernels under the interpreter), as tests/test_linear_ce.py does."""

import pytest
import torch

import fusewise

CASES = {
    "mean": {},
    "sum": {"reduction": "sum"},
    "none": {"reduction": "none"},
    "smooth": {"label_smoothing": 0.1},
    "zloss": {"z_loss": 1e-2},
    "softcap": {"softcap": 3.0},
    "no_bias": {"bias": False},
    "fp32_accumulate": {"fp32_accumulate": True},
    "all_sum": {"reduction": "sum", "label_smoothing": 0.2, "z_loss": 1e-2, "softcap": 3.0},
    "all_none": {"reduction": "none", "label_smoothing": 0.2, "z_loss": 1e-2, "softcap": 3.0},
}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # a compile per case: stay under the recompile limit
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_equals_eager_bitwise(case, dname, device):
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dname]
    kw = dict(CASES[case])
    has_bias = kw.pop("bias", True)
    n, v, d = 13, 40, 8
    h = torch.randn(n, d, device=device).to(dtype).requires_grad_()
    w = (torch.randn(v, d, device=device) / d**0.5).to(dtype).requires_grad_()
    b = (0.1 * torch.randn(v, device=device)).to(dtype).requires_grad_() if has_bias else None
    t = torch.randint(0, v, (n,), device=device)
    t[::4] = -100  # ignored rows, the first among them
    inputs = [x for x in (h, w, b) if x is not None]
    per_token = kw.get("reduction") == "none"
    g = torch.rand(n, device=device) if per_token else torch.tensor(0.37, device=device)

    def fn(h, w, t, b):
        return fusewise.ops.linear_cross_entropy(h, w, t, b, chunk_size=5, **kw)

    backend = "inductor" if device.type == "cuda" else "aot_eager"
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    results = {}
    for name, f in (("eager", fn), ("compiled", compiled)):
        out = f(h, w, t, b)
        results[name] = (out, *torch.autograd.grad(out, inputs, g))
    for name, e, c in zip(("loss", "dhidden", "dweight", "dbias"), *results.values()):
        assert e.dtype == c.dtype and e.shape == c.shape, name
        assert torch.equal(e, c), f"{name}: max |eager - compiled| = {(e - c).abs().max()}"
