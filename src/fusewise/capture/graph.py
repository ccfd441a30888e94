"""The op graph a recorded step becomes (capture/opgraph.py records it): values (a tensor between
two in-place writes), ops (aten overloads with bytes, FLOPs, phase, source line, device time) and
the scaled_dot_product_attention calls. Plain data, saved as JSON (tests/data's golden graphs)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

# Which part of the step ran an op:
# - "backward": inside an autograd node (the ops of loss.backward());
# - "optimizer": inside a torch Optimizer's step() (outside autograd nodes);
# - "post-backward": outside both, reading a gradient (a value made in the backward) or a value
#   made from one: gradient processing such as clip_grad_norm_'s norms and scaling, GradScaler's
#   unscale_, a manual p.grad.mul_(s). Decided by dataflow, not by call order: with gradient
#   accumulation the next micro-batch's forward runs after a backward and stays "forward";
# - "forward": anything else (the forward, the loss, data preparation).
PHASES = ("forward", "backward", "post-backward", "optimizer")


def phase_outside_autograd(in_optimizer: bool, inputs, from_grads: set[int]) -> str:
    """The phase of an op no autograd node ran: "optimizer" inside an optimizer step, else
    "post-backward" when it reads a value in from_grads (values made in the backward or in the
    post-backward; the caller adds the outputs of such ops), else "forward"."""
    if in_optimizer:
        return "optimizer"
    return "post-backward" if any(v in from_grads for v in inputs) else "forward"


@dataclass
class Value:
    """One tensor value: a tensor object between two in-place writes."""

    vid: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    obj: int = -1  # vid of the tensor object's first value: in-place writes share it
    device: str = "cpu"  # device type: "cuda", "cpu", "meta"

    def __post_init__(self):
        if self.obj < 0:
            self.obj = self.vid


@dataclass
class OpRecord:
    index: int
    name: str  # aten overload, e.g. "aten.mm.default"
    phase: str  # one of PHASES
    inputs: list[int]  # value ids read
    outputs: list[int]  # value ids written (a fresh id for in-place writes)
    flops: float
    bytes: float
    where: str  # path:line in the user's code ("?" when none was found)
    is_view: bool = False
    ms: float = 0.0  # measured time of this op in the recorded step (device time on a GPU)

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")


@dataclass
class OpGraph:
    ops: list[OpRecord] = field(default_factory=list)
    values: dict[int, Value] = field(default_factory=dict)
    # one entry per F.scaled_dot_product_attention call: where, which aten op ran it (None: the
    # math path, written out as matmuls and a softmax), the ops it made, and its arguments
    attention: list[dict] = field(default_factory=list)

    def view_bases(self) -> dict[int, int]:
        """value id of each view -> the value it is a view of, resolved to the base (a view of a
        view maps to the first). A value that is its own view (lift_fresh, alias returning its
        input) is not entered: resolving it must not loop."""
        base: dict[int, int] = {}
        for op in self.ops:
            if op.is_view and op.inputs:
                src = base.get(op.inputs[0], op.inputs[0])
                for v in op.outputs:
                    if v != src:
                        base[v] = src
        return base

    def to_json(self) -> str:
        return json.dumps(
            {
                "ops": [asdict(o) for o in self.ops],
                "values": [asdict(v) for v in self.values.values()],
                "attention": self.attention,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> OpGraph:
        d = json.loads(text)
        values = {
            v["vid"]: Value(
                v["vid"],
                tuple(v["shape"]),
                v["dtype"],
                v["nbytes"],
                v["obj"],
                v.get("device", "cpu"),
            )
            for v in d["values"]
        }
        return cls([OpRecord(**o) for o in d["ops"]], values, d.get("attention", []))


# the aten ops of scaled_dot_product_attention's fused backends (flash, memory-efficient, cuDNN)
FUSED_SDPA = ("_flash_attention", "_efficient_attention", "_cudnn_attention")


def attention_call(where, ops, start, end, q, mask, dropout, is_causal) -> dict:
    """One graph.attention entry: the call's line, the range of ops it ran, the fused op that ran
    it (None: torch's math path) and its arguments. q and mask: anything with .dtype, .device
    and a shape (a tensor's .shape, the profiler's .sizes); mask None when there is none."""

    def dims(t):
        return list(getattr(t, "shape", None) or getattr(t, "sizes", ()))

    def dtype(t):
        return str(t.dtype).replace("torch.", "")

    return dict(
        where=where,
        ops=[start, end],
        kernel=next((op.name for op in ops if any(f in op.name for f in FUSED_SDPA)), None),
        shape=dims(q),
        dtype=dtype(q),
        device=q.device.type,
        mask=None if mask is None else f"{dtype(mask)} {dims(mask)}",
        dropout=float(dropout or 0.0),
        is_causal=bool(is_causal),
    )
