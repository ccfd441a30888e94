"""Hugging Face attention modules' rotary embedding -> fusewise.ops.apply_rotary, per instance.

HF attention modules call a global of their modeling module inside forward:
``query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)``. A module
is a candidate when the class defining its forward names that global (forward.__code__.co_names)
and the global is a form hf_rotary_forms.py recognises (its docstring lists what is and what is
not). Its class is switched (_swap.subclass) to one whose forward is the same function rebuilt
with types.FunctionType over a copy of the modeling module's globals in which
apply_rotary_pos_emb is hf_rotary_forms.adaptor_for(form): the same code, closure (super()'s
__class__ cell), defaults and keyword defaults; only that one name resolves elsewhere. The HF
class, its module's globals and every other instance are untouched. The copy is taken when the
class is first patched in the process (one rebuilt forward per class): a global the modeling
module rebinds later is not seen by patched forwards. The copy has no __name__, so torch.compile
guards on the copy itself rather than on the modeling module's attribute.

A forward wrapped by decorators (functools.wraps: __wrapped__ set; transformers >= 5.2x wraps
attention forwards in deprecate_kwarg) is rebuilt layer by layer: the innermost function as above,
each wrapper with its own code and globals and the closure cell that held the function it wraps
now holding the rebuilt one. A wrapper that does not hold what it wraps in exactly one closure
cell (a class-based wrapper, a lookup by name) is left alone with the reason. A global that is a
hub-kernel wrapper (transformers >= 5.25 with the `kernels` package: an nn.Module calling the
function) counts as the function it calls (hf_rotary_forms.hub_function), unless kernelize() gave
it, or the instance's own copy of it, a hub kernel's forward: that module is left alone.

Every swap is checked before it is kept: the original and the rebuilt forward run on a probe
(hidden states [2, 5, hidden]; position embeddings from the model's rotary embedding module when
one gives a [2, 5, Dr] pair with an even Dr <= head_dim, else cos/sin of random angles over
head_dim; position_ids and attention_mask=None where forward takes them), in eval mode (no
dropout), in the weights' dtype, and every tensor they return must agree within 1e-5 (fp32) or 4
ulps (bf16/fp16: HF rounds each product, the op rounds once) of |original| + max |original|. The
rebuilt forward must also have called the adaptor on the probe (a forward that takes another
branch, as DeepSeek-V3's with rope_interleave, agrees trivially and gains nothing). On a
mismatch, no call, or anything the probe raises, the class is restored and the module reported
as left alone with what happened.
"""

from __future__ import annotations

import copyreg
import dis
import functools
import inspect
import types

import torch

from . import _probe, _swap, hf_rotary_forms
from .report import Change

GLOBAL = "apply_rotary_pos_emb"
NOW = "fusewise.ops.apply_rotary"
_BATCH, _SEQ = 2, 5


def rotary_class(cls: type) -> type | None:
    """The first class in cls's MRO whose own forward loads the global apply_rotary_pos_emb."""
    for c in cls.__mro__:
        fn = vars(c).get("forward")
        if inspect.isfunction(fn) and _loads_global(inspect.unwrap(fn).__code__):
            return c
    return None


def _loads_global(code) -> bool:
    """code reads the global GLOBAL (co_names alone also holds attribute names: a forward calling
    self.apply_rotary_pos_emb would look the same and not see the adaptor)."""
    if GLOBAL not in code.co_names:
        return False
    return any(i.opname == "LOAD_GLOBAL" and i.argval == GLOBAL for i in dis.get_instructions(code))


def recognised(cls: type) -> tuple[hf_rotary_forms.RotaryForm, bool] | str | None:
    """(form, interleaved) if `cls` (a class with rotary_class) can be patched, the reason if
    not, None if its forward does not call apply_rotary_pos_emb at all."""
    base = rotary_class(cls)
    if base is None:
        return None
    forward = vars(base)["forward"]
    problem = _unrebuildable(forward)
    if problem is not None:
        return f"its forward ({_swap.qualname(base)}.forward) {problem}"
    inner = inspect.unwrap(forward)
    return hf_rotary_forms.recognise(inner.__globals__.get(GLOBAL), inner.__globals__)


def _wrapped_cell(fn) -> int | str:
    """The index of the closure cell through which the wrapper `fn` calls fn.__wrapped__, or why
    there is no single one."""
    inner = fn.__wrapped__
    cells = [i for i, c in enumerate(fn.__closure__ or ()) if _cell_contents(c) is inner]
    if not inspect.isfunction(fn) or len(cells) != 1:
        return "is wrapped by a decorator that does not hold it in one closure cell"
    return cells[0]


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _unrebuildable(fn) -> str | None:
    while hasattr(fn, "__wrapped__"):
        found = _wrapped_cell(fn)
        if isinstance(found, str):
            return found
        fn = fn.__wrapped__
    return None if inspect.isfunction(fn) else "is not a plain function"


def _copy_function(fn, module_globals, closure):
    """fn's code over other globals and closure; its defaults, names and docs kept."""
    new = types.FunctionType(fn.__code__, module_globals, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = dict(fn.__kwdefaults__ or {}) or None
    functools.update_wrapper(new, fn, updated=())
    return new


def _rebuilt(fn, module_globals):
    """fn with the innermost function's globals replaced by module_globals, through its wrappers
    (recognised() has checked that each holds what it wraps in one closure cell)."""
    if not hasattr(fn, "__wrapped__"):
        new = _copy_function(fn, module_globals, fn.__closure__)
        del new.__wrapped__  # it is not a wrapper: inspect.unwrap must stop here
        return new
    at = _wrapped_cell(fn)
    inner = _rebuilt(fn.__wrapped__, module_globals)
    closure = tuple(types.CellType(inner) if i == at else c for i, c in enumerate(fn.__closure__))
    new = _copy_function(fn, fn.__globals__, closure)
    new.__wrapped__ = inner
    return new


@functools.cache
def fused_mixin(base: type) -> type:
    """A class (first base of the swapped class) whose forward is base.forward's code with
    apply_rotary_pos_emb bound to the adaptor. One per HF class, so _swap.subclass caches."""
    form, interleaved = recognised(base)
    original = vars(base)["forward"]
    module_globals = dict(inspect.unwrap(original).__globals__)
    module_globals[GLOBAL] = hf_rotary_forms.adaptor_for(form, interleaved)
    # torch.compile reads a function's globals through the module named by __name__ (an import
    # of modeling_llama, whose apply_rotary_pos_emb is HF's: a guard on it fails); without
    # __name__ it guards this dict itself, as for any scope that is not a module
    del module_globals["__name__"]
    forward = _rebuilt(original, module_globals)
    forward.__qualname__ = f"{original.__qualname__} (fusewise rotary)"
    namespace = {"forward": forward, "__module__": __name__, _BASE: base}
    return _MixinMeta(f"FusedRotary{base.__name__}", (), namespace)


_BASE = "_fusewise_rotary_base"


class _MixinMeta(type):
    """The mixins are built at run time, so pickle cannot find them by name: they pickle as
    fused_mixin(base) instead (copyreg below), and a pickled patched model loads patched."""


def _reduce_mixin(cls: type):
    base = vars(cls).get(_BASE)
    if base is None:  # a class deriving from a mixin (the swapped class): by name, as any
        return cls.__qualname__
    return fused_mixin, (base,)


copyreg.pickle(_MixinMeta, _reduce_mixin)


def patch_module(name: str, module: torch.nn.Module, model: torch.nn.Module) -> Change | None:
    """The Change for one module: swapped or left alone if its forward calls
    apply_rotary_pos_emb, else None. `model` is searched for a rotary embedding to probe with."""
    cls = type(module)
    base = rotary_class(cls)
    if base is None:
        return None
    was = _swap.qualname(cls)

    def alone(reason: str) -> Change:
        return Change(name, was, None, f"{reason}; left as it is", what="rotary")

    if "forward" in vars(module):
        return alone("its forward is set on the instance (kernelize, a wrapper)")
    # transformers >= 5.25 with `kernels`: each instance calls its own copy of the global
    # (use_kernelized_func), which kernelize() may have given a hub kernel's forward
    own = (vars(module).get("_kernel_funcs") or {}).get(GLOBAL)
    if own is not None and "forward" in vars(own):
        return alone(f"its {GLOBAL} is kernelized (a hub kernel)")
    if base is not next(c for c in cls.__mro__ if "forward" in vars(c)):
        return alone("its own forward overrides the one that calls apply_rotary_pos_emb")
    found = recognised(base)
    if isinstance(found, str):
        return alone(found)
    weight = next((p for p in module.parameters() if p.dim() == 2), None)
    problem = _probe.unprobeable(weight, 2)
    if problem is not None:
        return alone(problem)

    original = vars(base)["forward"]
    _swap.swap_class(module, _swap.subclass(fused_mixin(base), cls))
    try:
        mismatch = _probe_attention(module, original, weight, model)
    except Exception as e:  # anything the adaptor (or the original) refuses on this module
        mismatch = f"could not be probed ({type(e).__name__}: {e})"
    if mismatch is not None:
        _swap.restore(module)
        return alone(mismatch)
    form, interleaved = found
    where = original.__module__
    reason = f"{where}.{GLOBAL} ({form.describe(interleaved)})"
    if cls is not base:
        reason = f"defines no forward of its own: still a {was}; {reason}"
    return Change(name, was, NOW, reason, what="rotary")


def _probe_attention(module, original, weight, model) -> str | None:
    gen = torch.Generator().manual_seed(0x5EED)
    hidden = _hidden_size(module, weight)
    x = torch.randn(_BATCH, _SEQ, hidden, generator=gen).to(weight.device, weight.dtype)
    positions = torch.arange(_SEQ, device=weight.device).expand(_BATCH, _SEQ)
    params = inspect.signature(original).parameters
    kwargs = {}
    if "position_embeddings" in params:
        kwargs["position_embeddings"] = _position_embeddings(module, model, x, positions, gen)
    if "position_ids" in params:
        kwargs["position_ids"] = positions
    if "attention_mask" in params:
        kwargs["attention_mask"] = None
    modes = {m: m.training for m in module.modules()}
    module.eval()  # dropout off in both runs
    # the rebuilt forward's globals: its adaptor counted while it runs on the probe
    rebuilt_globals = inspect.unwrap(type(module).forward).__globals__
    adaptor, calls = rebuilt_globals[GLOBAL], []

    def counted(*args, **kwargs):
        calls.append(1)
        return adaptor(*args, **kwargs)

    rebuilt_globals[GLOBAL] = counted
    try:
        with torch.no_grad():
            want = original(module, x, **kwargs)
            got = type(module).forward(module, x, **kwargs)
    finally:
        rebuilt_globals[GLOBAL] = adaptor
        for m, mode in modes.items():
            m.training = mode
    if not calls:  # outputs agree trivially: both ran HF's other code
        return (
            f"its forward did not call {GLOBAL} on a probe (it took another branch, e.g. "
            f"DeepSeek-V3's rope_interleave), so there is nothing to swap"
        )
    return _differs(got, want)


def _differs(got, want) -> str | None:
    if isinstance(want, torch.Tensor) or want is None:
        got, want = (got,), (want,)
    if not isinstance(got, (tuple, list)) or len(got) != len(want):
        return "the rebuilt forward returns another structure than the original on a probe"
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor) and w.is_floating_point():
            problem = _probe.differs(g, w, ulps=4, floor=1.0)
            if problem is not None:
                return problem
        elif type(g) is not type(w):
            return "the rebuilt forward returns another structure than the original on a probe"
    return None


def _hidden_size(module, weight) -> int:
    size = getattr(getattr(module, "config", None), "hidden_size", None)
    return size if isinstance(size, int) else weight.shape[1]


def _head_dim(module) -> int | None:
    for attr in ("head_dim", "head_size"):
        value = getattr(module, attr, None)
        if isinstance(value, int):
            return value
    return None


def _position_embeddings(module, model, x, positions, gen):
    """(cos, sin) [2, 5, Dr] from the model's first rotary embedding module that gives a pair
    fitting the head, else of random angles over head_dim."""
    head_dim = _head_dim(module)
    for m in model.modules():
        if not type(m).__name__.endswith("RotaryEmbedding"):
            continue
        try:
            with torch.no_grad():
                cos, sin = m(x, positions)
        except Exception:  # another signature (a layer type, a 3-D position grid): next one
            continue
        dr = cos.shape[-1]
        fits = head_dim is None or (dr % 2 == 0 and dr <= head_dim)
        if cos.shape[:2] == (_BATCH, _SEQ) and sin.shape == cos.shape and fits:
            return cos, sin
    if head_dim is None:
        raise ValueError("no rotary embedding module to probe with and no head_dim attribute")
    angles = torch.rand(_BATCH, _SEQ, head_dim, generator=gen) * 6.3
    return angles.cos().to(x.dtype).to(x.device), angles.sin().to(x.dtype).to(x.device)
