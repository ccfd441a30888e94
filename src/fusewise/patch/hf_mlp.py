"""The gated MLPs of Hugging Face transformers models -> fusewise.ops.swiglu / geglu, per instance.

A module whose class is in MLPS computes, token for token in transformers 5.17.0 (the installed
source is compared with FORWARDS in tests/test_patch_hf_mlp.py):

* SEPARATE (Llama, Mistral, Qwen2, Qwen3, OLMo2, Gemma, Gemma2, Gemma3):
  ``self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))``;
* GATE_UP (Phi-3): ``gate, up = self.gate_up_proj(x).chunk(2, dim=-1)`` then
  ``self.down_proj(up * self.activation_fn(gate))`` (the fused op reads the two halves in place).

Its activation module decides the op (ACTIVATIONS, by exact class): SiLU -> swiglu; GELU exact ->
geglu(approximate="none"); the tanh GELUs -> geglu(approximate="tanh"). Anything else (ReLU, a
subclass, a forward set on the instance) leaves the MLP alone, with the reason. An activation
replaced after patching is decided again on the next call; one without a fused kernel runs the
MLP's own forward, with a warning. The swapped class
derives from FusedGatedMLP (or FusedGateUpMLP) and the MLP's own class, so the object, its
Parameters and state_dict keys stay; the activation is kept on the instance (_swap.set_attr), so
unpatch removes it. Mixtral's experts are not this shape and are not looked at.

What autograd keeps. Where down_proj is exactly torch.nn.Linear (decided at patch time and said
in the report's reason) and, on each call, no hook runs around it (its own forward/backward
hooks or torch's global module hooks), its weight and bias have the product's dtype, autocast
would not change that dtype, and neither torch.compile nor a dispatch mode is tracing
(_dispatch.through_custom_op), the patched forward runs the gated product and down_proj as one
autograd node (ops/gated/down.py): autograd keeps gate and up of each MLP and nothing else of
[tokens, intermediate], the product being recomputed in the backward; HF's MLP keeps gate,
act(gate), up and the product. When, besides, every module producing gate and up (gate_proj and
up_proj, or gate_up_proj) is such a hook-free nn.Linear, whose output nothing else holds, the
backward writes dgate and dup over gate and up (their version counters bumped: a second backward
through a retained graph raises autograd's in-place error). Otherwise (a LoRA, quantized,
parametrized or FSDP subclass, a hook, another dtype, compiling) the forward is swiglu / geglu
followed by down_proj's own call, which keeps the product: gate, up and the product per MLP.

Every swap is checked on a probe input [2, 3, hidden] in the weights' dtype against the original
forward, within a relative tolerance of 1e-5 (fp32; 4 ulps for bf16/fp16, where HF rounds
act(gate) before the product and the fused op does not) of |original| + max |original|; on a
mismatch the class is restored and the module reported as left alone. A module on the meta device
is left alone until its weights are loaded.
"""

from __future__ import annotations

import warnings

import torch

from .. import ops
from ..ops import _dispatch
from ..ops.gated.down import gated_down
from . import _probe, _swap
from .report import Change

ACT_ATTR = "_fusewise_gated_act"  # the kernel's act, decided at patch time
ACT_MODULE_ATTR = "_fusewise_gated_act_module"  # the activation module it was decided for
SEPARATE = "separate"  # gate_proj, up_proj, down_proj, act_fn
GATE_UP = "gate_up"  # gate_up_proj (chunked), down_proj, activation_fn

FORWARDS = {
    SEPARATE: "down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))\n"
    "return down_proj",
    GATE_UP: "up_states = self.gate_up_proj(hidden_states)\n"
    "gate, up_states = up_states.chunk(2, dim=-1)\n"
    "up_states = up_states * self.activation_fn(gate)\n"
    "return self.down_proj(up_states)",
}
_ACT_ATTR_OF = {SEPARATE: "act_fn", GATE_UP: "activation_fn"}

_FAMILIES = {
    "llama": ("LlamaMLP", SEPARATE),
    "mistral": ("MistralMLP", SEPARATE),
    "qwen2": ("Qwen2MLP", SEPARATE),
    "qwen3": ("Qwen3MLP", SEPARATE),
    "olmo2": ("Olmo2MLP", SEPARATE),
    "gemma": ("GemmaMLP", SEPARATE),
    "gemma2": ("Gemma2MLP", SEPARATE),
    "gemma3": ("Gemma3MLP", SEPARATE),
    "phi3": ("Phi3MLP", GATE_UP),
}
# (module, class name) -> layout
MLPS: dict[tuple[str, str], str] = {
    (f"transformers.models.{family}.modeling_{family}", name): layout
    for family, (name, layout) in _FAMILIES.items()
}

# activation class (module, name) -> the kernel's act; nn.GELU reads its `approximate`
_TF = "transformers.activations"
ACTIVATIONS: dict[tuple[str, str], str] = {
    (_TF, "SiLUActivation"): "silu",
    ("torch.nn.modules.activation", "SiLU"): "silu",
    (_TF, "GELUActivation"): "gelu",  # F.gelu, or its erf formula (use_gelu_python)
    (_TF, "GELUTanh"): "gelu_tanh",  # F.gelu(approximate="tanh"), or its formula
    (_TF, "NewGELUActivation"): "gelu_tanh",
    (_TF, "FastGELUActivation"): "gelu_tanh",
}
_NOW = {
    "silu": "fusewise.ops.swiglu",
    "gelu": "fusewise.ops.geglu",
    "gelu_tanh": "fusewise.ops.geglu",
}
_CALL = {
    "silu": "swiglu(gate, up)",
    "gelu": 'geglu(gate, up, approximate="none")',
    "gelu_tanh": 'geglu(gate, up, approximate="tanh")',
}


def _gated(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    if act == "silu":
        return ops.swiglu(gate, up)
    return ops.geglu(gate, up, approximate="tanh" if act == "gelu_tanh" else "none")


_HOOK_ATTRS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
# torch's hooks on every module (register_module_forward_hook, ...), looked up on each call
_GLOBAL_HOOKS = tuple(f"_global{a}" for a in (*_HOOK_ATTRS, "_forward_hooks_always_called"))


def plain_linear(module) -> bool:
    """module is exactly torch.nn.Linear (not a LoRA, quantized, parametrized or FSDP subclass,
    whose forward is more than F.linear) and no hook of its own runs around it."""
    return type(module) is torch.nn.Linear and not any(
        getattr(module, attr, None) for attr in _HOOK_ATTRS
    )


def _no_global_hooks() -> bool:
    return not any(getattr(torch.nn.modules.module, name, None) for name in _GLOBAL_HOOKS)


def _down(mlp, gate: torch.Tensor, up: torch.Tensor, act: str, producers) -> torch.Tensor:
    """down_proj(act(gate) * up): as one node that recomputes the product (ops/gated/down.py)
    when down_proj is a plain nn.Linear in the product's dtype, eager and hook-free, else the
    gated op then down_proj. gate and up are written over by their own gradients only when
    every module producing them is a plain nn.Linear too (a hook could have kept them)."""
    down = mlp.down_proj
    fused = (
        gate.numel() > 0
        and not _dispatch.through_custom_op()
        and plain_linear(down)
        and _no_global_hooks()
        and down.weight.dtype == gate.dtype
        and (down.bias is None or down.bias.dtype == gate.dtype)
        and not _autocast_to_another_dtype(gate)
    )
    if not fused:
        return down(_gated(gate, up, act))
    overwrite = all(plain_linear(p) for p in producers)
    return gated_down(gate, up, act, down.weight, down.bias, overwrite_inputs=overwrite)


def _autocast_to_another_dtype(t: torch.Tensor) -> bool:
    """Autocast would run down_proj in a dtype other than t's (the fused node computes in t's)."""
    kind = t.device.type
    return torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) != t.dtype


def _activation(mlp, layout: str) -> str | None:
    """The kernel's act for the MLP's activation as it is now: the one decided at patch time
    while the module is the same object, else decided again (a user who sets mlp.act_fn after
    patching gets that activation); None, said in a warning, when it has no fused kernel."""
    attr = _ACT_ATTR_OF[layout]
    module = _act_module(mlp, attr)
    # .get: a model pickled before this attribute existed has only ACT_ATTR (decided again)
    if module is mlp.__dict__.get(ACT_MODULE_ATTR):
        return mlp.__dict__[ACT_ATTR]
    act, reason = activation_of(module)
    if act is None and not torch.compiler.is_compiling():  # a warning does not trace
        warnings.warn(
            f"fusewise: {type(mlp).__name__}.{attr} was replaced after fusewise.patch and "
            f"{reason.replace('its activation', 'the new one')}: the MLP runs its own forward",
            stacklevel=_dispatch.caller_stacklevel(),
        )
    return act


def _act_module(mlp, attr: str):
    """mlp's activation attribute: from _modules first (nn.Module.__getattr__ costs ~0.8 us, on
    every MLP call)."""
    module = mlp._modules.get(attr)
    return module if module is not None else getattr(mlp, attr, None)


class FusedGatedMLP:
    """down_proj(act(gate_proj(x)) * up_proj(x)) with the product fused (and, see _down, the
    down projection with it); first base of the swapped class (_swap.subclass), so its forward
    wins."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = _activation(self, SEPARATE)
        if act is None:
            return _swap.original_class(self).forward(self, x)
        gate, up = self.gate_proj(x), self.up_proj(x)
        return _down(self, gate, up, act, (self.gate_proj, self.up_proj))


class FusedGateUpMLP:
    """Phi-3's: gate and up are the two halves of gate_up_proj(x), read (and, see _down,
    written) in place."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        act = _activation(self, GATE_UP)
        if act is None:
            return _swap.original_class(self).forward(self, hidden_states)
        gate, up = self.gate_up_proj(hidden_states).chunk(2, dim=-1)
        return _down(self, gate, up, act, (self.gate_up_proj,))


_MIXINS = {SEPARATE: FusedGatedMLP, GATE_UP: FusedGateUpMLP}


def table_class(cls: type) -> tuple[type, str] | tuple[None, None]:
    """The first class in cls's MRO that the table knows, with its layout."""
    for c in cls.__mro__:
        layout = MLPS.get((c.__module__, c.__qualname__))
        if layout is not None:
            return c, layout
    return None, None


def activation_of(act) -> tuple[str | None, str]:
    """(the kernel's act or None, the reason in words) for an MLP's activation module."""
    cls = type(act)
    name = _swap.qualname(cls)
    if not isinstance(act, torch.nn.Module):
        return None, f"its activation is {name}, not a module fusewise can read"
    if "forward" in vars(act):
        return None, f"its activation {name} has a forward set on the instance (kernelize?)"
    if cls is torch.nn.GELU:
        kind = {"none": "gelu", "tanh": "gelu_tanh"}.get(act.approximate)
        if kind is None:
            return None, f"its activation is nn.GELU(approximate={act.approximate!r})"
        return kind, f"activation {name}(approximate={act.approximate!r})"
    kind = ACTIVATIONS.get((cls.__module__, cls.__qualname__))
    if kind is None:
        return None, (
            f"its activation is {name}: only SiLU and GELU (exact or tanh) have a fused gated "
            f"kernel"
        )
    return kind, f"activation {name}"


def patch_module(name: str, module: torch.nn.Module) -> Change | None:
    """The Change for one module: swapped or left alone if its class (or a base) is in MLPS,
    else None."""
    cls = type(module)
    base, layout = table_class(cls)
    if base is None:
        return None
    was = _swap.qualname(cls)

    def alone(reason: str) -> Change:
        return Change(name, was, None, reason, what="activation")

    kept = _probe.code_of_its_own(module, base, ("forward", "__call__"))
    if kept is not None:
        return alone(kept)
    act, act_reason = activation_of(getattr(module, _ACT_ATTR_OF[layout], None))
    if act is None:
        return alone(f"{act_reason}; left as it is")
    weight = _probe_weight(module, layout)
    if isinstance(weight, str):
        return alone(weight)

    _swap.set_attr(module, ACT_ATTR, act)
    _swap.set_attr(module, ACT_MODULE_ATTR, _act_module(module, _ACT_ATTR_OF[layout]))
    # bf16/fp16: 4 ulps (HF rounds act(gate) before the product, the fused op does not), of
    # |original| + max |original|
    mismatch = _probe.swap_checked(
        module, _MIXINS[layout], weight, weight.shape[1], ulps=4, floor=1.0
    )
    if mismatch is not None:
        return alone(f"{mismatch}; left as it is")
    reason = f"{_down_words(module, act)}: {act_reason}"
    if cls is not base:
        reason = f"defines no forward of its own: still a {was}; {reason}"
    return Change(name, was, _NOW[act], reason, what="activation")


def _probe_weight(module: torch.nn.Module, layout: str) -> torch.Tensor | str:
    """The input projection's weight (sizes and places the probe), or why there is none."""
    proj = getattr(module, "gate_proj" if layout == SEPARATE else "gate_up_proj", None)
    weight = getattr(proj, "weight", None)
    return _probe.unprobeable(weight, 2) or weight


def _down_words(module: torch.nn.Module, act: str) -> str:
    """What the patched forward computes, decided by down_proj's class (hooks and dtypes are
    checked on every call: _down)."""
    down = getattr(module, "down_proj", None)
    if type(down) is torch.nn.Linear:
        return f"down_proj({_CALL[act]}) in one node, the product recomputed in the backward"
    return (
        f"down_proj({_CALL[act]}), the product kept by down_proj: it is a "
        f"{_swap.qualname(type(down))}, not exactly torch.nn.Linear"
    )
