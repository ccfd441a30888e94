"""Which aten overload a profiled op was (the profiler records a name and its arguments, not the
overload), whether the dispatcher runs it as one op or only as a CompositeImplicitAutograd
decomposition, and meta tensors of recorded layouts for the byte model (capture/profiled.py)."""

from __future__ import annotations

import torch

_SCHEMAS: dict = {}
MULTI_VIEWS = (
    "aten.split",
    "aten.chunk",
    "aten.unbind",
    "aten.split_with_sizes",
    "aten.unsafe_split",
)


def _fits(kind: str, typ: str) -> bool:
    """Whether a profiled argument (t: tensor, l: list, o: other) fits a schema type."""
    if kind == "t":
        return "Tensor" in typ and "[]" not in typ and "List[" not in typ
    if kind == "l":
        return "[]" in typ or typ.startswith(("List[", "Optional[List["))
    return not (typ == "Tensor" or typ.startswith("Tensor("))  # a scalar is no Tensor


def overload(name: str, inputs):
    """(aten overload name "aten.mm.default", the schema) of a profiled op, by its arguments."""
    kinds = tuple(
        "t" if hasattr(i, "sizes") else "l" if isinstance(i, list) else "o" for i in inputs
    )
    key = (name, kinds)
    if key not in _SCHEMAS:
        found = None
        for s in torch._C._jit_get_schemas_for_operator(name):
            if len(s.arguments) != len(kinds):
                continue
            ok = all(_fits(k, str(a.type)) for k, a in zip(kinds, s.arguments))
            if ok:
                found = s
                break
        if found is None:
            _SCHEMAS[key] = None
        else:
            ns, op = name.split("::")
            overload = found.overload_name or "default"
            _SCHEMAS[key] = (f"{ns}.{op}.{overload}", found)
    return _SCHEMAS[key]


_IMPLICIT: dict[str, bool] = {}


def decomposed(name: str) -> bool:
    """True when the op's only kernel is a CompositeImplicitAutograd decomposition: the
    dispatcher never runs it as one op below autograd, it runs what it decomposes into."""
    if name not in _IMPLICIT:
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        qual = name.replace(".default", "").replace(".", "::", 1)
        try:
            _IMPLICIT[name] = has(qual, "CompositeImplicitAutograd") and not any(
                has(qual, k) for k in ("CPU", "CUDA", "CompositeExplicitAutograd", "Meta")
            )
        except RuntimeError:
            _IMPLICIT[name] = False
    return _IMPLICIT[name]


def meta(t) -> torch.Tensor:
    return torch.empty_strided(tuple(t.sizes), tuple(t.strides), dtype=t.dtype, device="meta")
