"""Capture a step in a CUDA graph and replay it: the fix of a `launch-overhead` finding.

    step = fusewise.graphs.capture(decode_step, token)   # warm-up, then capture
    next_token = step(token)    # copies token into the static input, replays, returns the output

A graph replays the step's kernels with one host call, so the per-kernel launch gaps of an eager
step go away while the kernels stay: a launch-bound step (decode at small batch) then takes about
its GPU busy time. What torch asks of a captured step (the CUDA-graphs notes and
torch.cuda.make_graphed_callables), and what capture() does or checks:

- warm-up first, on a side stream: lazy initialisation (cuBLAS handles and workspaces, autotuning)
  must not land in the capture; the capture then runs on that same stream (a library's handle is
  cached per stream, so a fresh capture stream would create one mid-capture);
- no host synchronisation inside the step (.item(), .cpu(), print(tensor), `if tensor:`,
  torch.cuda.synchronize()): capture fails, and the error says which line of the step did it;
- fixed shapes and addresses: inputs are copied into the static tensors captured with the graph,
  the outputs are the static tensors the graph writes (overwritten by the next replay), and a
  step that returns other shapes or structure during capture than during warm-up is an error;
- tensors only, all on one CUDA device, in and out. A Python value the step reads (an int
  position, a flag) is baked into the graph at capture: hold it in a device tensor updated in
  place. Never a silent eager fallback: anything that cannot be captured is an error saying why.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree

from . import fixes

fixes.register(
    "launch-overhead",
    None,
    "fusewise.graphs.capture(step, *inputs): warm up, capture the step in a CUDA graph and "
    "replay it (inputs copied into static tensors, no host sync inside the step)",
    api="fusewise.graphs.capture",
    origin="graphs",
)

_TORCH_DIR = os.path.dirname(torch.__file__)
_THIS_FILE = os.path.abspath(__file__)

# Words of the errors CUDA and torch raise when a captured stream meets a host sync
# (cudaErrorStreamCaptureUnsupported: "operation not permitted when stream is capturing";
# torch's check on a copy to pageable CPU memory during capture). Any other error that speaks of
# capture (an invalidated capture, a default-stream dependency) is a capture error of another
# kind; capture_end's own "previous error during capture" sits on top of the step's error.
_SYNC_WORDS = (
    "stream is capturing",
    "not permitted when stream",
    "streamcaptureunsupported",
    "during cuda graph capture",
)


class CaptureError(RuntimeError):
    """The step cannot be captured (or replayed) as a CUDA graph; the message says why."""


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        return cls(tuple(t.shape), t.dtype, t.device)

    def __str__(self) -> str:
        return f"{list(self.shape)} {self.dtype} on {self.device}"


def check_inputs(static_inputs: tuple, cuda_available: bool | None = None) -> torch.device:
    """The one CUDA device of the static inputs; CaptureError when they are not all tensors on
    it, or there is no CUDA device."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        raise CaptureError(
            "CUDA graphs need a CUDA device: torch.cuda.is_available() is False (torch "
            f"{torch.__version__}); run the step eagerly, or on a GPU"
        )
    for i, x in enumerate(static_inputs):
        if not isinstance(x, torch.Tensor):
            raise CaptureError(
                f"input {i} is a {type(x).__name__}, not a tensor: the static inputs of a CUDA "
                "graph are tensors (hold other values in the step's closure)"
            )
    devices = set()
    for i, x in enumerate(static_inputs):
        if x.device.type != "cuda":
            raise CaptureError(
                f"CUDA graphs need a CUDA device: input {i} is on {x.device}; move it (and the "
                "model) to the GPU before capturing"
            )
        devices.add(x.device)
    if len(devices) > 1:
        raise CaptureError(f"the inputs are on several devices ({sorted(map(str, devices))})")
    return devices.pop() if devices else torch.device("cuda", torch.cuda.current_device())


def output_specs(outputs, when: str) -> tuple[list[torch.Tensor], object, list[TensorSpec]]:
    """(tensors, tree spec, their specs) of a step's return value; CaptureError when a leaf is
    not a tensor (a graph can only return what it writes on the device)."""
    leaves, spec = pytree.tree_flatten(outputs)
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            raise CaptureError(
                f"the step returned a {type(leaf).__name__} (output {i}) {when}: a captured step "
                "returns tensors only (a Python number or None would be computed once at capture "
                "and never again; return it as a tensor)"
            )
    return leaves, spec, [TensorSpec.of(t) for t in leaves]


def check_same_outputs(warm, captured) -> None:
    """The capture must return what the warm-up returned: same structure, shapes, dtypes and
    devices (a step whose shapes change between calls cannot be one graph)."""
    (_, spec_w, specs_w), (_, spec_c, specs_c) = warm, captured
    if spec_w != spec_c:
        raise CaptureError(
            "the step returned a different structure during capture than during warm-up "
            f"({spec_c} against {spec_w}): a graph replays one fixed step"
        )
    for i, (w, c) in enumerate(zip(specs_w, specs_c)):
        if w != c:
            raise CaptureError(
                f"output {i} was {w} during warm-up and {c} during capture: the step allocates "
                "differently from call to call (a shape that grows, e.g. a KV cache built with "
                "torch.cat); preallocate fixed-size buffers and write into them in place"
            )


def check_on_device(specs: list[TensorSpec], device: torch.device) -> None:
    """Every output on the graph's device: a tensor elsewhere (a CPU result) was computed once,
    at capture, and a replay would return that stale value."""
    for i, spec in enumerate(specs):
        if spec.device.type != device.type:
            raise CaptureError(
                f"output {i} is on {spec.device}: a graph replays only the work on {device}, so "
                "this output would keep the value it had at capture; return device tensors"
            )


def user_line(error: BaseException) -> str | None:
    """`path:line: code` of the innermost frame outside torch and this module, over the error
    and the errors it was raised from (capture_end's error hides the step's own)."""
    chain = _chain(error)
    for e in reversed(chain):  # the first error raised: where the step synced
        frames = traceback.extract_tb(e.__traceback__)
        for f in reversed(frames):
            path = os.path.abspath(f.filename)
            if path.startswith(_TORCH_DIR) or path == _THIS_FILE:
                continue
            return f"{f.filename}:{f.lineno}: {(f.line or '').strip()}"
    return None


def _chain(error: BaseException) -> list[BaseException]:
    out, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        out.append(error)
        error = error.__cause__ or error.__context__
    return out


def is_sync_error(error: BaseException) -> bool:
    """The error (or one it was raised from) is CUDA refusing a host sync during capture."""
    return any(w in str(e).lower() for e in _chain(error) for w in _SYNC_WORDS)


def is_capture_error(error: BaseException) -> bool:
    """The error (or one it was raised from) speaks of stream capture at all."""
    return any("captur" in str(e).lower() for e in _chain(error))


def sync_error(error: BaseException, cleanup: str = "") -> CaptureError:
    """The error to raise when capture failed because the step talks to the host."""
    line = user_line(error)
    where = f" at {line}" if line else ""
    return CaptureError(
        f"the step synchronises with the host during CUDA graph capture{where}: .item(), "
        ".cpu(), .tolist(), print(tensor), `if tensor:` and torch.cuda.synchronize() wait for the "
        "GPU, which a graph cannot do; keep the value on the device (torch.where instead of "
        f"`if`) or move it outside the step. CUDA said: {_first_line(_root(error))}{cleanup}"
    )


def release_failed_capture(device: torch.device, pool) -> str:
    """Hand a failed capture's memory pool back to the caching allocator; "" when done, else
    words to add to the error.

    CUDAGraph.capture_end() tells the allocator the capture is over only after CUDA ended it
    successfully, and the graph's destructor releases the pool only after a successful capture.
    After a failed one the allocator would still route the capture stream's allocations to the
    pool and count the capture as underway, and the next torch.cuda.empty_cache() (the next
    capture calls it) would stop on an internal assert: the process could not capture again."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        torch._C._cuda_endAllocateToPool(index, tuple(pool))
    except Exception:  # not underway: capture_end got as far as telling the allocator
        return ""
    try:
        torch._C._cuda_releasePool(index, tuple(pool))
    except Exception as e:
        return (
            f" (and its memory pool could not be released: {_first_line(e)}; a further "
            "capture in this process may fail)"
        )
    return ""


def _root(error: BaseException) -> BaseException:
    """The first error of a chain (what the step ran into, under capture_end's error)."""
    return _chain(error)[-1]


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def check_call(args: tuple, static_inputs: list[torch.Tensor]) -> None:
    """Replay arguments: none (replay on what the static inputs hold) or one tensor per static
    input, each of its spec."""
    if args and len(args) != len(static_inputs):
        raise CaptureError(
            f"the captured step takes {len(static_inputs)} inputs (or none, to replay on what the "
            f"static inputs hold), got {len(args)}"
        )
    for i, (x, s) in enumerate(zip(args, static_inputs)):
        if not isinstance(x, torch.Tensor):
            raise CaptureError(f"input {i} is a {type(x).__name__}, not a tensor")
        want, got = TensorSpec.of(s), TensorSpec.of(x)
        if want != got:
            raise CaptureError(
                f"input {i} is {got}; the graph was captured with {want}: a graph replays fixed "
                "shapes, dtypes and devices (capture one graph per shape)"
            )


class CapturedStep:
    """A step captured in a CUDA graph. Calling it copies the new inputs into the static ones,
    replays the graph and returns the static outputs: the same tensors every call, overwritten
    by the next replay (clone what you keep)."""

    def __init__(self, graph, static_inputs, outputs, spec, device):
        self.graph = graph
        self.static_inputs = list(static_inputs)
        self.static_outputs = list(outputs)
        self._spec, self.device = spec, device

    def __call__(self, *inputs):
        check_call(inputs, self.static_inputs)
        with torch.no_grad():
            for x, s in zip(inputs, self.static_inputs):
                if x is not s:
                    s.copy_(x, non_blocking=True)
        return self.replay()

    def replay(self):
        """Replay on what the static inputs hold now; the static outputs, as the step returned
        them."""
        self.graph.replay()
        return pytree.tree_unflatten(self.static_outputs, self._spec)


def capture(step, *static_inputs, warmup: int = 3, pool=None) -> CapturedStep:
    """Warm `step(*static_inputs)` up `warmup` times on a side stream, capture one call in a
    torch.cuda.CUDAGraph (a private memory pool, or `pool` to share one) and return the
    CapturedStep that replays it.

    The warm-up runs the step for real: a step that updates state in place (a KV cache, a
    position counter) has advanced it `warmup` times when capture() returns; reset it before
    replaying. The capture itself runs nothing on the GPU: the outputs hold their values only
    after the first replay."""
    if not callable(step):
        raise CaptureError(f"step must be callable, got a {type(step).__name__}")
    if not isinstance(warmup, int) or warmup < 1:
        raise CaptureError(
            f"warmup must be an int >= 1, got {warmup!r}: capture needs at least one eager call "
            "first (lazy initialisation, e.g. cuBLAS's workspace, must not land in the graph)"
        )
    device = check_inputs(static_inputs)
    with torch.cuda.device(device):
        stream = torch.cuda.Stream()
        torch.cuda.synchronize()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                warm = output_specs(step(*static_inputs), "during warm-up")
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        warm = (None, warm[1], warm[2])  # keep the specs, not the warm-up's tensors
        # our own handle when none is given (a fresh id: still a private pool), so a failed
        # capture's pool can be handed back (release_failed_capture)
        pool = torch.cuda.graph_pool_handle() if pool is None else pool
        graph = torch.cuda.CUDAGraph()
        previous = torch.cuda.current_stream()
        try:
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                outputs = step(*static_inputs)
        except Exception as e:
            # torch.cuda.graph's __exit__ restores the caller's stream only after capture_end
            # returns; when that raises, the capture stream would stay current
            torch.cuda.set_stream(previous)
            cleanup = release_failed_capture(device, pool)
            if isinstance(e, CaptureError):
                raise
            if is_sync_error(e):
                raise sync_error(e, cleanup) from e
            if is_capture_error(e):
                line = user_line(e)
                raise CaptureError(
                    f"CUDA graph capture failed{f' at {line}' if line else ''}: "
                    f"{_first_line(_root(e))}. A captured step must not wait for the GPU "
                    "(.item(), .cpu(), print(tensor), torch.cuda.synchronize()), touch the default "
                    "stream or tensors whose autograd graph was built there, or query events"
                    f"{cleanup}"
                ) from e
            raise CaptureError(
                f"capturing the step failed: {type(e).__name__}: {_first_line(e)}{cleanup}"
            ) from e
        captured = output_specs(outputs, "during capture")
        check_same_outputs(warm, captured)
        check_on_device(captured[2], device)
    return CapturedStep(graph, static_inputs, captured[0], captured[1], device)
