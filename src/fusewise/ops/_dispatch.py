"""Which path an op takes, said out loud: the Triton kernel, or the eager reference and why.

Never the silent fallback: the first time an op takes the reference path for a given reason it
warns (once per op and reason); with FUSEWISE_STRICT=1 it raises instead. ``paths()`` tells which
path each op took last, so a user (or the diagnosis) can check that the fast path is running.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
from torch.autograd import forward_ad
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

TRITON = "triton"
INTERPRETER = "triton-interpreter"
REFERENCE = "reference"

_TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_last_path: dict[str, str] = {}
_warned: set[tuple[str, str]] = set()


# files whose frames a warning skips to reach the user's line: fusewise's and torch's, but for
# fusewise's bundled examples (scripts a user runs and reads: their lines are the user's)
_INTERNAL_DIRS = tuple(
    os.path.dirname(os.path.abspath(f)) + os.sep
    for f in (os.path.dirname(os.path.abspath(__file__)), torch.__file__)
)
_EXAMPLES_DIR = os.path.join(_INTERNAL_DIRS[0], "examples") + os.sep


def _internal(filename: str) -> bool:
    return filename.startswith(_INTERNAL_DIRS) and not filename.startswith(_EXAMPLES_DIR)


def caller_stacklevel() -> int:
    """warnings.warn's stacklevel for the first frame outside fusewise and torch, from the
    function that warns: the user's line that reached the op, however it got there (a direct
    call, autograd.Function.apply, a backward run by the autograd engine, a patched module's
    forward through nn.Module.__call__). A fixed stacklevel points into fusewise or torch on
    some of those paths. A stack with no such frame (a thread started from C on a fusewise
    function, a backward on CUDA's autograd thread) names its outermost frame: a level past it
    would file the warning under `sys:1`."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and _internal(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level


class FusewiseFallbackError(RuntimeError):
    """Raised instead of falling back to the reference path when FUSEWISE_STRICT=1."""


def through_custom_op() -> bool:
    """Call the registered custom op rather than the eager autograd.Function: under
    torch.compile (which traces it), and while a user-level TorchDispatchMode is active
    (fusewise's own op-graph recorder, FlopCounterMode, ...), which then sees one
    `fusewise.<op>` call with its inputs and outputs, costed by the family's cost model,
    instead of the launches' and the interpreter's own ops or nothing at all. Same kernels."""
    return torch.compiler.is_compiling() or is_in_torch_dispatch_mode(include_infra_modes=False)


def wants_grad(*tensors: torch.Tensor | None) -> bool:
    """A gradient of any kind may be asked for: backward (grad mode and an input that requires
    grad), or forward-mode AD (a dual level is open: dual tensors do not require grad, and the
    op's autograd.Function is what says that it has no jvp, rather than dropping the tangent).
    When not, the ops call their implementation without the Function, whose apply is host time
    for nothing (~10 us a call)."""
    if getattr(forward_ad, "_current_level", -1) >= 0:
        return True
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def refuse_create_graph(op: str, patch_flag: str) -> None:
    """First thing in a backward that has no second derivative. Grad mode is on there only under
    create_graph=True (a gradient penalty, a Hessian-vector product), and the kernels' gradients
    carry no graph: their own derivatives would silently be left out. torch's
    once_differentiable notices only when the incoming gradient requires grad, which the
    gradient of y.sum() does not (so the penalty's terms through the op were dropped)."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"fusewise.ops.{op} has no second derivative: its gradients carry no graph, so "
            f"differentiating them (create_graph=True: a gradient penalty, a Hessian-vector "
            f"product) would silently leave out its terms. Use fusewise.ops.reference.{op} "
            f"there (a model patched by fusewise.patch: fusewise.unpatch, or patch with "
            f"{patch_flag}=False)."
        )


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def strict() -> bool:
    return os.environ.get("FUSEWISE_STRICT", "0") not in ("", "0")


def _why_not_triton(tensors: list[torch.Tensor]) -> str | None:
    t = tensors[0]
    if t.is_cuda:  # first: this runs on every eager call, and is_cuda is the cheapest read
        if interpreting():
            return (
                "TRITON_INTERPRET=1 is set but the tensors are on a GPU; unset it to run the kernel"
            )
    elif t.device.type != "cpu":
        return f"tensors are on {t.device.type!r}; the Triton kernel runs on CUDA GPUs only"
    elif not interpreting():
        return "tensors are on the CPU (the Triton kernel needs a CUDA GPU, or TRITON_INTERPRET=1)"
    for x in tensors:
        if x.dtype not in _TRITON_DTYPES:
            return f"dtype {x.dtype} is not one of float32, bfloat16, float16"
    return None


def choose_path(op: str, *tensors: torch.Tensor | None) -> str:
    """TRITON / INTERPRETER when the kernel can run on these tensors, else REFERENCE (warned)."""
    present = [t for t in tensors if t is not None]
    reason = _why_not_triton(present)
    if reason is None:
        path = TRITON if present[0].is_cuda else INTERPRETER
    else:
        message = f"fusewise.ops.{op}: {reason}; running the eager reference instead."
        if strict():
            raise FusewiseFallbackError(message + " (FUSEWISE_STRICT=1 forbids the fallback)")
        if (op, reason) not in _warned:
            _warned.add((op, reason))
            warnings.warn(message, stacklevel=caller_stacklevel())
        path = REFERENCE
    _last_path[op] = path
    return path


def record_path(op: str, path: str) -> None:
    """For ops with a single implementation (no Triton/reference choice to make)."""
    _last_path[op] = path


def forget_paths() -> None:
    """Forget the paths taken so far (fusewise verify, to see which ops its own runs took)."""
    _last_path.clear()


def paths() -> dict[str, str]:
    """The path each op took on its last call: 'triton', 'triton-interpreter' or 'reference'
    (or an op's single path, e.g. linear_cross_entropy's 'chunked-torch')."""
    return dict(_last_path)
