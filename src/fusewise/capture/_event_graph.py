"""The op graph from a torch.profiler event tree (capture/profiled.py says what is read from it,
how, and where it differs from the Python recorder's graph)."""

from __future__ import annotations

import torch

from .. import cost
from . import graph as graph_mod
from ._event_lines import caller_line, frame_shown, resolve_slots
from ._event_schemas import MULTI_VIEWS, decomposed, meta, overload
from .graph import OpGraph, OpRecord, Value, attention_call
from .profiler import OPT_BEGIN, OPT_END, optimizer_ranges


class Builder:
    def __init__(self):
        from torch._C._profiler import RecordScope, _EventType

        self.T, self.scope = _EventType, RecordScope
        self.graph = OpGraph()
        self.key_vid: dict[tuple, int] = {}  # (impl, allocation) -> current value id
        self.alloc_op: dict[int, int] = {}  # allocation id -> op index that allocated it
        self.views_of: dict[int, list[int]] = {}  # allocation id -> view ops reading it
        self.seq_line: dict[int, list] = {}  # forward sequence number -> [line]
        self.from_grads: set[int] = set()
        self.meta: dict[int, list] = {}  # op index -> (input tensors, output tensors)
        self.written: dict[int, set[int]] = {}
        self.corr: dict[int, list[int]] = {}  # correlation id -> op indices
        # correlation ids of every op event the walk reached, graph op or not (an autograd
        # Function's own event launches kernels but is no graph op): a kernel linked to none of
        # them was launched by an op the walk never saw (capture/_trace.py, unwalked_kernels)
        self.walked: set[int] = set()
        self.optimizer_marks: list[tuple[int, int, bool]] = []  # (time, thread, is a begin)
        self.optimizer_ranges: list[tuple[int, int, int]] = []  # (thread, start, end)
        self.unmatched: dict[str, int] = {}  # op names no schema matched (counted, walked into)
        self._shown: dict[str, str | None] = {}  # frame name -> how its file is shown
        self.alloc_time: dict[int, int] = {}  # allocation id -> when (ns)
        self.kept: dict[int, dict[int, int]] = {}  # op -> allocations it made and kept: bytes
        self.credited: set[int] = set()  # allocations some value read later was made in
        self._pending: list[tuple] = []  # user frames whose slot ops' lines are still open
        self.where_cells: list[list] = []  # per op: its [line], filled once frames resolve
        self.sdpa: list[tuple] = []  # (event, line cell) of each scaled_dot_product_attention
        self.starts: list[tuple[int, int]] = []  # (thread, start ns) of each op
        self.spans: list[tuple[int, int]] = []  # (start, end) ns of each op
        self.wrapped_numbers: set[int] = set()
        self.meta_of: dict[int, torch.Tensor] = {}  # value id -> a meta tensor of its layout
        self.by_layout: dict[tuple, tuple] = {}  # (allocation, sizes, strides) -> tensor key
        self._inherited = None  # the line cell of the decomposed op being walked
        self._frames: dict[int, list] = {}  # user frame being walked -> its calls and slot ops

    # --- values --------------------------------------------------------------------------
    def _value(self, t, *, consumer: int, backward: bool = False) -> int:
        key = (t.impl_ptr, t.allocation_id)
        vid = self.key_vid.get(key)
        if vid is not None:
            return vid
        layout = (t.allocation_id, tuple(t.sizes), tuple(t.strides))
        if backward and layout in self.by_layout:
            # a tensor saved for the backward comes back as a new tensor object on the same
            # storage, with the same layout: the value it saved
            self.key_vid[key] = vid = self.key_vid[self.by_layout[layout]]
            return vid
        self.by_layout[layout] = key
        vid = len(self.graph.values)
        nbytes = int(torch.Size(t.sizes).numel()) * torch.empty((), dtype=t.dtype).element_size()
        obj = vid
        self.graph.values[vid] = Value(
            vid, tuple(t.sizes), str(t.dtype).replace("torch.", ""), nbytes, obj, t.device.type
        )
        self.key_vid[key] = vid
        producer = self._producer(t.allocation_id, consumer)
        self.meta_of[vid] = meta(t)
        if producer is not None:
            self.credited.add(t.allocation_id)
            self.graph.ops[producer].outputs.append(vid)
            self.meta[producer][1].append(self.meta_of[vid])
        return vid

    def _producer(self, alloc: int, consumer: int) -> int | None:
        """The op that made a tensor first read by op `consumer`: the one that allocated its
        storage, unless a later view op read that storage (then the view made it)."""
        owner = self.alloc_op.get(alloc)
        views = [i for i in self.views_of.get(alloc, ()) if i < consumer]
        unused = [i for i in views if not self.graph.ops[i].outputs]
        if unused:
            return unused[-1]
        several = [i for i in views if self.graph.ops[i].name.startswith(MULTI_VIEWS)]
        if several:  # split, chunk, unbind: one storage, several outputs
            return several[-1]
        if owner is not None and owner < consumer and not self.graph.ops[owner].is_view:
            return owner
        return views[-1] if views else None

    # --- walk ----------------------------------------------------------------------------
    def walk(self, roots) -> None:
        """Every thread's tree (a GPU backward runs on a thread of its own), its visible ops
        then taken in the order they started."""
        found: list = []
        for r in roots:
            self._visit(r, [], "forward", None, found)
        self.optimizer_ranges = optimizer_ranges(self.optimizer_marks)
        for e, op, line, phase, seq in sorted(found, key=lambda f: f[0].start_time_ns):
            if phase != "backward" and any(
                tid == e.start_tid and t0 <= e.start_time_ns <= t1
                for tid, t0, t1 in self.optimizer_ranges
            ):
                phase = "optimizer"
            self._op(e, op, line, phase, seq)
        for frame, items in self._pending:  # now that every allocation's time is known
            resolve_slots(_frame_name(frame), self._user_frame(frame), items, self._made_in)
        for op, cell in zip(self.graph.ops, self.where_cells):
            op.where = cell[0] or "?"

    def _user_frame(self, ev) -> str | None:
        """How the file of a Python function's frame is shown, None when not user code."""
        if ev.tag != self.T.PyCall:
            return None
        return frame_shown(_frame_name(ev), self._shown)

    def _cell(self, e, pystack) -> list:
        """[line] of an op; for an op run by a user frame itself (an operator slot: x - y, no
        call of its own) the line is decided once the frame's calls are known."""
        frame = pystack[-1] if pystack else None
        items = self._frames.get(id(frame)) if frame is not None else None
        if items is None:
            return [caller_line(pystack)]
        cell = [None]
        ins = set()
        for i in e.extra_fields.inputs:
            for t in i if isinstance(i, list) else [i]:
                if hasattr(t, "sizes"):
                    ins.add(t.allocation_id)
        items.append(("slot", cell, ins, (e.start_time_ns, e.end_time_ns)))
        return cell

    def _made_in(self, allocations, ranges) -> bool:
        """Whether one of the allocations was made during one of the latest ranges."""
        times = [self.alloc_time.get(a, -1) for a in allocations]
        return any(t0 <= t <= t1 for t0, t1 in ranges[-8:] for t in times)

    def _visit(self, e, pystack, phase, seq, _events):
        T = self.T
        if e.tag in (T.PyCall, T.PyCCall):
            parent = self._frames.get(id(pystack[-1])) if pystack else None
            if parent is not None:  # a call made from a user frame
                line = e.extra_fields.caller.line_number
                parent.append(("call", line, (e.start_time_ns, e.end_time_ns)))
            if self._user_frame(e) is not None:
                self._frames[id(e)] = []
            pystack.append(e)  # one list for the walk: copies per call cost O(depth)
            for c in e.children:
                self._visit(c, pystack, phase, seq, _events)
            pystack.pop()
            items = self._frames.pop(id(e), None)
            if items and any(it[0] == "slot" for it in items):
                self._pending.append((e, items))
            return
        if e.tag == T.Allocation:
            self.alloc_time[e.extra_fields.allocation_id] = e.start_time_ns
        if e.tag == T.Allocation and 0 < e.extra_fields.alloc_size <= 16:
            # a Python number made a 0-dim tensor outside any op (`x * 2`): the dispatcher
            # hands the op a number, which the recorder does not count as a tensor read
            self.wrapped_numbers.add(e.extra_fields.allocation_id)
        if e.tag != T.TorchOp:
            # an op is an op wherever the tree puts it: on the H200 a kineto event named
            # Optimizer.step#..., placed in the host's tree by time mid-optimizer, held up to 452
            # of the demo step's ops (benchmarks/capture_loss_probe.py); not walked into, they
            # and their kernels' times were lost to the graph
            for c in e.children:
                self._visit(c, pystack, phase, seq, _events)
            return
        self.walked.add(e.correlation_id)
        ex = e.extra_fields
        name = e.name
        if ex.scope == self.scope.BACKWARD_FUNCTION or name.startswith("autograd::engine"):
            phase, seq = "backward", ex.sequence_number
        elif name in (OPT_BEGIN, OPT_END):
            self.optimizer_marks.append((e.start_time_ns, e.start_tid, name == OPT_BEGIN))
        if "::" not in name or name.startswith(("autograd::", "profiler::", "torch::autograd::")):
            for c in e.children:
                self._visit(c, pystack, phase, seq, _events)
            return
        found = overload(name, ex.inputs)
        if found is None:  # no schema fits the recorded arguments: the ops it ran stand in
            self.unmatched[name] = self.unmatched.get(name, 0) + 1
        cell = self._inherited or self._cell(e, pystack)
        if name == "aten::scaled_dot_product_attention":
            self.sdpa.append((e, cell))
        if found is None or decomposed(found[0]):
            if phase == "forward" and ex.sequence_number >= 0:
                self.seq_line.setdefault(ex.sequence_number, cell)
            outer, self._inherited = self._inherited, cell  # the ops it ran are on its line
            for c in e.children:
                self._visit(c, pystack, phase, seq, _events)
            self._inherited = outer
            return
        _events.append((e, found, cell, phase, seq))  # its line cell is set or will be

    def _op(self, e, found, line, phase, seq) -> None:
        name, schema = found
        ex = e.extra_fields
        index = len(self.graph.ops)
        is_view = bool(schema.returns) and all(
            r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
        )
        is_view = is_view or name.startswith("aten._unsafe_view")
        op = OpRecord(index, name, phase, [], [], 0.0, 0.0, "?", is_view)
        self.graph.ops.append(op)
        self.starts.append((e.start_tid, e.start_time_ns))
        self.spans.append((e.start_time_ns, e.end_time_ns))
        self.meta[index] = ([], [])
        written: set[int] = set()
        tensors, writes = [], []
        for arg, a in zip(ex.inputs, schema.arguments):
            ts = arg if isinstance(arg, list) else [arg]
            ts = [
                t
                for t in ts
                if hasattr(t, "sizes")
                and not (not t.sizes and t.allocation_id in self.wrapped_numbers)
            ]
            is_write = a.alias_info is not None and a.alias_info.is_write
            tensors += ts
            writes += [is_write] * len(ts)
        for t, w in zip(tensors, writes):
            vid = self._value(t, consumer=index, backward=phase == "backward")
            op.inputs.append(vid)
            m = self.meta_of[vid]  # one tensor per value: an op reading it twice reads it once
            self.meta[index][0].append(m)
            if w:
                written.add(id(m))
                self._bump(t, index, m)
            if is_view:
                self.views_of.setdefault(t.allocation_id, []).append(index)
        self.written[index] = written
        self._claim_allocations(e, index)
        if phase == "backward":  # the line of the forward op that made the autograd node
            self.where_cells.append(self.seq_line.get(seq, ["?"]))
        else:
            self.where_cells.append(line)
            if ex.sequence_number >= 0 and phase == "forward":
                self.seq_line.setdefault(ex.sequence_number, line)
        self._times(e, index)

    def _bump(self, t, index: int, m) -> None:
        """An in-place write: a new value of the same tensor object, made by this op."""
        key = (t.impl_ptr, t.allocation_id)
        old = self.graph.values[self.key_vid[key]]
        vid = len(self.graph.values)
        self.graph.values[vid] = Value(vid, old.shape, old.dtype, old.nbytes, old.obj, old.device)
        self.meta_of[vid] = m
        self.key_vid[key] = vid
        self.graph.ops[index].outputs.append(vid)
        self.meta[index][1].append(m)

    def _claim_allocations(self, e, index: int) -> None:
        """Storage the op allocated; what it did not also free is an output (read later, or
        never: then only its allocation says it was written)."""
        made, freed = {}, set()
        stack = list(e.children)
        while stack:
            c = stack.pop()
            if c.tag == self.T.Allocation:
                a, size = c.extra_fields.allocation_id, c.extra_fields.alloc_size
                if size > 0:
                    self.alloc_op[a] = index
                    self.alloc_time[a] = c.start_time_ns
                    made[a] = size
                else:
                    freed.add(a)
            stack.extend(c.children)
        self.kept[index] = {a: size for a, size in made.items() if a not in freed}

    def _times(self, e, index: int) -> None:
        """Host time of the op (a CPU step's time); its device kernels are joined in finish():
        a kernel's linked correlation id is that of the innermost op that launched it, this op
        or one it ran (torch.autograd.profiler joins them the same way)."""
        self.graph.ops[index].ms = e.duration_time_ns / 1e6
        stack = [e]
        while stack:
            c = stack.pop()
            if c.tag == self.T.TorchOp and c.correlation_id:
                self.corr.setdefault(c.correlation_id, []).append(index)
            stack.extend(c.children)

    def attention_calls(self) -> None:
        """graph.attention as the recorder notes it: per call its line, the ops it ran, the
        fused op that ran it (None: torch's math path) and its arguments."""
        for e, cell in self.sdpa:
            inside = [
                i
                for i, (tid, t) in enumerate(self.starts)
                if tid == e.start_tid and e.start_time_ns <= t <= e.end_time_ns
            ]
            ops = self.graph.ops[inside[0] : inside[-1] + 1] if inside else []
            args = list(e.extra_fields.inputs) + [None] * 8
            q, mask = args[0], args[3]
            self.graph.attention.append(
                attention_call(
                    cell[0] or "?",
                    ops,
                    *([inside[0], inside[-1] + 1] if inside else [0, 0]),
                    q,
                    mask if hasattr(mask, "sizes") else None,
                    args[4],
                    args[5],
                )
            )

    def finish(self, kernels) -> OpGraph:
        """Costs from the shapes of what each op read and what was read of its outputs (the
        profiler records no outputs: an output never read counts by its allocation's size),
        the phases by dataflow, and device times from the kernels."""
        g = self.graph
        for op in g.ops:
            ins, outs = self.meta[op.index]
            c = cost.aten_op(op.name, ins, outs, is_view=op.is_view, written=self.written[op.index])
            unread = sum(
                b for a, b in self.kept.get(op.index, {}).items() if a not in self.credited
            )
            op.flops, op.bytes = c.flops, c.bytes + (0 if op.is_view else unread)
            if op.phase != "backward":  # by dataflow, now that outputs are known
                op.phase = graph_mod.phase_outside_autograd(
                    op.phase == "optimizer", op.inputs, self.from_grads
                )
            if op.phase in ("backward", "post-backward"):
                self.from_grads.update(op.outputs)
        if kernels:
            for op in g.ops:
                op.ms = 0.0
            for corr, us in kernels:
                for i in self.corr.get(corr, ())[:1]:
                    g.ops[i].ms += us / 1e3
        return g


def _frame_name(ev) -> str:
    """The profiler's "path(LINE): function" of a Python frame. torch 2.13 now and then hands
    back a name that is not UTF-8 (seen on its own torch/profiler/_cupti_monitor.py frame, whose
    function name came back as garbage bytes); the callsite's file and line still decode, and
    they are all that decides whether the frame is user code."""
    try:
        return ev.name
    except UnicodeDecodeError:
        site = ev.extra_fields.callsite
        return f"{site.file_name}({site.line_number}): ?"
