"""What a fusion chain computes, in the word its fix is keyed by (fixes.text("fusion-chain",
pattern)): optimizer, grad-clip, cross-entropy, attention, norm, rotary, gated-activation,
elementwise, other (report.findings.PATTERNS; docs/findings.md describes each).

The first of these that matches wins, in that order: a phase (optimizer, grad-clip) says more
than the ops; a loss or a softmax names the chain even when other ops joined it; a norm before
the two dataflow patterns, so a norm's chain never becomes gated; elementwise / other last.

Rotary and gated-activation are decided from the chain's structure, never from source text: the
op names and which values flow into which ops, with views made transparent (a slice, select,
transpose or reshape reads its base). Shapes and names as recorded in an OpGraph:

- rotary, forward (HF `q * cos + rotate_half(q) * sin`; GPT-J `stack((-x[..., 1::2],
  x[..., ::2]), -1).flatten(-2)`): a `neg` of a view of X (one half) placed by `cat` / `stack`
  next to another view of X (the other half), the placed tensor multiplied (by sin).
  Backward: the incoming gradient times sin (a `mul` making Y), a `neg` of a view of Y placed
  back by `slice_backward` / `select_backward` next to another view of Y.
- gated-activation, forward: act(gate) * up, act a `silu` / `gelu` (exact or tanh: one op), or
  silu written out as `gate * sigmoid(gate)`, its output multiplied by another tensor of the
  same shape and dtype that is not the gate and not a dropout mask (CPU dropout is a
  `bernoulli_` mask times the input; the mask is looked for before the chain too).
  Backward: `silu_backward` / `gelu_backward` whose incoming gradient is a `mul` of two
  tensors of that shape (grad_h * up), neither a dropout mask.

Not recognised (they fall to elementwise / other, and a backward chain of the same line still
takes its forward chain's pattern in chains.py): GELU written out with tanh (HF `gelu_new`),
rotary by complex multiplication (`view_as_complex`), a sigmoid gate (GLU) without silu.
"""

from __future__ import annotations

from collections import defaultdict

from ..capture.graph import OpGraph, OpRecord
from ._measured import MATMULS

# base names (aten.<name>.<overload>) of the ops each structure is made of
_ACTIVATIONS = ("silu", "silu_", "gelu", "gelu_")
_ACTIVATION_BACKWARDS = ("silu_backward", "gelu_backward")
_PLACING = ("cat", "stack", "slice_backward", "select_backward")  # put halves side by side
_MULS = ("mul", "mul_")
_RANDOM = ("bernoulli", "bernoulli_", "rand", "rand_like", "native_dropout", "uniform_")
_MASK_SEARCH_DEPTH = 4  # ops walked back from a multiplier looking for a dropout mask


def _op_name(op: OpRecord) -> str:
    """The op's name without namespace and overload: aten.mul.Tensor -> mul."""
    parts = op.name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def pattern(
    ops: list[OpRecord],
    graph: OpGraph,
    base: dict[int, int] | None = None,
    producer: dict[int, int] | None = None,
) -> str:
    """The pattern of one chain. ops: the chain's ops in execution order (no view ops: views
    move nothing and are never chain members), of graph. base: view value -> the value it views
    (graph.view_bases()); producer: value (views resolved) -> index of the op that wrote it;
    both computed when not given (the caller usually has them)."""
    names = " ".join(op.name for op in ops)
    if ops[0].phase == "optimizer":
        return "optimizer"
    if ops[0].phase == "post-backward":  # gradient processing: clip_grad_norm_'s norms, scaling
        return "grad-clip"
    if any(s in names for s in ("log_softmax", "nll_loss", "logsumexp", "cross_entropy")):
        return "cross-entropy"
    if "._softmax" in names or ".softmax" in names:  # a softmax that is not a log-softmax
        return "attention"
    if ("rsqrt" in names or "sqrt" in names or ".var" in names) and ".mean" in names:
        return "norm"
    if base is None:
        base = graph.view_bases()
    if producer is None:
        producer = {
            base.get(v, v): op.index for op in graph.ops if not op.is_view for v in op.outputs
        }
    flow = _Flow(ops, graph, base, producer)
    if flow.is_rotary():
        return "rotary"
    if flow.is_gated():
        return "gated-activation"
    if all(
        op.name not in MATMULS
        and "sum" not in op.name
        and "mean" not in op.name
        and "max" not in op.name
        for op in ops
    ):
        return "elementwise"
    return "other"


class _Flow:
    """Dataflow inside one chain, views resolved to their base: who made a value, who reads it."""

    def __init__(self, ops: list[OpRecord], graph: OpGraph, base: dict, producer: dict):
        self.ops, self.graph, self.base, self.producer = ops, graph, base, producer
        self.values = graph.values
        self.made_by: dict[int, OpRecord] = {}
        self.read_by: dict[int, list[OpRecord]] = defaultdict(list)
        for op in ops:
            for v in op.outputs:
                self.made_by[self.resolve(v)] = op
            for v in op.inputs:
                self.read_by[self.resolve(v)].append(op)

    def resolve(self, v: int) -> int:
        return self.base.get(v, v)

    def named(self, names: tuple[str, ...]) -> list[OpRecord]:
        return [op for op in self.ops if _op_name(op) in names]

    def alike(self, a: int, b: int) -> bool:
        """Two operands of the same shape and dtype (a 0-dim scalar matches nothing)."""
        va, vb = self.values.get(a), self.values.get(b)
        return (
            va is not None
            and vb is not None
            and len(va.shape) > 0
            and va.shape == vb.shape
            and va.dtype == vb.dtype
        )

    # --- rotary -------------------------------------------------------------------------------

    def is_rotary(self) -> bool:
        for neg in self.named(("neg",)):
            if not neg.inputs or not neg.outputs:
                continue
            half = neg.inputs[0]
            whole = self.resolve(half)
            if half == whole:
                continue  # negates a whole tensor, not one half of it
            negated = self.resolve(neg.outputs[0])
            placing = [op for op in self.read_by[negated] if _op_name(op) in _PLACING]
            # the other half: a view of the same tensor, placed beside the negated one
            beside = [op for op in self.read_by[whole] if _op_name(op) in _PLACING]
            if not placing or not beside:
                continue
            placed_times_sin = any(  # forward: rotate_half(q) * sin
                _op_name(m) in _MULS
                for p in placing
                for v in p.outputs
                for m in self.read_by[self.resolve(v)]
            )
            made_by = self.made_by.get(whole)
            grad_times_sin = made_by is not None and _op_name(made_by) in _MULS  # backward
            if placed_times_sin or grad_times_sin:
                return True
        return False

    # --- gated activation ---------------------------------------------------------------------

    def is_gated(self) -> bool:
        return (
            any(self._times_up(out, gate) for out, gate in self._activations())
            or self._gated_backward()
        )

    def _activations(self) -> list[tuple[int, int]]:
        """(activation output, gate) of each silu / gelu, and of silu written as gate *
        sigmoid(gate)."""
        found = [
            (self.resolve(op.outputs[0]), self.resolve(op.inputs[0]))
            for op in self.named(_ACTIVATIONS)
            if op.inputs and op.outputs
        ]
        for sig in self.named(("sigmoid",)):
            if not sig.inputs or not sig.outputs:
                continue
            gate = self.resolve(sig.inputs[0])
            for m in self.read_by[self.resolve(sig.outputs[0])]:
                if _op_name(m) in _MULS and gate in {self.resolve(v) for v in m.inputs}:
                    found += [(self.resolve(v), gate) for v in m.outputs]
        return found

    def _times_up(self, act: int, gate: int) -> bool:
        """The activation's output multiplied by another tensor of its shape: up, not the gate
        (that is silu's own product) and not a dropout mask."""
        for m in self.read_by[act]:
            if _op_name(m) not in _MULS or len(m.inputs) != 2:
                continue
            mine = [v for v in m.inputs if self.resolve(v) == act]
            other = [v for v in m.inputs if self.resolve(v) != act]
            if len(mine) != 1 or len(other) != 1:
                continue  # act * act, or act times a scalar
            up = other[0]
            if self.resolve(up) != gate and self.alike(mine[0], up) and not self._random(up):
                return True
        return False

    def _gated_backward(self) -> bool:
        """silu_backward / gelu_backward fed by grad_h * up (two tensors of one shape)."""
        for op in self.named(_ACTIVATION_BACKWARDS):
            if not op.inputs:
                continue
            m = self.made_by.get(self.resolve(op.inputs[0]))
            if (
                m is not None
                and _op_name(m) in _MULS
                and len(m.inputs) == 2
                and self.alike(*m.inputs)
                and not any(self._random(v) for v in m.inputs)
            ):
                return True
        return False

    def _random(self, v: int) -> bool:
        """Made from random numbers a few ops back, in this chain or before it (the backward
        multiplies by the mask its forward made): a dropout mask."""
        frontier, seen = [self.resolve(v)], set()
        for _ in range(_MASK_SEARCH_DEPTH):
            nxt = []
            for u in frontier:
                i = self.producer.get(u)
                if i is None or i in seen:
                    continue
                seen.add(i)
                op = self.graph.ops[i]
                if _op_name(op) in _RANDOM:
                    return True
                nxt += [self.resolve(w) for w in op.inputs]
            frontier = nxt
        return False
