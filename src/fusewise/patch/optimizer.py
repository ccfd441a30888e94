"""torch.optim.AdamW -> fusewise.optim.AdamW in place: patch_optimizer(opt), unpatch_optimizer(opt).

The optimizer's class is switched (_swap.swap_class, the original kept on the instance): the same
object, so LR schedulers, torch.amp.GradScaler, checkpoints code and every other reference keep
working; the same param_groups (lr, a tensor lr too, betas, eps, weight_decay, amsgrad, maximize)
and the same state (step, exp_avg, exp_avg_sq, max_exp_avg_sq: torch's keys, which fusewise keeps),
made contiguous and the step count moved to the parameter's device as fusewise's kernel reads them.

* LR schedulers wrap `optimizer.step` on the instance (torch's patch_track_step_called), binding
  the class's step function of that moment: after the swap that wrapper would still run torch's
  step on fusewise's object. It is replaced by one that counts the call as torch's does and runs
  the step of the class the object has when called (the original comes back on unpatch).
* The step is torch's hooked step (Optimizer.profile_hook_step): the instance's step hooks and
  torch's global optimizer hooks (register_optimizer_step_post_hook, which the diagnosis uses)
  fire once per step, as before.
* torch.optim.Adam computes AdamW's update where weight_decay is 0 (or decoupled_weight_decay is
  set): swapped then; with L2 weight decay through the gradient, left alone.
* Left alone, with the reason, whenever the swap would not compute exactly what torch would:
  another optimizer, differentiable=True, a subclass (or an instance) with a step of its own,
  sparse gradients, complex or float64 parameters, non-contiguous parameters, a parameter listed
  twice, betas on a GPU, state of the wrong shape.

The optimizer is not an nn.Module, but _swap's helpers only use the instance's __dict__.
"""

from __future__ import annotations

import weakref

import torch

from .. import optim as foptim
from . import _swap
from .report import LEFT_ALONE, Change

NAME = "optimizer"
FUSED = foptim.AdamW
NOW = _swap.qualname(FUSED)
SAVED_GROUPS = "_fusewise_saved_groups"  # per group (and defaults): the keys the swap changed
# Methods of torch's Adam/AdamW that decide what a step computes: a subclass overriding one of
# them is left alone (swapping would drop that code).
COMPUTE = ("step", "_init_group")
_KEYS = ("decoupled_weight_decay", "master_weights")  # group keys the swap sets
_MISSING = object()
_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def patch_optimizer(optimizer: torch.optim.Optimizer) -> Change:
    """Make a torch.optim.AdamW (or Adam without L2 decay) fusewise.optim.AdamW, in place, with
    its hyper-parameters and state. Returns the Change (swapped, or left alone and why)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    cls = type(optimizer)
    was = _swap.qualname(_swap.original_class(optimizer))
    if isinstance(optimizer, FUSED):
        why = "already patched" if _swap.is_patched(optimizer) else "already fusewise's"
        return Change(NAME, was, None, f"{why}: stepped by {NOW}", LEFT_ALONE, what=NAME)
    reason = why_not(optimizer)
    if reason is not None:
        return Change(NAME, was, None, reason, LEFT_ALONE, what=NAME)

    saved = [{k: g.get(k, _MISSING) for k in _KEYS} for g in optimizer.param_groups]
    saved.append({k: optimizer.defaults.get(k, _MISSING) for k in _KEYS})
    optimizer.__dict__[SAVED_GROUPS] = saved
    for g in (*optimizer.param_groups, optimizer.defaults):
        g["decoupled_weight_decay"] = True  # Adam's groups: weight_decay is 0 or decoupled
        g.setdefault("master_weights", False)  # torch keeps none: the same numerics
    _swap.set_attr(optimizer, "_buckets", {})  # what fusewise.optim.AdamW.__init__ sets
    _swap.set_attr(optimizer, "_synced", {})
    base = torch.optim.AdamW if isinstance(optimizer, torch.optim.AdamW) else torch.optim.Adam
    target = FUSED if cls in (torch.optim.AdamW, torch.optim.Adam) else _swap.subclass(FUSED, cls)
    _hook_class_step(FUSED)
    _swap.swap_class(optimizer, target)
    optimizer._patch_step_function()  # global/instance step hooks around the fused step
    if _lr_sched_wrapper(optimizer) is not None:
        _swap.set_attr(optimizer, "step", _tracking_step(optimizer))
    group_of = {p: g for g in optimizer.param_groups for p in g["params"]}
    for p in list(optimizer.state):
        if p in group_of and optimizer.state[p]:
            optimizer._state_of(p, group_of[p])  # contiguous, step on p's device, checked

    if cls is torch.optim.AdamW:
        return Change(NAME, was, NOW, what=NAME)
    if cls is torch.optim.Adam:
        return Change(NAME, was, NOW, _ADAM, what=NAME)
    note = f"defines no step of its own: still a {was} (derived from {_swap.qualname(base)}), "
    return Change(NAME, was, NOW, note + f"stepped by {NOW}", what=NAME)


def unpatch_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    """Undo patch_optimizer: torch's class, group keys and state conventions (the step count on
    the CPU unless the group is fused or capturable) come back; the moments are kept as they are
    now. True if there was anything to undo."""
    if _swap.ORIGINAL_CLASS not in optimizer.__dict__:
        return False
    saved = optimizer.__dict__.pop(SAVED_GROUPS, None) or []
    _swap.restore(optimizer)
    groups, n = optimizer.param_groups, len(saved) - 1
    for g, keys in zip((*groups[:n], optimizer.defaults), saved):
        for k, v in keys.items():
            if v is _MISSING:
                g.pop(k, None)
            else:
                g[k] = v
    for g in groups[n:]:  # added while patched: keeps AdamW's decay, as it was computed
        g.pop("master_weights", None)
    for g in groups:  # torch's conventions for the step count (Adam.__setstate__'s)
        on_device = g.get("fused") or g.get("capturable")
        dtype = torch.float32 if g.get("fused") else _torch_scalar_dtype()
        for p in g["params"]:
            st = optimizer.state.get(p)
            if not st:
                continue
            st.pop("master_param", None)
            if torch.is_tensor(st.get("step")):
                device = p.device if on_device else torch.device("cpu")
                st["step"] = st["step"].to(device=device, dtype=dtype)
    wrapper = _lr_sched_wrapper(optimizer)
    if wrapper is not None and not getattr(wrapper, "_fusewise_tracking", False):
        # a scheduler created while patched bound fusewise's step: count, run the class's step
        if _unhooked(getattr(wrapper, "__wrapped__", None)) is _unhooked(FUSED.step):
            optimizer.__dict__["step"] = _tracking_step(optimizer)
    optimizer._patch_step_function()
    return True


_ADAM = "torch.optim.Adam without L2 weight decay (0, or decoupled): AdamW's update"


def why_not(optimizer: torch.optim.Optimizer) -> str | None:
    """Why this optimizer cannot become fusewise.optim.AdamW exactly, or None if it can."""
    cls = type(optimizer)
    if not isinstance(optimizer, torch.optim.Adam):
        return (
            f"not an AdamW: fusewise fuses torch.optim.AdamW's step (and Adam's without L2 "
            f"weight decay) only, not {_swap.qualname(cls)}'s"
        )
    is_adamw = isinstance(optimizer, torch.optim.AdamW)
    base = torch.optim.AdamW if is_adamw else torch.optim.Adam
    for m in COMPUTE:
        if _unhooked(getattr(cls, m, None)) is not _unhooked(getattr(base, m, None)):
            owner = next((c for c in cls.__mro__ if m in vars(c)), cls)
            return f"its own {m} ({_swap.qualname(owner)}.{m}): swapping would drop that code"
    if "step" in optimizer.__dict__ and _lr_sched_wrapper(optimizer) is None:
        return (
            f"its step is replaced on the instance ({optimizer.__dict__['step']!r}): the class "
            "swap would not change what runs"
        )
    for i, g in enumerate(optimizer.param_groups):
        where = f"parameter group {i}"
        if g.get("differentiable"):
            return f"differentiable=True ({where}): the fused step is not recorded by autograd"
        if not is_adamw and not g.get("decoupled_weight_decay") and g["weight_decay"] != 0:
            return (
                f"torch.optim.Adam with weight_decay={g['weight_decay']} ({where}) adds L2 decay "
                "to the gradient; fusewise decays decoupled (AdamW)"
            )
        lr = g["lr"]
        if torch.is_tensor(lr) and lr.numel() != 1:
            return f"lr is a tensor of {lr.numel()} elements ({where})"
        if any(torch.is_tensor(b) and b.device.type != "cpu" for b in g["betas"]):
            return f"betas are tensors on a GPU ({where}): fusewise reads them on the host"
        params = g["params"]
        if len(set(params)) != len(params):
            return f"a parameter appears twice in {where}: the kernel would update it twice"
        for p in params:
            reason = _param_reason(p, optimizer.state.get(p))
            if reason is not None:
                return f"{reason} ({where}, shape {tuple(p.shape)})"
    return None


def _param_reason(p: torch.Tensor, state: dict | None) -> str | None:
    try:
        foptim._check_param(p)  # complex, sparse gradient, non-contiguous, gradient's shape
    except (TypeError, RuntimeError, ValueError) as e:
        return str(e)
    if not p.is_contiguous():
        return "a non-contiguous parameter: fusewise's kernel needs contiguous parameters"
    if p.dtype not in _KERNEL_DTYPES:
        return f"a {p.dtype} parameter: fusewise's kernel takes float32, bfloat16, float16"
    for key, value in (state or {}).items():
        if key == "step" and torch.is_tensor(value) and value.numel() != 1:
            return f"its state's step has {value.numel()} elements"
        if key in foptim._STATE_KEYS and value.shape != p.shape:
            return f"its state's {key} has shape {tuple(value.shape)}, not the parameter's"
    return None


def _torch_scalar_dtype() -> torch.dtype:
    """torch.optim.optimizer._get_scalar_dtype() of a non-fused group."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _lr_sched_wrapper(optimizer):
    """The instance's step wrapper from torch's LRScheduler (patch_track_step_called), or None."""
    step = optimizer.__dict__.get("step")
    return step if getattr(step, "_wrapped_by_lr_sched", False) else None


def _tracking_step(optimizer):
    """As torch's LRScheduler wrapper (marks the optimizer stepped, for the scheduler's warning),
    but running the step of the class the optimizer has when called, not when wrapped."""
    ref = weakref.ref(optimizer)

    def step(*args, **kwargs):
        opt = ref()
        opt._opt_called = True
        return type(opt).step(opt, *args, **kwargs)

    step._wrapped_by_lr_sched = True
    step._fusewise_tracking = True
    return step


def _unhooked(fn):
    """A step function without torch's profile_hook_step wrappers (functools.wraps keeps the
    wrapped function as __wrapped__), so a class hooked on its own compares equal to its base."""
    while getattr(fn, "hooked", False) and hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def _hook_class_step(cls: type) -> None:
    """What torch's Optimizer.__init__ does for the class of its first instance: wrap its step
    so the step hooks (the instance's and torch's global ones) run around it."""
    if not getattr(cls.step, "hooked", False):
        cls.step = torch.optim.Optimizer.profile_hook_step(cls.step)
        cls.step.hooked = True
