"""Start something once the optimizer.step() that is running has returned: at the next Python
call the script makes (what fusewise diagnose uses to start the recorded step's profiler session).

Why: a torch.profiler session with with_stack=True (its Python tracer) started inside
optimizer.step(), as a step-end hook does, crashed the process when it stopped, in about one
diagnosis in fifteen on torch 2.13 (a segfault or "IndexError: Argument passed to at() was not
in the map" from torch.autograd._disable_profiler, whether stopped inside the next step's hook or
after the script had unwound). The same sessions started and stopped from a plain function the
script calls between steps ran 80 times out of 80. So the session starts from a one-shot profile
function (sys.setprofile): once the optimizer's frames have returned, at the first Python call
that is not inside a C call (a step's `opt.zero_grad()`, `model(x)`, the data loader's
__next__), before any of that call runs. A script that makes no Python call before its next
optimizer.step() gets the start at that call's entry. Nothing of the step is missed: a tensor
op called from the script directly is a C call, which cannot start before its Python caller.
"""

from __future__ import annotations

import os
import sys

from .opgraph import _FUSEWISE_DIR

_TORCH_OPTIM = os.sep + os.path.join("torch", "optim") + os.sep

_armed = None  # the profile function installed, while one waits


def after_optimizer_step(start) -> bool:
    """Call start() at the first Python call after the running optimizer.step() returns. False,
    with start() not called, when that cannot be arranged (no optimizer.step() running on this
    stack, or another profile function is installed): the caller then starts at once."""
    global _armed
    if sys.getprofile() is not None:
        return False
    wrapper = _outermost_optimizer_frame(sys._getframe(1))
    if wrapper is None:
        return False
    returned = False
    in_c_calls = 0

    def wait(frame, event, arg):
        nonlocal returned, in_c_calls
        if not returned:
            returned = event == "return" and frame is wrapper
        elif event == "c_call":
            in_c_calls += 1
        elif event in ("c_return", "c_exception"):
            in_c_calls = max(in_c_calls - 1, 0)
        elif event == "call" and in_c_calls == 0:
            disarm()
            start()

    _armed = wait
    sys.setprofile(wait)
    return True


def disarm() -> None:
    """Remove the waiting profile function, if it is still installed (a run that ended first)."""
    global _armed
    if _armed is not None and sys.getprofile() is _armed:
        sys.setprofile(None)
    _armed = None


def _outermost_optimizer_frame(frame):
    """The outermost consecutive frame of torch/optim/ above `frame` (optimizer.step()'s
    wrapper), or None when no optimizer code is on the stack."""
    found = None
    while frame is not None:
        if _TORCH_OPTIM in frame.f_code.co_filename:
            found = frame
        elif found is not None and not frame.f_code.co_filename.startswith(_FUSEWISE_DIR):
            return found
        frame = frame.f_back
    return found
