"""The rotary kernel's head chunks (all of a chunk's loads before its stores) and the launcher's
plans (what a call's shapes and strides decide, kept by signature), and the eager path without
autograd.Function when no gradient is wanted. Against the same float64 oracle as test_rotary.py;
chunk sizes forced small so that several chunks, masked ones and chunks past k's heads run."""

import pytest
import torch
from test_rotary import Case, _check, _cos_sin, _oracle, poisoned_rotary_outputs  # noqa: F401

from fusewise.ops import _dispatch, apply_rotary
from fusewise.ops.rotary import launch as rotary_launch


@pytest.mark.parametrize(
    "n_q, n_k, block_half, chunk, want",
    [
        (32, 8, 64, 8192, (1, 32, 8)),  # Llama-3-8B: a row of q and k is one chunk
        (64, 8, 64, 8192, (2, 32, 4)),  # Llama-3-70B: two
        (40, 8, 64, 8192, (2, 32, 4)),  # q's second chunk holds 8 of its 32 heads: masked
        (32, 0, 64, 8192, (1, 32, 1)),  # dk not needed: k takes no room
        (0, 8, 64, 8192, (1, 1, 8)),
        (12, 3, 8, 64, (6, 2, 1)),  # k's heads end after three chunks
        (1, 1, 4096, 1024, (1, 1, 1)),  # one head each already over the size: one chunk
    ],
)
def test_head_chunks(n_q, n_k, block_half, chunk, want, monkeypatch):
    monkeypatch.setattr(rotary_launch, "CHUNK_ELEMENTS", chunk)
    chunks, block_hq, block_hk = rotary_launch.head_chunks(n_q, n_k, block_half)
    assert (chunks, block_hq, block_hk) == want
    # every head of q and of k falls in some chunk, and no chunk is bigger than asked unless
    # one head of each already is
    assert chunks * block_hq >= n_q and chunks * block_hk >= n_k
    size = (block_hq * (n_q > 0) + block_hk * (n_k > 0)) * 2 * block_half
    assert size <= chunk or block_hq == block_hk == 1


CHUNKED = [
    Case(1, 3, 12, 3, 16, 16),  # 6 chunks of 2 q heads; k (1 a chunk) ends after 3
    Case(2, 2, 5, 3, 12, 8, k="contiguous"),  # masked: head counts and pairs overhang the tiles
    Case(1, 2, 6, 4, 16, 16, interleaved=True, q="contiguous"),
    Case(2, 2, 2, 6, 20, 10, q="strided", cos="S"),  # more k heads than q: q ends first
]


@pytest.mark.parametrize("case", CHUNKED, ids=str)
@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True)])
def test_several_chunks_match_float64(case, need, device, monkeypatch):
    monkeypatch.setattr(rotary_launch, "CHUNK_ELEMENTS", 64)
    _check(case, torch.float32, device, need=need)


def test_plans_are_per_layout(device):
    """Two calls of one shape and different strides (HF's transposed q, then a contiguous one,
    then an expanded k) each run with their own plan: a plan keyed on shape alone would read
    the second with the first's strides."""
    b, s, hq, hkv, d = 2, 3, 4, 2, 16
    case = Case(b, s, hq, hkv, d, d)
    cos, sin = _cos_sin(case, torch.float32, device)
    q_hf = torch.randn(b, s, hq, d, device=device).transpose(1, 2)
    k = torch.randn(b, hkv, s, d, device=device)
    k_expanded = torch.randn(b, 1, s, d, device=device).expand(b, hkv, s, d)
    for q, kk in ((q_hf, k), (q_hf.contiguous(), k), (q_hf, k_expanded)):
        q_out, k_out = apply_rotary(q, kk, cos, sin)
        for out, x in ((q_out, q), (k_out, kk)):
            want = _oracle(x.double(), cos.double(), sin.double(), False)
            torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_no_grad_call_skips_autograd_and_runs_the_kernel(device):
    q = torch.randn(1, 2, 3, 8, device=device, requires_grad=True)
    k = torch.randn(1, 1, 3, 8, device=device, requires_grad=True)
    cos, sin = torch.rand(3, 8, device=device), torch.rand(3, 8, device=device)
    with torch.no_grad():
        q_out, k_out = apply_rotary(q, k, cos, sin)
    assert q_out.grad_fn is None and not q_out.requires_grad and not k_out.requires_grad
    assert _dispatch.paths()["apply_rotary"] != _dispatch.REFERENCE
    want = _oracle(q.detach().double(), cos.double(), sin.double(), False)
    torch.testing.assert_close(q_out.double(), want, rtol=1e-5, atol=1e-5)
    q_out, _ = apply_rotary(q, k, cos, sin)  # grad mode: through the Function
    assert q_out.grad_fn is not None


def test_forward_mode_ad_is_refused_not_dropped(device):
    """Dual tensors do not require grad: without the Function the kernel would run on the
    primal and the tangent would vanish. The op has no jvp, and must say so."""
    import torch.autograd.forward_ad as fwAD

    q, t = torch.randn(1, 2, 3, 8, device=device), torch.randn(1, 2, 3, 8, device=device)
    k = torch.randn(1, 1, 3, 8, device=device)
    cos, sin = torch.rand(3, 8, device=device), torch.rand(3, 8, device=device)
    with fwAD.dual_level(), pytest.raises((NotImplementedError, RuntimeError), match="jvp"):
        apply_rotary(fwAD.make_dual(q, t), k, cos, sin)


def test_unusual_arguments_still_get_the_full_checks(device):
    """_plainly_valid only lets the usual call skip the checks: cos requiring grad, k of
    another dtype, an odd Dr each still raise their message."""
    q = torch.randn(1, 2, 3, 8, device=device)
    k = torch.randn(1, 1, 3, 8, device=device)
    cos = torch.rand(3, 8, device=device)
    with pytest.raises(RuntimeError, match="cos.detach"):
        apply_rotary(q, k, cos.clone().requires_grad_(), cos)
    with pytest.raises(TypeError, match="q's dtype"):
        apply_rotary(q, k.double(), cos, cos)
    with pytest.raises(ValueError, match="even"):
        apply_rotary(q, k, cos[:, :3], cos[:, :3])


def _plan_of(q, k, cos):
    return rotary_launch._make_plan(q, k, cos, cos, False, False, True, True)


def test_offsets_within_a_row_go_int64_only_past_int32():
    """Meta tensors: shapes and strides without the memory. HF's layout keeps a row's heads
    adjacent (int32 offsets); a contiguous [B, H, S, D] q puts its heads S·D apart, past 2**31
    for S of 2**24."""
    s, d = 1 << 24, 128
    cos = torch.empty(s, d, device="meta")[None]
    q_hf = torch.empty(1, s, 32, d, device="meta").transpose(1, 2)
    k = torch.empty(1, s, 8, d, device="meta").transpose(1, 2)
    assert not _plan_of(q_hf, k, cos).meta["WIDE"]
    q_wide = torch.empty(1, 2, s, d, device="meta")  # head 1 starts at 2**31
    assert _plan_of(q_wide, k, cos).meta["WIDE"]


@pytest.mark.gpu
def test_heads_past_2_31_elements_apart():
    """The WIDE kernel: q's second head starts past element 2**31 of its row."""
    s, d = (1 << 24) + 4, 128
    q = torch.randn(1, 2, s, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1, s, d, device="cuda", dtype=torch.bfloat16)
    angles = torch.rand(s, d, device="cuda") * 6.3
    cos, sin = angles.cos(), angles.sin()
    assert _plan_of(q, k, cos[None]).meta["WIDE"]
    q_out, k_out = apply_rotary(q, k, cos, sin)
    tail = slice(s - 4, s)
    for out, x in ((q_out, q), (k_out, k)):
        want = _oracle(x[:, :, tail].double(), cos[tail].double(), sin[tail].double(), False)
        torch.testing.assert_close(out[:, :, tail].double(), want, rtol=1e-2, atol=1e-2)
