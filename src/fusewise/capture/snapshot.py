"""What the diagnosis' extra steps change, saved before them and put back after: with
`restore=[model, optimizer, ...]` the state_dict of each, the gradients of their parameters and
the random state (torch's CPU and CUDA generators, Python's random, NumPy's), so a diagnosis can
sit inside a real run without changing it: the next step is the one an undiagnosed run would
take (batches the step took from an iterator stay taken)."""

from __future__ import annotations

import copy
import random

import torch


def restorable(restore) -> list:
    """restore= as a list of objects with state_dict() and load_state_dict() (one such object
    alone is taken as a list of one)."""
    if restore is None:
        return []
    if isinstance(restore, dict):
        raise TypeError(
            "restore= takes a list of objects, not a dict: pass list(your_dict.values())"
        )
    objs = [restore] if hasattr(restore, "state_dict") else restore
    try:
        objs = list(objs)
    except TypeError:
        objs = [objs]
    for obj in objs:
        if not (
            callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))
        ):
            raise TypeError(
                f"restore= takes the objects whose state the diagnosis must put back "
                f"(model, optimizer, LR scheduler, GradScaler: anything with "
                f"state_dict() and load_state_dict()), as a list; got "
                f"{type(obj).__name__}"
            )
    return objs


class Snapshot:
    """What the diagnosis' extra steps change, saved before them: the state_dicts, the gradients
    of the parameters they hold (a run that accumulates gradients, or zeroes them in place,
    reads them), and the random state (a step with dropout, or a cold ceilings measurement)."""

    def __init__(self, objs: list):
        self.states = [(obj, copy.deepcopy(obj.state_dict())) for obj in objs]
        params: dict[int, torch.Tensor] = {}
        for obj in objs:
            if isinstance(obj, torch.nn.Module):
                found = obj.parameters()
            else:
                found = (p for g in getattr(obj, "param_groups", ()) for p in g["params"])
            params.update((id(p), p) for p in found)
        # (the gradient tensor itself too: references to it, e.g. DDP's bucket views, stay good)
        self.grads = [
            (p, p.grad, None if p.grad is None else p.grad.detach().clone())
            for p in params.values()
        ]
        self.rng = _rng_state() if objs else None

    def put_back(self) -> None:
        for obj, state in self.states:
            obj.load_state_dict(state)
        for p, grad, values in self.grads:
            if grad is not None:
                grad.detach().copy_(values)
            p.grad = grad
        if self.rng is not None:
            _set_rng_state(self.rng)


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():  # (initialises CUDA, as the diagnosis' syncs would anyway)
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
