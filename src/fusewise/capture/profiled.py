"""Light capture, the default (StepSchedule(capture="profiler"); "recorder" or
FUSEWISE_CAPTURE=recorder selects capture/opgraph.py's Python recorder): the op graph of a step
from ONE torch.profiler session (record_shapes, profile_memory, with_stack), not from Python
dispatch modes, whose per-op cost alone makes a launch-bound step 2.6x slower on the H200.

Read from the profiler's event tree (`kineto_results.experimental_event_tree()`, private; a
change fails naming the torch version) by capture/_event_graph.py:
- ops: the outermost aten ops the dispatcher ran below autograd, as the recorder sees them (an
  op that is only a CompositeImplicitAutograd decomposition, aten::linear, is replaced by the ops
  it ran, aten::t and aten::mm); the overload from the recorded arguments (_event_schemas.py);
- phases: in an autograd node's range "backward", attributed to the line of the forward op of
  the same sequence number; between the markers torch's optimizer hooks leave, "optimizer";
  otherwise by dataflow (graph.phase_outside_autograd);
- values: a tensor object is its TensorImpl address and storage allocation; a write (schema
  mutability) makes a new value; outputs are not recorded, so a value first read later is
  credited to the op that allocated its storage, or, for a view, to a view op of that storage; a
  tensor saved for the backward comes back as a new object with the layout it had: that value;
- lines: the caller line of the innermost call from user code; for operator slots, inferred
  from the frame's calls and the statement's AST (_event_lines.py);
- times: each op's kernels joined by correlation id (device time); on the CPU its host time.
Where it differs from the recorder's graph, and why: tests/test_capture_profiled.py
(_DIFFERENCES) and docs/DESIGN.md.
"""

from __future__ import annotations

import torch

from . import profiler
from ._event_graph import Builder
from ._trace import StepTrace, trace_from_events
from .graph import OpGraph


def _private(what: str, fn):
    try:
        return fn()
    except (AttributeError, ImportError, TypeError) as e:
        raise RuntimeError(
            f"capture='profiler' needs torch.profiler's {what}, which torch "
            f"{torch.__version__} does not offer as fusewise expects ({e}); use the Python "
            "recorder: FUSEWISE_CAPTURE=recorder (or capture='recorder')"
        ) from e


def start(cuda: bool) -> torch.profiler.profile:
    """A started session recording what the graph needs."""
    from torch.profiler import ProfilerActivity

    config = _private(
        "_ExperimentalConfig(capture_overload_names=True)",
        lambda: torch.profiler._ExperimentalConfig(capture_overload_names=True),
    )
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = torch.profiler.profile(
        activities=acts,
        record_shapes=True,
        profile_memory=True,
        with_stack=True,
        experimental_config=config,
    )
    return profiler.enter(prof)  # the garbage collector paused until profiler.stop(prof)


def graph_from_profile(prof, cuda: bool | None = None) -> OpGraph:
    """The op graph of the steps a stopped session saw (read before its results are freed).
    cuda: whether the session recorded CUDA kernels (default: CUDA is available)."""
    results = _private("kineto_results", lambda: prof.profiler.kineto_results)
    roots = _private("experimental_event_tree()", results.experimental_event_tree)
    b = Builder()
    _private(
        "event tree fields (extra_fields, correlation_id, caller, allocation_id)",
        lambda: (b.walk(sorted(roots, key=lambda r: r.start_time_ns)), b.attention_calls()),
    )
    cuda = torch.cuda.is_available() if cuda is None else cuda
    kernels = (
        [
            (e.linked_correlation_id(), e.duration_ns() / 1e3)
            for e in results.events()
            if e.device_type() == torch.autograd.DeviceType.CUDA and e.linked_correlation_id() > 0
        ]
        if cuda
        else []
    )
    graph = b.finish(kernels)
    graph_from_profile.unmatched = b.unmatched  # the last build's, for tests and debugging
    # the step's host/device trace, for replaying it without some ops (diagnose/_replay.py)
    graph_from_profile.trace = (
        _trace_or_none(results, b.corr, b.spans, b.walked) if cuda and kernels else None
    )
    return graph


def _trace_or_none(results, corr_ops, spans, walked) -> StepTrace | None:
    """The step's trace; None (the estimate then goes without it) when kineto's events lack
    what it reads."""
    try:
        return trace_from_events(results.events(), corr_ops, spans, walked)
    except (AttributeError, RuntimeError, TypeError):
        return None


class ProfiledCapture:
    """with ProfiledCapture() as cap: step()  ->  cap.graph, as with opgraph.Recorder."""

    def __init__(self, cuda: bool | None = None):
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self.graph: OpGraph | None = None
        self.trace: StepTrace | None = None  # on a GPU: the step's host/device trace
        self._prof = None
        self._hooks: list = []

    def __enter__(self):
        # optimizer steps marked as the recorder marks them: through torch's global hooks
        self._hooks = profiler.mark_optimizer_steps()
        self._prof = start(self.cuda)
        return self

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        if self.cuda:
            torch.cuda.synchronize()
        profiler.stop(self._prof)
        try:
            if exc[0] is None:
                self.graph = graph_from_profile(self._prof, self.cuda)
                self.trace = graph_from_profile.trace
        finally:
            # kineto's results freed now (profiler.py says why), without parsing them into
            # FunctionEvents first as profiler.release does: nothing here reads those, and with
            # stacks that parse is slow
            self._prof.profiler.kineto_results = None
            self._prof = None
            profiler.collect()
        return False
