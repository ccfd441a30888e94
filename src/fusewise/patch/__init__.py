"""fusewise.patch(model): put fusewise's fused ops in place on one model instance, say what changed,
and undo it with fusewise.unpatch(model).

* norms (torch_norms.py, hf_norms.py): torch's LayerNorm/RMSNorm and the norm classes of the
  Hugging Face families, each swap checked on a probe input before it is kept;
* loss (loss.py): a Hugging Face *ForCausalLM given labels in training computes its loss with
  fusewise.ops.linear_cross_entropy from the last hidden state, the logits never materialised;
* activations (hf_mlp.py): the gated MLPs of the Hugging Face families (Llama's
  down_proj(act(gate_proj(x)) * up_proj(x))) compute act(gate) * up with fusewise.ops.swiglu /
  geglu, so autograd keeps gate and up only; each swap checked on a probe input;
* rotary (hf_rotary.py, hf_rotary_forms.py): the attention modules of the Hugging Face families
  whose forward calls their modeling module's apply_rotary_pos_emb (a form fusewise recognises:
  rotate_half, GPT-J's interleaved pairs, partial rotary...) run that forward with
  fusewise.ops.apply_rotary in its place; each swap checked on a probe input;
* the optimizer (optimizer.py, patch_optimizer): a torch.optim.AdamW becomes fusewise.optim.AdamW
  in place, with its hyper-parameters and state.

Everything is per instance (_swap.py): no library class is changed, so another model built in the
same process is untouched.
"""

from __future__ import annotations

import torch

from . import _swap, hf_mlp, hf_norms, hf_rotary, torch_norms
from . import loss as loss_routing
from .optimizer import patch_optimizer, unpatch_optimizer
from .report import LEFT_ALONE, SWAPPED, UNRECOGNISED, Change, PatchReport

__all__ = [
    "patch",
    "unpatch",
    "patch_optimizer",
    "unpatch_optimizer",
    "PatchReport",
    "Change",
    "SWAPPED",
    "LEFT_ALONE",
    "UNRECOGNISED",
]


def patch(
    model: torch.nn.Module,
    *,
    norms: bool = True,
    loss: bool = True,
    activations: bool = True,
    rotary: bool = True,
) -> PatchReport:
    """Swap what fusewise knows in `model`, in place. Returns a PatchReport: every module swapped,
    every module recognised but left alone (and why), every norm-like module not recognised.
    Modules already patched are not listed again, so a second call lists only what is left."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    report = PatchReport()
    if norms:
        for name, module in model.named_modules():
            if _swap.is_patched(module):
                continue
            change = torch_norms.patch_module(name, module) or hf_norms.patch_module(name, module)
            if change is not None:
                report.changes.append(change)
    if activations:
        for name, module in model.named_modules():
            if _swap.is_patched(module):
                continue
            change = hf_mlp.patch_module(name, module)
            if change is not None:
                report.changes.append(change)
    if rotary:
        for name, module in model.named_modules():
            if _swap.is_patched(module):
                continue
            change = hf_rotary.patch_module(name, module, model)
            if change is not None:
                report.changes.append(change)
    if loss:
        name, inner = unwrapped(model)
        for change in loss_routing.patch_model(inner):
            change.name = name
            report.changes.append(change)
    return report


# The attribute under which a wrapper keeps the model it runs: torch.compile's OptimizedModule,
# DistributedDataParallel / DataParallel. The loss is routed on the model's own class (its
# forward calls lm_head and loss_function); the wrapper calls that forward and sees the swap.
_WRAPPED = ("_orig_mod", "module")


def unwrapped(model: torch.nn.Module) -> tuple[str, torch.nn.Module]:
    """(path, the model inside any wrappers): ("_orig_mod", m) for torch.compile(m)."""
    path = []
    while True:
        inner = next(
            (
                (a, getattr(model, a))
                for a in _WRAPPED
                if isinstance(getattr(model, a, None), torch.nn.Module) and len(model._modules) == 1
            ),
            None,
        )
        if inner is None:
            return ".".join(path), model
        path.append(inner[0])
        model = inner[1]


def unpatch(model: torch.nn.Module) -> int:
    """Undo every change fusewise.patch made to `model` (and its submodules); returns how many
    modules were restored."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return sum(_swap.restore(m) for m in model.modules())
