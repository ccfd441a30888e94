"""FLOPs and bytes per op, as functions of shape and dtype.

The base model for benchmarks and the diagnosis: Cost, matmul, elementwise, and aten_op for the
ops a step records. Bytes are the *minimum* traffic a fused kernel needs: every input read once,
every output written once. Dividing them by the measured copy bandwidth gives the floor time of a
memory-bound op; dividing FLOPs by bytes gives its intensity.

Each op family of fusewise.ops declares its own model once, in ops/<family>/cost.py (e.g.
fusewise.ops.norms.cost.norm), and registers it here for its custom ops (register_op), so a
recorded "fusewise.norm_fwd.default" is costed by its family. This module imports nothing from
fusewise.ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.bytes if self.bytes else math.inf

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def matmul(
    m: int, n: int, k: int, dtype: torch.dtype, out_dtype: torch.dtype | None = None
) -> Cost:
    """[m, k] @ [k, n] -> [m, n]: reads both operands once, writes the result once."""
    out_dtype = out_dtype or dtype
    nbytes = (m * k + k * n) * itemsize(dtype) + m * n * itemsize(out_dtype)
    return Cost(2.0 * m * n * k, nbytes)


def elementwise(
    numel: int,
    dtype: torch.dtype,
    *,
    n_inputs: int = 1,
    n_outputs: int = 1,
    flops_per_element: float = 1.0,
) -> Cost:
    return Cost(flops_per_element * numel, (n_inputs + n_outputs) * numel * itemsize(dtype))


# --- aten ops, for the diagnosis -------------------------------------------------------------

_MATMULS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default"}
_ATTENTION = ("scaled_dot_product", "_flash_attention", "_efficient_attention")
_GATHERS = ("aten.embedding.", "aten.index_select.", "aten.gather.", "aten.index.Tensor")


# name prefix -> fn(name, inputs, outputs) -> Cost or None (None: the generic count below)
_REGISTERED: dict[str, Callable[[str, list, list], Cost | None]] = {}


def register_op(name_prefix: str, fn: Callable[[str, list, list], Cost | None]) -> None:
    """aten_op asks fn first for every op whose name starts with name_prefix (the recorder's
    names: str() of the overload, "fusewise.norm_fwd.default"). fn(name, inputs, outputs) gets
    the tensor arguments and results as recorded (None arguments left out) and returns a Cost,
    or None to fall back to the generic count. Registering a prefix again replaces its fn."""
    _REGISTERED[name_prefix] = fn


def aten_op(
    name: str,
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    *,
    is_view: bool = False,
    written: set[int] = frozenset(),
) -> Cost:
    """FLOPs and bytes of one aten op as it ran (as written: each tensor argument read once,
    each output written once; a view moves nothing). Matmuls count 2·m·n·k; attention kernels
    4·B·H·S_q·S_k·D; everything else one FLOP per element of its largest operand. An op whose
    name a family registered (register_op) is costed by that family first."""
    for prefix, fn in _REGISTERED.items():
        if name.startswith(prefix):
            c = fn(name, list(inputs), list(outputs))
            if c is not None:
                return c
    if is_view:
        return Cost(0.0, 0.0)
    reads = {id(t): t for t in inputs}
    writes = {id(t): t for t in outputs}
    writes.update({id(t): t for t in inputs if id(t) in written})  # in place, foreach, out=
    nbytes = float(sum(t.numel() * t.element_size() for t in (*reads.values(), *writes.values())))
    if name.startswith(_GATHERS) and outputs:
        # reads only the rows it gathers (as many bytes as it writes) and the indices
        out_bytes = sum(t.numel() * t.element_size() for t in outputs)
        idx_bytes = sum(t.numel() * t.element_size() for t in inputs if not t.is_floating_point())
        return Cost(float(sum(t.numel() for t in outputs)), 2.0 * out_bytes + idx_bytes)
    if name in _MATMULS:
        a, b = (inputs[-2], inputs[-1])
        m, k = a.shape[-2], a.shape[-1]
        n = b.shape[-1]
        batch = a.numel() // (m * k) if a.dim() == 3 else 1
        return Cost(2.0 * batch * m * n * k, nbytes)
    if any(s in name for s in _ATTENTION) and len(inputs) >= 3 and inputs[0].dim() == 4:
        q, k = inputs[0], inputs[1]
        b, h, sq, d = q.shape
        return Cost(4.0 * b * h * sq * k.shape[-2] * d, nbytes)
    largest = max((t.numel() for t in list(inputs) + list(outputs)), default=0)
    return Cost(float(largest), float(nbytes))
