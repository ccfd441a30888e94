"""One run of a user's script for `fusewise verify`: unpatched or patched, its steps timed.

The script runs in this process as `python SCRIPT ARGS` would (capture/script.py's ScriptRun,
the runner of `fusewise diagnose`), from the same seeds every run, so two runs see the same
initial weights and (for a deterministic script) the same batches. Patched runs patch at the end
of the first step: the models are the roots of the modules that own the optimizers' parameters
(found then, since the script built them), their norms and loss are swapped (fusewise.patch) and
each torch AdamW becomes fusewise's (patch_optimizer). The first step is therefore unpatched in
every run. The losses are the values given to .backward() (torch.autograd.backward), in order.
"""

from __future__ import annotations

import contextlib
import gc
import random
import time

import numpy as np
import torch

from ..capture.script import ScriptRun
from ..patch import PatchReport, patch, patch_optimizer
from .measure import Samples

SEED = 0


class TimedSchedule:
    """The part of a diagnosis' schedule that verify needs: `warmup` steps untouched, then
    `steps` timed, each from the end of the one before (after a device sync); the allocator's
    peak over the timed steps (GPU)."""

    def __init__(self, steps: int, warmup: int):
        self.steps, self.warmup = steps, warmup
        self.ends, self.times_ms, self.peak = 0, [], None
        self.cuda = torch.cuda.is_available()
        self._t = None

    @property
    def needed(self) -> int:
        return self.warmup + self.steps

    @property
    def complete(self) -> bool:
        return self.ends >= self.needed

    def phase(self, step: int) -> str:
        return "a warm-up step" if step <= self.warmup else "a timed step"

    def start(self) -> None:
        self._t = time.perf_counter()

    def step_ended(self, *, inside_optimizer_step: bool = False) -> bool:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.ends += 1
        if self.ends > self.warmup:
            self.times_ms.append((now - self._t) * 1e3)
        elif self.ends == self.warmup and self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self._t = now
        if self.complete and self.cuda:
            self.peak = torch.cuda.max_memory_allocated()
        return self.complete

    def close(self) -> None:
        pass


def model_roots(optimizers: list) -> list[torch.nn.Module]:
    """The outermost modules owning the optimizers' parameters (a wrapper such as
    torch.compile's OptimizedModule or DDP counts as the root; patch walks into it). Without an
    optimizer (inference, fusewise.step()), every outermost module holding parameters."""
    params = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    # type(o), not isinstance: isinstance reads __class__, which some lazy module objects
    # (torch.distributed.reduce_op) answer with a deprecation warning
    modules = [o for o in gc.get_objects() if issubclass(type(o), torch.nn.Module)]
    owners = [
        m
        for m in modules
        if any((id(p) in params) if params else True for p in m.parameters(recurse=True))
    ]
    inner = {id(c) for m in owners for c in m.modules() if c is not m}
    return [m for m in owners if id(m) not in inner]


class Patcher:
    """on_step_end for ScriptRun: at the end of step 1, patch what `what` names (a subset of
    norms, activations, rotary, loss, optimizer). `report` collects what was changed."""

    def __init__(self, what: frozenset[str]):
        self.what, self.report, self.roots = what, PatchReport(), []

    def __call__(self, n: int, optimizers: list) -> None:
        if n != 1 or not self.what:
            return
        self.roots = model_roots(optimizers)
        modules = {"norms", "activations", "rotary", "loss"} & self.what
        if modules:
            for root in self.roots:
                r = patch(
                    root,
                    norms="norms" in modules,
                    activations="activations" in modules,
                    rotary="rotary" in modules,
                    loss="loss" in modules,
                )
                self.report.changes += r.changes
        if "optimizer" in self.what:
            for opt in optimizers:
                self.report.changes.append(patch_optimizer(opt))


@contextlib.contextmanager
def recorded_losses(into: list):
    """Append the value of every one-element tensor given to torch.autograd.backward (which
    Tensor.backward calls) to `into`, as a detached copy (read after the run: no sync here)."""
    original = torch.autograd.backward

    def backward(tensors, *args, **kwargs):
        if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
            into.append(tensors.detach().clone())
        return original(tensors, *args, **kwargs)

    torch.autograd.backward = backward
    try:
        yield
    finally:
        torch.autograd.backward = original


@contextlib.contextmanager
def counted_tokens(run: ScriptRun, patcher: Patcher, into: list):
    """Tokens per step where known: the integer tensor a root model's forward is given first
    (input_ids), counted at the root's calls, once the roots are known (after step 1)."""
    handles = []

    def hook(module, args, kwargs):
        ids = next(
            (
                a
                for a in (*args, *kwargs.values())
                if isinstance(a, torch.Tensor) and not a.is_floating_point() and a.dim() >= 1
            ),
            None,
        )
        if ids is not None and run.schedule.ends >= run.schedule.warmup:
            into.append(ids.numel())

    def attach(n, optimizers):
        patcher(n, optimizers)
        if n == 1:
            roots = patcher.roots or model_roots(optimizers)
            for root in roots:
                handles.append(root.register_forward_pre_hook(hook, with_kwargs=True))

    try:
        yield attach
    finally:
        for h in handles:
            h.remove()


def seed_everything(seed: int = SEED) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # every device's generator


def run_variant(script: str, argv: list[str], what: frozenset[str], *, warmup: int, steps: int):
    """One run of the script (see the module's docstring). Returns (Samples or None, the
    ScriptRun, the PatchReport): Samples is None when the script fell short (run.shortfall)."""
    losses, tokens = [], []
    patcher = Patcher(what)
    run = ScriptRun(steps, warmup, schedule=TimedSchedule)
    with counted_tokens(run, patcher, tokens) as on_step_end:
        run._on_step_end = on_step_end
        seed_everything()
        with recorded_losses(losses):
            run.run(script, argv)
    result = None
    if run.complete:
        sched = run.schedule
        result = Samples("", peak_bytes=sched.peak)
        result.add_round(sched.times_ms)
        result.losses = [[float(v) for v in losses]]
        if tokens:
            result.tokens_per_step = round(sum(tokens) / steps)
    del run.optimizers[:]
    patcher.roots = []
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result, run, patcher.report
