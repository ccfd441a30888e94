"""Hugging Face causal LMs: the training loss from fusewise.ops.linear_cross_entropy, the
[tokens, vocab] logits never materialised. Per instance; fusewise.unpatch undoes it.

Three per-instance changes, none copying a family's forward:

* lm_head's class -> a subclass (_StashingHead) that, while armed, keeps its input (the last
  hidden state, already sliced by logits_to_keep) and returns an empty [..., 0] tensor, so the
  ops between lm_head and the loss (Gemma2/3's softcap) run on nothing;
* the model's `_loss_function` (HF's `loss_function` property reads it) -> a _RoutedLoss that,
  given those empty logits, computes linear_cross_entropy on the kept hidden state with
  lm_head's weight and bias, as HF's ForCausalLMLoss would (shift, ignore_index, shift_labels,
  num_items_in_batch), and otherwise calls HF's loss function unchanged;
* the model's class -> a subclass (_RoutedCausalLM) whose forward arms the head when
  `self.training` and labels are given (and return_logits=True is not), calls HF's forward, and
  returns its output without logits. Its signature is HF's (functools.wraps), as Trainer reads it.

Which forwards qualify is read from their source (_forward_problem): lm_head's output must reach
self.loss_function unchanged, but for Gemma-style final_logit_softcapping, which the op applies
(softcap=). A scale (Cohere, Granite), a slice or a second head is left alone, with the reason.
"""

from __future__ import annotations

import functools
import inspect
import re

import torch
from torch import Tensor, nn

from ..ops.linear_ce import linear_cross_entropy
from . import _swap
from .report import LEFT_ALONE, Change

NOW = "fusewise.ops.linear_cross_entropy"
_HF_LOSS = "transformers.loss.loss_utils.ForCausalLMLoss"
_ARMED, _HIDDEN = "_fusewise_armed", "_fusewise_hidden"
REASON = (
    "in training (model.training) with labels: the loss from the last hidden state and "
    "lm_head.weight, the logits never materialised (outputs.logits is None; pass "
    "return_logits=True to the forward for HF's own path and the logits); eval or no labels: "
    "unchanged"
)


class _StashingHead:
    """lm_head's class while patched (before nn.Linear in the MRO)."""

    def forward(self, input: Tensor) -> Tensor:
        if not self._fusewise_armed:
            return super().forward(input)
        self._fusewise_hidden = input
        return input.new_empty((*input.shape[:-1], 0))


class _RoutedLoss:
    """The model's loss_function while patched: HF's ForCausalLMLoss, or linear_cross_entropy
    when the armed head left a hidden state and the logits are the empty stand-in."""

    def __init__(self, head: nn.Module, original, config=None):
        self.head = head
        self.original = original  # HF's ForCausalLMLoss
        self.config = config  # its final_logit_softcapping is the softcap; None: no softcap

    def __call__(
        self,
        logits,
        labels,
        vocab_size,
        num_items_in_batch=None,
        ignore_index=-100,
        shift_labels=None,
        **kwargs,
    ):
        hidden = self.head._fusewise_hidden
        if hidden is None or logits.shape[-1] != 0:
            return self.original(
                logits,
                labels,
                vocab_size,
                num_items_in_batch=num_items_in_batch,
                ignore_index=ignore_index,
                shift_labels=shift_labels,
                **kwargs,
            )
        self.head._fusewise_hidden = None
        if shift_labels is None:  # as ForCausalLMLoss: label t+1 at t, the last one ignored
            labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:]
        target = shift_labels.reshape(-1).to(hidden.device)
        h = hidden.reshape(-1, hidden.shape[-1])
        if target.shape[0] != h.shape[0]:
            raise ValueError(
                f"fusewise.patch (loss): {h.shape[0]} positions reach lm_head but the labels "
                f"give {target.shape[0]} targets (logits_to_keep with labels needs shift_labels "
                f"of the kept positions' shape); HF's loss would fail the same way"
            )
        if target.dtype not in (torch.int64, torch.int32):
            target = target.long()
        h, weight, bias = _cast(h, self.head.weight, self.head.bias)
        softcap = getattr(self.config, "final_logit_softcapping", None) if self.config else None
        loss = linear_cross_entropy(
            h, weight, target, bias, ignore_index=ignore_index, reduction="sum", softcap=softcap
        )
        if num_items_in_batch is None:
            # F.cross_entropy's mean, as HF takes it: the sum over the targets not ignored over
            # their count, on the device (no sync). A batch whose every label is ignored gives a
            # NaN loss and zero gradients, as F.cross_entropy does (linear_cross_entropy's own
            # "mean" gives 0 there): NaN added to the value only, outside autograd's path.
            count = (target != ignore_index).sum()
            empty = torch.where(count == 0, float("nan"), 0.0).to(loss.dtype)
            return loss / count.clamp_min(1) + empty
        if torch.is_tensor(num_items_in_batch):  # as HF's fixed_cross_entropy
            num_items_in_batch = num_items_in_batch.to(loss.device)
        return loss / num_items_in_batch


def _cast(h: Tensor, weight: Tensor, bias: Tensor | None):
    """The dtypes nn.Linear would compute in: autocast's when it is on, else the weight's."""
    device = h.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    else:
        dtype = weight.dtype
    return h.to(dtype), weight.to(dtype), bias.to(dtype) if bias is not None else None


def _is_stand_in(x) -> bool:
    return isinstance(x, Tensor) and x.dim() > 0 and x.shape[-1] == 0


def _routed_forward(original):
    """The model's forward: HF's (`original`), with the head armed in training with labels."""
    names = list(inspect.signature(original).parameters)[1:]  # without self
    labels_at = names.index("labels") if "labels" in names else None

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        return_logits = kwargs.pop("return_logits", False)
        labels = kwargs.get("labels")
        if labels is None and labels_at is not None and len(args) > labels_at:
            labels = args[labels_at]
        route = getattr(self, "_loss_function", None)
        if (
            labels is None
            or return_logits
            or not self.training
            or not isinstance(route, _RoutedLoss)
            or getattr(self, "lm_head", None) is not route.head
        ):
            return original(self, *args, **kwargs)
        head = route.head
        head._fusewise_armed = True
        try:
            out = original(self, *args, **kwargs)
        finally:
            head._fusewise_armed = False
            head._fusewise_hidden = None
        if isinstance(out, tuple):  # return_dict=False: as HF's to_tuple leaves a None out
            return tuple(x for x in out if not _is_stand_in(x))
        return type(out)(**{k: v for k, v in out.items() if k != "logits"})

    return forward


class _RoutedCausalLM:
    """The model's class while patched (before HF's class in the MRO); each subclass gets a
    forward wrapping the next forward in its MRO, with that forward's signature."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        later = cls.__mro__[cls.__mro__.index(_RoutedCausalLM) + 1 :]
        original = next(k.__dict__["forward"] for k in later if "forward" in k.__dict__)
        cls.forward = _routed_forward(original)


def patch_model(model: nn.Module) -> list[Change]:
    """Route the loss of `model` (a Hugging Face causal LM) through linear_cross_entropy. Returns
    the swap, a LEFT_ALONE Change saying why a model with an LM head is not routed, or nothing
    (no LM head, or routed already)."""
    if isinstance(model.__dict__.get("_loss_function"), _RoutedLoss):
        return []
    head = _output_head(model)
    if head is None:
        return []
    was = _swap.qualname(_swap.original_class(model))
    why, softcap = _why_not(model, head)
    if why is not None:
        return [Change("", was, None, why, LEFT_ALONE, what="loss")]
    _swap.set_attr(head, _ARMED, False)
    _swap.set_attr(head, _HIDDEN, None)
    _swap.swap_class(head, _swap.subclass(_StashingHead, type(head)))
    route = _RoutedLoss(head, model.loss_function, model.config if softcap else None)
    _swap.set_attr(model, "_loss_function", route)
    _swap.swap_class(model, _swap.subclass(_RoutedCausalLM, type(model)))
    reason = REASON + ("; final_logit_softcapping passed as softcap" if softcap else "")
    return [Change("", was, NOW, reason, what="loss")]


def _output_head(model: nn.Module) -> nn.Module | None:
    """The LM head: HF's get_output_embeddings(), else an `lm_head` attribute; None if none."""
    get = getattr(model, "get_output_embeddings", None)
    head = None
    if callable(get):
        try:
            head = get()
        except (AttributeError, NotImplementedError, TypeError):
            head = None
    if head is None:
        head = getattr(model, "lm_head", None)
    return head if isinstance(head, nn.Module) else None


def _why_not(model: nn.Module, head: nn.Module) -> tuple[str | None, bool]:
    """(why the loss is not routed or None, whether the forward applies the softcap)."""
    if not hasattr(type(model), "loss_function"):
        return "no loss_function: not a Hugging Face PreTrainedModel", False
    loss_type = getattr(model, "loss_type", None)
    if loss_type not in ("ForCausalLM", None):  # None: HF falls back to ForCausalLM
        return f"loss_type is {loss_type!r}; only the ForCausalLM loss is routed", False
    fn = model.loss_function
    if f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}" != _HF_LOSS:
        return f"its loss_function is {fn!r}, not HF's ForCausalLMLoss", False
    if getattr(model, "lm_head", None) is not head:
        return "its output embeddings are not model.lm_head", False
    if _swap.original_class(head) is not nn.Linear:
        cls = _swap.qualname(_swap.original_class(head))
        return f"lm_head is a {cls}, not a torch.nn.Linear", False
    if head.weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"lm_head.weight is {head.weight.dtype}", False
    return _forward_problem(_swap.original_class(model))


_HEAD_CALL = "logits = self.lm_head("
_HEAD_ENDS = (").float()", ").contiguous()", ")")
_SOFTCAP_LINES = {
    "logits = logits / self.config.final_logit_softcapping",
    "logits = torch.tanh(logits)",
    "logits = logits * self.config.final_logit_softcapping",
}
# after the loss, the logits may only be put in the output (or be the loss call's argument)
_OUTPUT_LINE = re.compile(
    r"logits=logits[,)]?|logits,|logits=logits, labels=.*|output = \(logits,\).*"
)
_LOSS_CALL = re.compile(r"self\.loss_function\(\s*(logits=)?logits\b")


def _forward_problem(cls: type) -> tuple[str | None, bool]:
    """Read the forward's source: lm_head's output must reach self.loss_function unchanged but
    for config.final_logit_softcapping. (problem or None, softcap applied)."""
    try:
        lines = [
            line.strip() for line in inspect.getsource(inspect.unwrap(cls.forward)).split("\n")
        ]
    except (OSError, TypeError):
        return "the source of its forward is not available to check", False
    head_at = next((i for i, line in enumerate(lines) if "self.lm_head(" in line), None)
    if head_at is None:
        return "its forward does not call self.lm_head", False
    loss_at = next(
        (i for i, line in enumerate(lines) if i > head_at and "self.loss_function(" in line), None
    )
    if loss_at is None:
        return "its forward does not call self.loss_function (a loss of its own)", False
    if not _plain_head_call(lines[head_at]):
        return f"its forward changes lm_head's output: `{lines[head_at]}`", False
    if not _LOSS_CALL.search(" ".join(lines[loss_at : loss_at + 3])):
        return "its forward does not pass lm_head's logits to self.loss_function", False
    softcap = False
    for line in lines[head_at + 1 : loss_at]:
        if not re.search(r"\blogits\b", line):
            continue
        if line not in _SOFTCAP_LINES:
            return f"its forward changes the logits before the loss: `{line}`", False
        softcap = True
    for line in lines[loss_at + 1 :]:
        if re.search(r"\blogits\b", line) and not _OUTPUT_LINE.fullmatch(line):
            return f"its forward uses the logits after the loss: `{line}`", False
    return None, softcap


def _plain_head_call(line: str) -> bool:
    """`logits = self.lm_head(<one argument expression>)`, maybe .float() or .contiguous():
    nothing applied to lm_head's output but a cast."""
    if not line.startswith(_HEAD_CALL):
        return False
    rest = line[len(_HEAD_CALL) :]
    end = next((e for e in _HEAD_ENDS if rest.endswith(e)), None)
    depth = 0
    for ch in rest[: len(rest) - len(end)] if end else "(":
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        if depth < 0:  # lm_head's call closed early: something follows it
            return False
    return end is not None and depth == 0
