"""fusewise.ops.linear_cross_entropy against a float64 reference (full logits + F.cross_entropy),
loss and every gradient, every option and reduction, held to eager PyTorch's error in the same
dtype plus a small slack; chunking forced small so every case crosses chunk boundaries."""

import numpy as np
import pytest
import torch
from layouts import relayout
from lce_cases import check, rel

import fusewise
from fusewise.ops import reference
from fusewise.ops.linear_ce import launch as lce
from fusewise.ops.linear_ce import reference as lce_reference

OPTIONS = {
    "plain": {},
    "sum": {"reduction": "sum"},
    "none": {"reduction": "none"},
    "smooth": {"label_smoothing": 0.1},
    "zloss": {"z_loss": 1e-3},
    "softcap": {"softcap": 4.0},
    "all": {"label_smoothing": 0.2, "z_loss": 1e-2, "softcap": 3.0, "reduction": "sum"},
}


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(lce, "CHUNK_BYTES", 8192)  # several chunks even at test sizes


def inputs(n, v, d, dtype, device, ignore="some", bias=True, lead=None):
    h = torch.randn(*(lead or (n,)), d, device=device, dtype=dtype).requires_grad_()
    w = (torch.randn(v, d, device=device) / d**0.5).to(dtype).requires_grad_()
    b = (0.1 * torch.randn(v, device=device)).to(dtype).requires_grad_() if bias else None
    t = torch.randint(0, v, lead or (n,), device=device)
    if ignore == "some":
        t.view(-1)[::5] = -100
    elif ignore == "all":
        t.fill_(-100)
    return h, w, t, b


@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("opt", list(OPTIONS))
def test_matches_float64(opt, dname, device):
    """fp32_accumulate=True: every output as accurate as eager (the default's weight gradient
    has its own bound, below)."""
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dname]
    check(*inputs(45, 503, 32, dtype, device), dtype, fp32_accumulate=True, **OPTIONS[opt])


@pytest.mark.parametrize("v", [1, 127, 1000])
def test_vocab_sizes_not_multiples_of_the_chunk(v, device):
    check(*inputs(19, v, 8, torch.float32, device), torch.float32)


def test_3d_hidden_no_bias_no_ignore(device):
    check(
        *inputs(0, 300, 16, torch.float32, device, ignore="none", bias=False, lead=(3, 7)),
        torch.float32,
        reduction="none",
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored_is_zero_not_nan(reduction, device):
    h, w, t, b = inputs(10, 50, 8, torch.float32, device, ignore="all")
    out = fusewise.ops.linear_cross_entropy(h, w, t, b, reduction=reduction)
    assert torch.equal(out, torch.zeros_like(out))
    grads = torch.autograd.grad(out.sum(), [h, w, b])
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)


def test_bad_input_is_named(device):
    h, w, t, b = inputs(6, 20, 8, torch.float32, device)
    with pytest.raises(ValueError, match="weight must be"):
        fusewise.ops.linear_cross_entropy(h, w[:, :4], t, b)
    with pytest.raises(TypeError, match="share a dtype"):
        fusewise.ops.linear_cross_entropy(h, w.double(), t, b)
    with pytest.raises(ValueError, match="target must be an integer tensor"):
        fusewise.ops.linear_cross_entropy(h, w, t.float(), b)
    with pytest.raises(ValueError, match="reduction must be one of"):
        fusewise.ops.linear_cross_entropy(h, w, t, b, reduction="avg")
    with pytest.raises(ValueError, match="bias must be"):
        fusewise.ops.linear_cross_entropy(h, w, t, b[:5])
    if device.type == "cpu":
        t_bad = t.clone()
        t_bad[2] = 20
        with pytest.raises(ValueError, match=r"target\[2\] = 20 is outside \[0, 20\)"):
            fusewise.ops.linear_cross_entropy(h, w, t_bad, b)


def test_module_and_compile_fullgraph(device):
    h, w, t, b = inputs(30, 200, 16, torch.float32, device)
    loss_fn = fusewise.nn.LinearCrossEntropyLoss(label_smoothing=0.1, z_loss=1e-3, chunk_size=7)
    eager = loss_fn(h, w, t, b)
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    compiled = torch.compile(loss_fn, fullgraph=True, backend=backend)(h, w, t, b)
    assert rel(compiled, eager) < 1e-6
    for a, e in zip(
        torch.autograd.grad(compiled, [h, w, b]), torch.autograd.grad(eager, [h, w, b])
    ):
        assert rel(a, e) < 1e-5
    assert fusewise.ops.paths()["linear_cross_entropy"] == (
        "triton" if device.type == "cuda" else "triton-interpreter"
    )


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_opcheck(layout, device):
    """Also with hidden and weight as .T views, which the ops take without a copy: the fake
    outputs must have the real ones' strides (torch.compile plans the graph on the fakes)."""
    h, w, t, b = inputs(12, 40, 8, torch.float32, device)
    h, w = (relayout(x, layout).requires_grad_() for x in (h, w))
    ops = torch.ops.fusewise
    for reduction in ("none", "mean", "sum"):
        fwd_args = (h, w, t, b, -100, reduction, 0.1, 1e-3, 3.0, False, 0)
        torch.library.opcheck(ops.linear_ce_fwd.default, fwd_args)
        grad = torch.rand(12 if reduction == "none" else (), device=device)
        bwd_args = (grad, h.detach(), w.detach(), t, b.detach(), -100, reduction)
        torch.library.opcheck(ops.linear_ce_bwd.default, (*bwd_args, 0.0, 0.0, None, False, 5))
    for mean in (True, False):
        torch.library.opcheck(
            ops.linear_ce_fused.default, (h, w, t, b, -100, mean, 0.1, 1e-3, 3.0, mean, 0)
        )
    for dtype in (torch.float32, torch.bfloat16):
        grad = relayout(torch.randn(12, 8, device=device), layout)
        torch.library.opcheck(ops.linear_ce_scale.default, (grad, torch.tensor(0.5), dtype))


@pytest.mark.gpu
def test_peak_memory_grows_with_vocab_only_through_the_weight():
    """Extra memory beyond inputs and gradients is one chunk plus O(N): doubling V adds the
    weight's gradient growth, not N x V logits."""
    torch.manual_seed(0)
    extra = {}
    for v in (32768, 65536):
        h, w, t, b = inputs(8192, v, 1024, torch.bfloat16, torch.device("cuda"), bias=False)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = fusewise.ops.linear_cross_entropy(h, w, t)
        torch.autograd.grad(loss, [h, w])
        torch.cuda.synchronize()
        weight_terms = w.numel() * 2  # its bf16 gradient
        extra[v] = torch.cuda.max_memory_allocated() - base - weight_terms
    logits_growth = 8192 * 32768 * 4  # what materialised fp32 logits would add
    assert extra[65536] - extra[32768] < 0.1 * logits_growth


@pytest.mark.parametrize("opt", ["plain", "all"])
def test_default_accumulates_the_weight_gradient_in_its_dtype(opt, device):
    """Default (bf16): loss, dhidden and dbias as accurate as eager, also under a random
    grad_output; dweight rounds once per chunk, so its error may reach ~sqrt(chunks + 1) times
    eager's (a random walk of k roundings) but no further: an accumulation bug (a chunk lost or
    overwritten) costs far more."""
    h, w, t, b = inputs(45, 503, 32, torch.bfloat16, device)
    k = len(lce._chunks(45, 503, 2))
    assert k >= 4
    check(h, w, t, b, torch.bfloat16, dw_rounds=k, **OPTIONS[opt])


def test_chunk_size_is_honoured_and_checked(device, monkeypatch):
    h, w, t, b = inputs(40, 64, 8, torch.float32, device)
    seen = []
    real = lce.ce_rows_triton
    monkeypatch.setattr(lce, "ce_rows_triton", lambda z, *a: (seen.append(z.shape[0]), real(z, *a)))
    ref = reference.linear_cross_entropy(h, w, t, b)
    torch.testing.assert_close(fusewise.ops.linear_cross_entropy(h, w, t, b, chunk_size=16), ref)
    assert seen == [16, 16, 8]
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        fusewise.ops.linear_cross_entropy(h, w, t, b, chunk_size=0)
    # any integral type (operator.index): numpy and torch integers too
    for size in (np.int64(16), torch.tensor(16)):
        seen.clear()
        torch.testing.assert_close(
            fusewise.ops.linear_cross_entropy(h, w, t, b, chunk_size=size), ref
        )
        assert seen == [16, 16, 8]


def test_float64_takes_the_reference_path_and_says_so(device):
    h, w, t, b = inputs(20, 90, 8, torch.float64, device)
    with pytest.warns(UserWarning, match="linear_cross_entropy: dtype torch.float64"):
        check(h, w, t, b, torch.float32, label_smoothing=0.1, softcap=5.0)
    assert fusewise.ops.paths()["linear_cross_entropy"] == "reference"


@pytest.mark.parametrize("layout", ["contiguous", "strided", "offset"])
def test_row_kernel_matches_its_torch_twin_and_poisons_a_bad_target(layout, device):
    """The chunk pass alone, Triton against torch: statistics, in-place gradient with a
    per-token scale, ignored rows zero, and a target outside [0, V) -> NaN loss (no raise);
    target and scale in any layout (a strided target read as contiguous meets poison)."""
    z0 = 3 * torch.randn(7, 300, device=device).bfloat16()
    tgt = relayout(torch.tensor([0, 299, -100, 5, 300, -1, 17], device=device), layout)
    scale = relayout(torch.rand(7, device=device) + 0.5, layout)
    opts = (-100, 0.1, 1e-2, 2.5)
    out = {}
    for name, fn in (("triton", lce.ce_rows_triton), ("torch", lce_reference.ce_rows)):
        z = z0.clone()
        loss, lse = torch.full((7,), 7.0, device=device), torch.full((7,), 7.0, device=device)
        fn(z, tgt, loss, lse, scale, opts)
        out[name] = (z.float(), loss, lse)
    (zt, lt, st), (zr, lr, sr) = out["triton"], out["torch"]
    assert torch.isnan(lt[[4, 5]]).all() and torch.isnan(lr[[4, 5]]).all()
    good = [0, 1, 2, 3, 6]
    torch.testing.assert_close(lt[good], lr[good], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(st, sr, rtol=1e-5, atol=1e-5)
    assert lt[2] == 0 and torch.equal(zt[2], torch.zeros_like(zt[2]))  # ignored: no gradient
    torch.testing.assert_close(zt[good], zr[good], rtol=1e-2, atol=2e-4)  # bf16 gradients


def test_one_backward_per_call_and_frozen_inputs(device):
    h, w, t, b = inputs(16, 64, 8, torch.float32, device)
    loss = fusewise.ops.linear_cross_entropy(h, w, t, b)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()
    # frozen head: only hidden gets a gradient, and it is the same one
    w2, b2 = w.detach(), b.detach()
    (dh,) = torch.autograd.grad(fusewise.ops.linear_cross_entropy(h, w2, t, b2), [h])
    (ref,) = torch.autograd.grad(reference.linear_cross_entropy(h, w2, t, b2), [h])
    torch.testing.assert_close(dh, ref, rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        torch.testing.assert_close(
            fusewise.ops.linear_cross_entropy(h, w, t, b),
            reference.linear_cross_entropy(h, w, t, b),
        )


@pytest.mark.gpu
def test_bad_target_on_the_gpu_is_a_nan_loss_not_a_sync():
    h, w, t, b = inputs(8, 20, 8, torch.bfloat16, torch.device("cuda"))
    t[3] = 20
    assert torch.isnan(fusewise.ops.linear_cross_entropy(h, w, t, b))


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cuda_graph_capture_replays_loss_and_gradients(reduction):
    """No host sync anywhere: forward and backward capture in a CUDA graph and replay on new
    hidden states and targets (the count of valid tokens changes and stays on the device)."""
    from cuda_graphs import replay_matches_eager

    h, w, t, b = inputs(96, 1000, 32, torch.bfloat16, torch.device("cuda"))
    g = torch.rand(96, device="cuda") if reduction == "none" else None

    def step():
        loss = fusewise.ops.linear_cross_entropy(
            h, w, t, b, reduction=reduction, chunk_size=40, label_smoothing=0.1
        )
        return (loss, *torch.autograd.grad(loss, [h, w, b], g))

    def new_data():
        h.copy_(torch.randn_like(h))
        t.copy_(torch.randint(0, 1000, t.shape, device="cuda"))
        t[::3] = -100

    replay_matches_eager(step, new_data)


# --- issue #9: found by adversarial testing -------------------------------------------------------


def _compiled(device, **kw):
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    fn = lambda h, w, t, b: fusewise.ops.linear_cross_entropy(h, w, t, b, **kw)  # noqa: E731
    return torch.compile(fn, fullgraph=True, backend=backend)


@pytest.mark.parametrize("reduction", ["mean", "none"])  # the fused op and the forward-only op
def test_bad_target_compiled_agrees_with_eager(reduction, device):
    """A non-ignored target outside [0, V): on the CPU eager and torch.compile(fullgraph=True)
    raise the same ValueError (the custom op's implementation checks; it runs eagerly there); on
    a GPU both give a NaN loss (raising would need a host sync)."""
    h, w, t, b = inputs(0, 20, 8, torch.float32, device, lead=(2, 3))
    t[1, 1] = 20
    calls = [
        lambda: fusewise.ops.linear_cross_entropy(h, w, t, b, reduction=reduction),
        lambda: _compiled(device, reduction=reduction)(h, w, t, b),
    ]
    if device.type == "cpu":
        messages = []
        for call in calls:
            with pytest.raises(ValueError, match=r"target\[1, 1\] = 20 is outside \[0, 20\)") as e:
                call()
            messages.append(str(e.value))
        assert messages[0] == messages[1]
    else:
        for call in calls:
            out = call()
            assert torch.isnan(out[1, 1] if reduction == "none" else out)


def _backward_twice(situation, h, w, t, b):
    f = lambda h: fusewise.ops.linear_cross_entropy(h, w, t, b)  # noqa: E731
    loss = f(h)
    if situation == "retain_graph":
        loss.backward(retain_graph=True)
        loss.backward()
    elif situation == "backward_twice":
        loss.backward()
        loss.backward()
    elif situation == "grad_then_backward":
        torch.autograd.grad(loss, [h])
        loss.backward()
    elif situation == "two_terms":
        (2 * loss).backward()
        (3 * loss).backward()
    elif situation == "checkpoint_retain_graph":
        loss = torch.utils.checkpoint.checkpoint(f, h, use_reentrant=False)
        loss.backward(retain_graph=True)
        loss.backward()


SECOND_BACKWARD = {  # situation -> what the message must say happened
    "retain_graph": "kept by the first",
    "checkpoint_retain_graph": "kept by the first",
    "backward_twice": "after the first one freed",
    "grad_then_backward": "after the first one freed",
    "two_terms": "after the first one freed",
}


@pytest.mark.parametrize("situation", list(SECOND_BACKWARD))
def test_second_backward_says_what_happened_and_what_to_do(situation, device):
    h, w, t, b = inputs(16, 64, 8, torch.float32, device)
    with pytest.raises(RuntimeError, match="second backward") as e:
        _backward_twice(situation, h, w, t, b)
    message = str(e.value)
    assert SECOND_BACKWARD[situation] in message
    if "freed" in SECOND_BACKWARD[situation]:
        assert "retain_graph=True would not help" in message
    for fix in (
        "add the terms",
        "torch.autograd.grad(loss, [hidden, weight",
        "linear_cross_entropy again for each backward",
        "reduction='none'",
    ):
        assert fix in message


def test_what_the_second_backward_message_offers_works(device):
    """The message's alternatives: reduction="none" allows several backwards, and two terms
    built on one loss backward once through their sum."""
    h, w, t, b = inputs(16, 64, 8, torch.float32, device)
    n_valid = (t != -100).sum()
    loss = fusewise.ops.linear_cross_entropy(h, w, t, b, reduction="none").sum() / n_valid
    first = torch.autograd.grad(loss, [h, w, b], retain_graph=True)
    second = torch.autograd.grad(loss, [h, w, b])
    (ref,) = torch.autograd.grad(reference.linear_cross_entropy(h, w, t, b), [h])
    torch.testing.assert_close(first[0], ref, rtol=1e-5, atol=1e-7)
    assert all(torch.equal(a, c) for a, c in zip(first, second))
    loss = fusewise.ops.linear_cross_entropy(h, w, t, b)
    (dh,) = torch.autograd.grad(2 * loss + 3 * loss, [h])
    torch.testing.assert_close(dh, 5 * ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_create_graph_raises_rather_than_drop_the_second_derivative(reduction, device):
    """The gradients carry no graph of their own: a gradient penalty through them would
    silently lose its term, so create_graph=True raises and says why."""
    h, w, t, b = inputs(16, 64, 8, torch.float32, device)
    loss = fusewise.ops.linear_cross_entropy(h, w, t, b, reduction=reduction).sum()
    with pytest.raises(RuntimeError, match="no second derivative.*create_graph=True"):
        torch.autograd.grad(loss, [h], create_graph=True)


NAN, INF = float("nan"), float("inf")
BAD_OPTIONS = [
    ("z_loss", NAN),
    ("z_loss", INF),
    ("z_loss", -1e-3),
    ("z_loss", True),
    ("z_loss", "0.1"),
    ("softcap", NAN),
    ("softcap", INF),
    ("softcap", 0.0),
    ("softcap", -3.0),
    ("softcap", True),
    ("label_smoothing", NAN),
    ("label_smoothing", INF),
    ("label_smoothing", 1.5),
    ("label_smoothing", -0.1),
    ("label_smoothing", "0.1"),
    ("chunk_size", True),
    ("chunk_size", 2.0),
    ("chunk_size", "2"),
    ("chunk_size", -1),
    ("ignore_index", True),
    ("ignore_index", -100.0),
    ("ignore_index", "x"),
    ("ignore_index", None),
    ("fp32_accumulate", "no"),
    ("fp32_accumulate", 1),
    ("reduction", "avg"),
    ("reduction", None),
]


@pytest.mark.parametrize("name,value", BAD_OPTIONS, ids=[f"{n}={v!r}" for n, v in BAD_OPTIONS])
def test_bad_option_is_named(name, value, device):
    h, w, t, b = inputs(6, 20, 8, torch.float32, device)
    with pytest.raises((ValueError, TypeError), match=rf"^{name} must"):
        fusewise.ops.linear_cross_entropy(h, w, t, b, **{name: value})


def test_ignore_index_from_numpy_or_torch(device):
    h, w, t, b = inputs(10, 20, 8, torch.float32, device)
    ref = fusewise.ops.linear_cross_entropy(h, w, t, b)
    for ii in (np.int64(-100), np.int32(-100), torch.tensor(-100)):
        assert torch.equal(fusewise.ops.linear_cross_entropy(h, w, t, b, ignore_index=ii), ref)


def test_bad_tensor_argument_is_named(device):
    h, w, t, b = inputs(6, 20, 8, torch.float32, device)
    f = fusewise.ops.linear_cross_entropy
    cases = [
        ((h[0, 0], w, t[0], b), r"^hidden must be \[N, d\] or \[B, T, d\]"),
        ((h.detach().cpu().numpy(), w, t, b), "^hidden must be a torch.Tensor"),
        ((h, w.detach().cpu().numpy(), t, b), "^weight must be a torch.Tensor"),
        ((h, w, t.tolist(), b), "^target must be a torch.Tensor"),
        ((h, w, t, b.detach().cpu().numpy()), "^bias must be a torch.Tensor"),
        ((h, w, t[0], b), r"^target must .*shape hidden.shape\[:-1\] = \(6,\)"),
        ((h, w[:0], torch.full_like(t, -100), b[:0]), "^weight must have at least one row"),
        ((h, w.detach().to("meta"), t, b), "^weight is on meta.*move"),
        ((h.half(), w, t, b), "^hidden and weight must share a dtype.*to\\(weight.dtype\\)"),
    ]
    for args, pattern in cases:
        with pytest.raises((TypeError, ValueError), match=pattern):
            f(*args)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_unbatched_empty_and_zero_width(reduction, device):
    """One token as F.cross_entropy's unbatched form (hidden [d], a 0-d target); batches with no
    tokens ([0, d], [2, 0, d]): zero loss and zero gradients; d = 0: the logits are the bias."""
    h, w, t, b = inputs(1, 20, 8, torch.float32, device, ignore="none")
    check(h[0].detach().requires_grad_(), w, t[0], b, torch.float32, reduction=reduction)
    for lead in ((0,), (2, 0)):
        he = torch.randn(*lead, 8, device=device, requires_grad=True)
        te = torch.zeros(lead, dtype=torch.int64, device=device)
        out = fusewise.ops.linear_cross_entropy(he, w, te, b, reduction=reduction)
        assert out.shape == (lead if reduction == "none" else ()) and not out.any()
        grads = torch.autograd.grad(out.sum(), [he, w, b])
        assert all(g.shape == x.shape and not g.any() for g, x in zip(grads, [he, w, b]))
    h0 = torch.randn(5, 0, device=device, requires_grad=True)
    w0 = torch.randn(20, 0, device=device, requires_grad=True)
    check(h0, w0, t.new_tensor([1, 2, 3, 4, 5]), b, torch.float32, reduction=reduction)
