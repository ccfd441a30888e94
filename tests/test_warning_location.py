"""A fusewise warning names the user's line that reached it (warnings show file and line), not a
frame inside fusewise or torch, whatever the path: a direct call, an autograd backward run by the
engine, a patched module, an optimizer's step."""

import threading
import time
import warnings

import pytest
import torch

import fusewise
from fusewise.ops import _dispatch


def at(marker: str) -> tuple[str, int]:
    """(this file, the number of its line that ends with the comment `# marker`)."""
    lines = open(__file__).read().splitlines()
    (number,) = [i + 1 for i, line in enumerate(lines) if line.endswith(f"# {marker}")]
    return __file__, number


@pytest.fixture
def fallback_warns(monkeypatch):
    """Every op falls back (CPU, no interpreter) and warns afresh."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("FUSEWISE_STRICT", raising=False)
    _dispatch._warned.clear()
    yield
    _dispatch._warned.clear()


def only_warning(caught, match: str) -> warnings.WarningMessage:
    found = [w for w in caught if match in str(w.message)]
    assert len(found) == 1, [str(w.message) for w in caught]
    return found[0]


def test_direct_call_and_backward(fallback_warns):
    x = torch.randn(4, 32, requires_grad=True)
    cos = torch.randn(1, 3, 8)
    q = torch.randn(2, 2, 3, 8, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = fusewise.ops.layer_norm(x)  # CALL
        q_out, _ = fusewise.ops.apply_rotary(q, q.detach(), cos, cos)
        q_out.sum().backward()  # BACKWARD
    w = only_warning(caught, "fusewise.ops.layer_norm:")
    assert (w.filename, w.lineno) == at("CALL")
    w = only_warning(caught, "fusewise.ops.apply_rotary.backward:")
    assert (w.filename, w.lineno) == at("BACKWARD")
    assert y.shape == x.shape


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(x) * 2  # NORM_IN_FORWARD


def test_patched_module_points_at_the_models_forward(fallback_warns):
    block = Block()
    fusewise.patch(block)
    assert type(block.norm) is not torch.nn.LayerNorm  # the patch took
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        block(torch.randn(3, 16))
    w = only_warning(caught, "fusewise.ops.layer_norm:")
    assert (w.filename, w.lineno) == at("NORM_IN_FORWARD")


def test_optimizer_step_and_constructor(fallback_warns, monkeypatch):
    import fusewise.optim as optim

    monkeypatch.setattr(optim, "_warned_no_effect", set())
    p = torch.nn.Parameter(torch.randn(8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = optim.AdamW([p], lr=1e-3, foreach=True)  # CONSTRUCTOR
        p.grad = torch.randn(8)
        opt.step()  # STEP
    w = only_warning(caught, "foreach=True")
    assert (w.filename, w.lineno) == at("CONSTRUCTOR")
    w = only_warning(caught, "fusewise.ops.adamw:")
    assert (w.filename, w.lineno) == at("STEP")


def test_a_bundled_example_is_the_users_code(fallback_warns):
    """fusewise's examples are scripts a user runs: their line is named, not the one that ran
    them."""
    from fusewise.examples import gpt

    block = gpt.Block(gpt.GPTConfig(seq=8, d_model=16, heads=2), variant="fusewise")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        block(torch.randn(2, 8, 16))
    w = only_warning(caught, "fusewise.ops.layer_norm:")
    assert w.filename == gpt.__file__
    lines = open(gpt.__file__).read().splitlines()
    assert "self.ln1(x)" in lines[w.lineno - 1]


def test_a_stack_with_no_user_frame_names_its_outermost_frame(fallback_warns):
    """A thread started from C on a fusewise function has no frame outside fusewise (as a
    backward on CUDA's autograd thread): the warning names that function's line, not `sys:1`."""
    import _thread
    import inspect

    from fusewise.ops.norms import op as norm_op

    done = threading.Event()

    def target():  # the thread's one Python frame outside fusewise is this test's own
        try:
            norm_op.layer_norm(torch.randn(4, 32))
        finally:
            done.set()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _thread.start_new_thread(target, ())  # a frame outside fusewise: the user's line
        assert done.wait(60)
        done.clear()
        _dispatch._warned.clear()
        _thread.start_new_thread(norm_op.layer_norm, (torch.randn(4, 32),))  # none at all
        for _ in range(600):
            if len([w for w in caught if "fusewise.ops.layer_norm:" in str(w.message)]) == 2:
                break
            time.sleep(0.1)
    first, second = [w for w in caught if "fusewise.ops.layer_norm:" in str(w.message)]
    assert (first.filename, first.lineno) == (__file__, inspect.getsourcelines(target)[1] + 2)
    assert second.filename == inspect.getsourcefile(norm_op.layer_norm)
    assert second.filename != "sys"
