"""Record the aten ops of a step as a dataflow graph: who produced each tensor and who read it.

A TorchDispatchMode sees every aten op of forward, backward and optimizer; a TorchFunctionMode
beside it maps each autograd node created in the forward to the user's source line, so backward
ops (run by that node) are attributed to the forward line that made them.

Tensor identity is by *value*: a tensor object gets a value id when first seen, and a new one
each time an op writes to it in place (so a consumer depends on the write it read). A view op
moves no bytes; its output is a new value whose producer is the view op, so dataflow goes through
it. Bytes and FLOPs come from fusewise.cost.aten_op.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from .. import cost
from . import graph, profiler
from .graph import OpGraph, OpRecord, Value, attention_call

_TORCH_DIR = os.path.dirname(torch.__file__)
# ops whose schema says "new tensor" but which return a view of their input's storage
_VIEW_LIKE = ("aten._unsafe_view",)
_FUSEWISE_DIR = os.path.dirname(os.path.dirname(__file__))
_EXAMPLES_DIR = os.path.join(_FUSEWISE_DIR, "examples")  # user code, though it ships with us


_SHOWN: dict[str, str | None] = {}  # code file -> how a line in it is shown (None: not user code)


def shown_path(path: str, skip_dirs) -> str | None:
    if path not in _SHOWN:
        user = not path.startswith(skip_dirs) or path.startswith(_EXAMPLES_DIR)
        if user and not path.startswith("<"):
            rel = os.path.relpath(path)
            _SHOWN[path] = path if rel.startswith("..") else rel
        else:
            _SHOWN[path] = None
    return _SHOWN[path]


def user_line(skip_dirs=(_TORCH_DIR, _FUSEWISE_DIR)) -> str:
    """path:line of the innermost frame outside torch and fusewise. (Paths are cached per file:
    the recorder asks for every op; the working directory is assumed not to change meanwhile.)"""
    frame = sys._getframe(1)
    while frame is not None:
        shown = shown_path(frame.f_code.co_filename, skip_dirs)
        if shown is not None:
            return f"{shown}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class _LineOfNode(TorchFunctionMode):
    """Remembers, for each autograd node made in the forward, the user line that made it."""

    def __init__(self, lines: dict):
        super().__init__()
        self.lines = lines

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        line = None
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (
                isinstance(t, torch.Tensor)
                and t.grad_fn is not None
                and t.grad_fn not in self.lines
            ):
                line = line or user_line()
                self._claim(t.grad_fn, line)
        return out

    def _claim(self, node, line: str) -> None:
        """The node and the unclaimed nodes behind it: a composite function (F.cross_entropy is
        log_softmax + nll_loss) makes inner nodes this mode never sees returned."""
        stack = [node]
        while stack:
            n = stack.pop()
            if n is None or n in self.lines or type(n).__name__ == "AccumulateGrad":
                continue
            self.lines[n] = line
            stack.extend(f for f, _ in n.next_functions)


_RANGE = "fusewise.op#"
_SCHEMAS: dict = {}


def _schema_of(func):
    """(name, argument names, whether each argument is written, is_view) of an aten overload,
    cached: the recorder asks for every op of a step."""
    if func not in _SCHEMAS:
        schema, name = func._schema, str(func)
        is_view = (
            name.startswith(_VIEW_LIKE)
            or bool(schema.returns)
            and all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        )
        _SCHEMAS[func] = (
            name,
            [a.name for a in schema.arguments],
            [a.alias_info is not None and a.alias_info.is_write for a in schema.arguments],
            is_view,
        )
    return _SCHEMAS[func]


_SDPA = (
    torch.nn.functional.scaled_dot_product_attention,
    torch._C._nn.scaled_dot_product_attention,
)


class _AttentionCalls(TorchFunctionMode):
    """Notes each scaled_dot_product_attention call and the aten op that ran it: a fused kernel
    (flash, memory-efficient, cuDNN) or none (torch's math fallback, [.., S, S] in memory)."""

    def __init__(self, rec: Recorder):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _SDPA:
            return func(*args, **kwargs)
        start = len(self.rec.graph.ops)
        out = func(*args, **kwargs)
        ops = self.rec.graph.ops[start:]
        q = args[0]
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        self.rec.graph.attention.append(
            attention_call(
                user_line(),
                ops,
                start,
                len(self.rec.graph.ops),
                q,
                mask,
                kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0),
                kwargs.get("is_causal", args[5] if len(args) > 5 else False),
            )
        )
        return out


class _Dispatch(TorchDispatchMode):
    def __init__(self, rec: Recorder):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "profiler":
            # record_function's enter/exit markers (torch.optim wraps every step() in one while
            # a profiler runs): not work, not recorded, and given no range of their own, since
            # a range is named by the index of the op it wraps
            return func(*args, **kwargs)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        on_gpu = any(a.is_cuda for a in tensors)
        if self.rec._prof is not None and (on_gpu or not tensors):
            # a profiler range per op: its kernels' device time, whatever the host gaps (also
            # for a factory op, which has no tensor argument but may launch a kernel)
            with torch.profiler.record_function(f"{_RANGE}{len(self.rec.graph.ops)}"):
                out = func(*args, **kwargs)
            timer = None
        else:
            timer = self.rec._start_timer(on_gpu)
            out = func(*args, **kwargs)
            timer = self.rec._stop_timer(timer)  # before the bookkeeping: only the op is timed
        self.rec._record(func, args, kwargs, out, timer)
        return out


class Recorder:
    """with Recorder() as rec: step()  ->  rec.graph. Optimizer steps (any torch Optimizer) are
    marked phase "optimizer" through torch's global optimizer hooks.

    profile: time the ops through torch.profiler ranges (their kernels' device time); default:
    when CUDA is available. Otherwise CPU ops are timed by the host clock and GPU ops by CUDA
    events."""

    def __init__(self, profile: bool | None = None):
        self.profile = torch.cuda.is_available() if profile is None else profile
        self.graph = OpGraph()
        self._vid = WeakIdKeyDictionary()
        self._next = 0
        self._node_lines: dict = {}
        self._in_optimizer = 0
        self._from_grads: set[int] = set()  # values made in the backward, or from such values
        self._hooks = []
        self._events: list = []
        self._prof = None

    # value ids
    def _value(self, t: torch.Tensor, fresh: bool = False) -> int:
        if fresh or t not in self._vid:
            obj = self.graph.values[self._vid[t]].obj if t in self._vid else self._next
            self._vid[t] = self._next
            self.graph.values[self._next] = Value(
                self._next,
                tuple(t.shape),
                str(t.dtype).replace("torch.", ""),
                t.numel() * t.element_size(),
                obj,
                t.device.type,
            )
            self._next += 1
        return self._vid[t]

    def _start_timer(self, on_gpu: bool):
        """Per-op timing without the profiler: CUDA events around an op on GPU tensors (no sync;
        read at __exit__; they include any host gap inside the pair, and the recorder's own
        overhead makes such gaps), perf_counter for anything else."""
        if on_gpu:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            return start
        return time.perf_counter()

    @staticmethod
    def _stop_timer(start):
        """The op's time in ms on the host clock, or a (start, end) pair of CUDA events."""
        if isinstance(start, torch.cuda.Event):
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            return start, end
        return (time.perf_counter() - start) * 1e3

    def _record(self, func, args, kwargs, out, timer=None) -> None:
        """timer: what _stop_timer returned (None: timed by a profiler range)."""
        name, arg_names, arg_writes, is_view = _schema_of(func)
        written = set()
        flat_args = []
        vals = list(args) + [kwargs.get(n) for n in arg_names[len(args) :]]
        for val, is_write in zip(vals, arg_writes):
            if isinstance(val, torch.Tensor):
                tensors = [val]
            elif isinstance(val, (list, tuple)):
                tensors = [x for x in val if isinstance(x, torch.Tensor)]
            else:
                continue
            flat_args += tensors
            if is_write:
                written.update(id(t) for t in tensors)
        inputs = [self._value(t) for t in flat_args]
        outs = [
            t
            for t in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(t, torch.Tensor)
        ]
        # in-place and out= writes make a new value of the same tensor object
        out_ids = [self._value(t, fresh=id(t) in written or not is_view) for t in outs]
        out_ids += [
            self._value(t, fresh=True)
            for t in flat_args
            if id(t) in written and all(t is not o for o in outs)
        ]
        c = cost.aten_op(name, flat_args, outs, is_view=is_view, written=written)
        node = torch._C._current_autograd_node()
        if node is not None:
            phase, where = "backward", self._node_lines.get(node, "?")
        else:
            phase = graph.phase_outside_autograd(bool(self._in_optimizer), inputs, self._from_grads)
            where = user_line()
        if phase in ("backward", "post-backward"):
            self._from_grads.update(out_ids)
        self.graph.ops.append(
            OpRecord(
                len(self.graph.ops), name, phase, inputs, out_ids, c.flops, c.bytes, where, is_view
            )
        )
        if isinstance(timer, tuple):
            self._events.append((len(self.graph.ops) - 1, *timer))
        elif timer is not None:
            self.graph.ops[-1].ms = timer

    def __enter__(self):
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        def pre(*_):
            self._in_optimizer += 1

        def post(*_):
            self._in_optimizer -= 1

        self._hooks = [
            register_optimizer_step_pre_hook(pre),
            register_optimizer_step_post_hook(post),
        ]
        if self.profile:
            # GPU op times come from the profiler's kernel records (CUPTI): CUDA events around
            # each op would also count the host time the recorder itself spends between ops
            try:
                self._prof = profiler.start(torch.cuda.is_available())
            except RuntimeError:  # another profiler is running: fall back to CUDA events
                self._prof = None
        self._modes = [_LineOfNode(self._node_lines), _AttentionCalls(self), _Dispatch(self)]
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc):
        for m in reversed(self._modes):
            m.__exit__(*exc)
        if self._prof is not None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            profiler.stop(self._prof)
            for e in self._prof.events():
                if e.name.startswith(_RANGE):
                    self.graph.ops[int(e.name[len(_RANGE) :])].ms = e.device_time_total / 1e3
            profiler.release(self._prof)
            self._prof = None
            profiler.collect()
        if self._events:
            torch.cuda.synchronize()
            for i, start, end in self._events:
                self.graph.ops[i].ms = start.elapsed_time(end)
            self._events.clear()
        for h in self._hooks:
            h.remove()
        self._node_lines.clear()  # the nodes keep autograd graphs alive
        return False
