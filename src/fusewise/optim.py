"""fusewise.optim.AdamW: a drop-in for torch.optim.AdamW whose step is one fused pass per
parameter (ops/adamw/), optionally keeping fp32 master weights for bf16/fp16 models.

State per parameter uses torch's keys and meanings (step, exp_avg, exp_avg_sq, max_exp_avg_sq),
plus master_param with master_weights=True, so checkpoints move between the two optimizers.
A parameter changed outside the optimizer (p.copy_(), p.fill_(), model.load_state_dict(),
p.data = x) is seen at the next step by its version counter or address, and its master resynced
from it (kept where it still rounds to the parameter's value). Writes through p.data
(p.data.copy_(x)) bump a version counter of p.data's own and are not seen: call
opt.sync_master_weights() after them, or the next step undoes them from the stale master.
step() never synchronises with the host (steps and bias corrections live on the device; lr may be
a tensor), so it can be captured in a CUDA graph. Every torch.optim.AdamW argument is taken (see
AdamW.__init__); a parameter listed twice, or parameters overlapping in memory, raise. Under
torch.amp.GradScaler the gradients are unscaled inside the kernel and a step with an inf/nan
gradient is skipped on the device.
"""

from __future__ import annotations

import itertools
import warnings

import torch

from .ops import _dispatch
from .ops.adamw import step_group

_STATE_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


class AdamW(torch.optim.Optimizer):
    _step_supports_amp_scaling = True  # GradScaler hands us grad_scale / found_inf tensors

    def __init__(
        self,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=1e-2,
        amsgrad=False,
        *,
        maximize=False,
        foreach=None,
        capturable=False,
        differentiable=False,
        fused=None,
        master_weights=False,
    ):
        """torch.optim.AdamW's arguments with torch's meanings, plus master_weights. foreach,
        capturable and fused choose torch's implementation: accepted, with a warning (once per
        process) that they have no effect, fusewise's step being always fused and capturable.
        differentiable=True raises. betas may be floats or CPU tensors (read on the host)."""
        torch_options = dict(foreach=foreach, capturable=capturable, fused=fused)
        _check_torch_options({**torch_options, "differentiable": differentiable}, "argument")
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("lr as a tensor must have one element")
        if not 0.0 <= float(lr):
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        for i, b in enumerate(betas):
            if not 0.0 <= _host_float(b) < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {b}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        # torch.optim.AdamW's group keys too (its defaults for the implementation choices), so a
        # state_dict loads into either optimizer
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            foreach=None,
            capturable=False,
            differentiable=False,
            fused=None,
            decoupled_weight_decay=True,
            master_weights=master_weights,
        )
        super().__init__(params, defaults)
        self._buckets: dict = {}
        self._synced: dict = {}  # param -> (p._version, p.data_ptr()) when its master was in sync

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("master_weights", False)
            group["decoupled_weight_decay"] = True
        self._buckets, self._synced = {}, {}

    def add_param_group(self, param_group):
        _check_torch_options(param_group, "parameter group")
        params = param_group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif not isinstance(params, set):  # torch itself refuses sets (unordered)
            params = list(params)
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]  # (name, p): torch's too
        for p in tensors:
            _check_param(p)
        if len(set(tensors)) != len(tensors):
            raise ValueError(
                "fusewise.optim.AdamW: a parameter appears more than once in a parameter group "
                "(torch warns that this will become an error); two rows of the kernel's table "
                "would update it concurrently"
            )
        super().add_param_group({**param_group, "params": params})
        self._buckets = {}

    # --- state ----------------------------------------------------------------------------------

    def _state_of(self, p: torch.Tensor, group: dict) -> dict:
        """The parameter's state, created (or repaired after a load) on p's device: moments in
        fp32 when master weights are kept, else in p's dtype, as torch keeps them. Every tensor
        whose pointer goes into the kernel's table is contiguous with p's shape (a wrong shape
        raises rather than letting the kernel read out of bounds)."""
        st = self.state[p]
        master = group["master_weights"] and p.dtype != torch.float32
        sdtype = torch.float32 if master else p.dtype
        shape, device = p.shape, p.device
        step = st.get("step")
        if step is None:
            st["step"] = torch.zeros((), dtype=torch.float32, device=device)
        elif not _fits(step, (), torch.float32, device):
            st["step"] = _fitted(step, (), torch.float32, device, "step")
        for key in _STATE_KEYS:
            if key == "max_exp_avg_sq" and not group["amsgrad"]:
                continue
            t = st.get(key)
            if t is None:
                st[key] = torch.zeros_like(p, dtype=sdtype, memory_format=torch.contiguous_format)
            elif not _fits(t, shape, sdtype, device):
                st[key] = _fitted(t, shape, sdtype, device, key)
        t = st.get("master_param")
        if master and t is None:
            st["master_param"] = p.detach().float().contiguous()  # from a torch checkpoint: upcast
        elif t is not None and not _fits(t, shape, torch.float32, device):
            st["master_param"] = _fitted(t, shape, torch.float32, device, "master_param")
        return st

    def load_state_dict(self, state_dict):
        """As torch's, but a group key the saved group lacks keeps this optimizer's value (torch
        replaces each group by the saved one: a torch checkpoint would turn master_weights off),
        and state tensors are copies (torch hands the step tensor over as is), contiguous,
        checked against the parameter's shape, and keep the dtype they were saved in (torch
        casts them to the parameter's dtype, which would round fp32 moments and masters of a
        bf16 model)."""
        saved_groups = state_dict["param_groups"]
        if any(g.get("differentiable") for g in saved_groups):
            raise ValueError(_DIFFERENTIABLE.format("in the loaded state_dict's parameter group"))
        if len(saved_groups) == len(self.param_groups):  # else torch's load raises
            saved_groups = [{**g, **saved} for g, saved in zip(self.param_groups, saved_groups)]
            state_dict = {**state_dict, "param_groups": saved_groups}
        id_to_param = dict(
            zip(
                itertools.chain.from_iterable(g["params"] for g in saved_groups),
                itertools.chain.from_iterable(g["params"] for g in self.param_groups),
            )
        )
        super().load_state_dict(state_dict)
        for pid, saved in state_dict["state"].items():
            p = id_to_param.get(pid)
            if p is None:
                continue
            st = self.state[p]
            for key, value in saved.items():
                where = f"loaded state of parameter {pid}: {key}"
                if key == "step":  # a number in checkpoints of torch < 1.12
                    value = torch.as_tensor(value, dtype=torch.float32)
                    st[key] = _fitted(value, (), torch.float32, p.device, where, copy=True)
                elif key in (*_STATE_KEYS, "master_param"):
                    st[key] = _fitted(value, p.shape, value.dtype, p.device, where, copy=True)
                elif torch.is_tensor(value):
                    st[key] = value.to(p.device, copy=True)
        self._buckets = {}
        self._mark_synced(self.state.keys())  # a loaded master is taken as the parameter's value

    # --- master weights ---------------------------------------------------------------------

    @torch.no_grad()
    def sync_master_weights(self) -> None:
        """Take each parameter's value as it is now into its fp32 master. Writes through
        `p.data` (e.g. `p.data.copy_(x)`) need it: `p.data` has a version counter of its own, so
        step() cannot see them and would undo them from the stale master. Every other change
        (p.copy_(), p.fill_(), model.load_state_dict(), p.data = x, torch.nn.init) is seen."""
        for p, st in self.state.items():
            if isinstance(p, torch.Tensor) and "master_param" in st:
                _resync(p, st["master_param"])
        self._mark_synced(self.state.keys())

    def _mark_synced(self, params) -> None:
        for p in params:
            if isinstance(p, torch.Tensor) and "master_param" in self.state.get(p, {}):
                self._synced[p] = (p._version, p.data_ptr())

    def _resync_changed(self, masters) -> None:
        """Parameters changed outside the optimizer since their master was last in sync: any
        in-place write bumps p._version (the kernel, writing through raw pointers, does not) and
        p.data = x changes p.data_ptr(). Host metadata only: no sync, no traffic unless changed.
        (A parameter without a record has a master just made from it, or set by the user.)"""
        for p, master in masters:
            seen = self._synced.get(p)
            if seen is not None and seen != (p._version, p.data_ptr()):
                _resync(p, master)

    # --- step -----------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = getattr(self, "grad_scale", None)  # set by torch.amp.GradScaler.step
        found_inf = getattr(self, "found_inf", None)
        for gi, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                _check_param(p)
            states = [self._state_of(p, group) for p in params]
            masters = [
                (p, st["master_param"]) for p, st in zip(params, states) if "master_param" in st
            ]
            self._resync_changed(masters)
            steps = [st["step"] for st in states]
            torch._foreach_add_(steps, 1.0)
            if found_inf is not None:  # a skipped step does not count, as in torch
                torch._foreach_sub_(steps, [found_inf.to(s.device) for s in steps])
            step_group(
                params,
                states,
                lambda p, group=group: self._hyper(group, p),
                amsgrad=group["amsgrad"],
                grad_scale=grad_scale,
                found_inf=found_inf,
                buckets=self._buckets,
                key=gi,
            )
            for p, _ in masters:
                self._synced[p] = (p._version, p.data_ptr())
        return loss

    def _hyper(self, group, p):
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):  # a CPU lr copied without a sync, as torch's fused
            lr = lr.to(p.device, non_blocking=True)
        return dict(
            lr=lr,
            beta1=_host_float(beta1),
            beta2=_host_float(beta2),
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            maximize=group["maximize"],
        )


_NO_EFFECT = {"foreach": None, "capturable": False, "fused": None}  # torch's defaults
_warned_no_effect: set[str] = set()
_DIFFERENTIABLE = (
    "fusewise.optim.AdamW: differentiable=True ({}) is not supported: the fused step is not "
    "recorded by autograd; use torch.optim.AdamW(differentiable=True)"
)


def _check_torch_options(options: dict, where: str) -> None:
    """torch's implementation choices: warn (once per process and name) that they have no
    effect; refuse what fusewise would otherwise silently not do."""
    if options.get("differentiable"):
        raise ValueError(_DIFFERENTIABLE.format(where))
    if options.get("decoupled_weight_decay", True) is False:
        raise ValueError(
            f"fusewise.optim.AdamW: decoupled_weight_decay=False ({where}) asks for Adam's "
            "weight decay through the gradient; fusewise decays decoupled only (AdamW). Use "
            "torch.optim.Adam(weight_decay=...) for those parameters."
        )
    for name, default in _NO_EFFECT.items():
        value = options.get(name, default)
        if value != default and name not in _warned_no_effect:
            _warned_no_effect.add(name)
            warnings.warn(
                f"fusewise.optim.AdamW: {name}={value!r} ({where}) has no effect: the step is "
                "always fused (one Triton launch per dtype bucket) and capturable.",
                stacklevel=_dispatch.caller_stacklevel(),
            )


def _host_float(x) -> float:
    """A hyperparameter read on the host each step: a device tensor would sync every step."""
    if isinstance(x, torch.Tensor) and x.device.type != "cpu":
        raise ValueError(
            f"fusewise.optim.AdamW: betas as tensors must be on the CPU (got one on {x.device}): "
            "1 - beta and log(beta) are computed on the host in double each step, and reading "
            "a device tensor there would sync"
        )
    return float(x)


def _resync(p: torch.Tensor, master: torch.Tensor) -> None:
    """The master keeps its extra precision where it still rounds to the parameter's value (the
    model reloaded from the checkpoint the optimizer came from: nothing lost), else becomes the
    parameter upcast. Device work only; refused inside a CUDA graph capture, which would record
    it for every replay instead of running it once."""
    if p.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "fusewise.optim.AdamW: a parameter changed outside the optimizer before this CUDA "
            "graph capture; call opt.sync_master_weights() (or step once) before capturing"
        )
    p = p.detach()
    master.copy_(torch.where(master.to(p.dtype) == p, master, p.float()))


def _fits(t: torch.Tensor, shape, dtype, device) -> bool:
    return t.dtype == dtype and t.shape == shape and t.is_contiguous() and t.device == device


def _fitted(t: torch.Tensor, shape, dtype, device, what: str, copy: bool = False) -> torch.Tensor:
    """t as the kernel's table needs it: `shape` (else ValueError), dtype, device, contiguous
    (its memory then holds the elements in the parameter's logical order). t itself when it
    already is and no `copy` is asked for, else a converted copy."""
    if shape == () and t.numel() == 1:
        t = t.reshape(())  # a step count saved as [1]
    if t.shape != shape:
        raise ValueError(
            f"fusewise.optim.AdamW: {what} has shape {tuple(t.shape)}, expected {tuple(shape)} "
            "(the parameter's; a step count is a scalar): is the state for another model?"
        )
    if not copy and _fits(t, shape, dtype, device):
        return t
    # not t.to(memory_format=torch.contiguous_format): that returns a strided view unchanged
    return torch.empty(shape, dtype=dtype, device=device).copy_(t)


def _check_param(p: torch.Tensor) -> None:
    if p.is_complex():
        raise TypeError(
            "fusewise.optim.AdamW does not support complex parameters; "
            "view them as real (torch.view_as_real) first"
        )
    if p.grad is not None and p.grad.is_sparse:
        raise RuntimeError(
            "fusewise.optim.AdamW does not support sparse gradients; "
            "use torch.optim.SparseAdam for those parameters"
        )
    if p.grad is not None and (not p.is_contiguous() or not p.grad.is_contiguous()):
        raise ValueError(
            "fusewise.optim.AdamW needs contiguous parameters and gradients "
            f"(got a parameter of shape {tuple(p.shape)} with strides {p.stride()}"
            f" and a gradient with strides {p.grad.stride()}); make it contiguous "
            "(param.data = param.data.contiguous()) or give it to torch.optim.AdamW"
        )
    if p.grad is not None and p.grad.shape != p.shape:
        raise ValueError(
            f"fusewise.optim.AdamW: the gradient's shape {tuple(p.grad.shape)} is not the "
            f"parameter's {tuple(p.shape)} (was param.data replaced?)"
        )
