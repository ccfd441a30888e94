"""fusewise.graphs.capture, the decode example it serves, and the launch-overhead finding's
CUDA-graph prediction.

On the CPU: every argument check and error (the capture's own checks are functions of plain
data; CapturedStep's replay is driven by a stand-in graph), the decode example against a full
forward in float64, the prediction on synthetic timelines with known busy and idle times. On a
GPU (marked gpu): replay equals eager, new inputs are copied, a step that syncs or changes shape
is refused with its line, eager and graph decoding give the same tokens.
"""

import contextlib
import inspect
import os

import pytest
import torch

import fusewise
from fusewise import fixes, graphs
from fusewise.capture.timeline import Timeline
from fusewise.diagnose import _gaps
from fusewise.diagnose.timeline import find_gaps, graph_prediction
from fusewise.examples.decode import (
    DecodeConfig,
    decode_logits,
    generate,
    looping,
    make_decoder,
)

TORCH_DIR = os.path.dirname(torch.__file__)

# ---------------------------------------------------------------------------------------------
# capture(): checks that run before any CUDA work


def test_no_cuda_device_is_an_error_naming_it():
    with pytest.raises(graphs.CaptureError, match="CUDA graphs need a CUDA device"):
        graphs.check_inputs((torch.zeros(2),), cuda_available=False)
    with pytest.raises(graphs.CaptureError, match="input 0 is on cpu"):
        graphs.check_inputs((torch.zeros(2),), cuda_available=True)
    with pytest.raises(graphs.CaptureError, match="input 1 is a int, not a tensor"):  # first
        graphs.check_inputs((torch.zeros(2), 3), cuda_available=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only message")
def test_capture_on_a_cpu_machine_says_why_and_runs_nothing():
    calls = []
    with pytest.raises(graphs.CaptureError, match="CUDA graphs need a CUDA device"):
        graphs.capture(lambda x: calls.append(x) or x, torch.zeros(2))
    assert calls == []  # no silent eager run


def test_capture_arguments():
    with pytest.raises(graphs.CaptureError, match="step must be callable"):
        graphs.capture(3, torch.zeros(2))
    for bad in (0, -1, 1.5, "3"):
        with pytest.raises(graphs.CaptureError, match="warmup must be an int >= 1"):
            graphs.capture(lambda x: x, torch.zeros(2), warmup=bad)


def test_outputs_must_be_tensors_with_the_same_specs_as_in_warm_up():
    t = torch.zeros(2, 3)
    leaves, _, specs = graphs.output_specs({"a": t, "b": (t, t)}, "during warm-up")
    assert len(leaves) == 3 and specs[0] == graphs.TensorSpec((2, 3), torch.float32, t.device)
    for bad, name in ((1.5, "float"), ((t, None), "NoneType"), ([t, "x"], "str")):
        with pytest.raises(graphs.CaptureError, match=f"returned a {name}.*tensors only"):
            graphs.output_specs(bad, "during capture")
    warm = graphs.output_specs((t, t), "w")
    graphs.check_same_outputs(warm, graphs.output_specs((t.clone(), t + 1), "c"))  # values vary
    with pytest.raises(graphs.CaptureError, match=r"output 1 was \[2, 3\].*\[2, 4\].*torch.cat"):
        graphs.check_same_outputs(warm, graphs.output_specs((t, torch.zeros(2, 4)), "c"))
    with pytest.raises(graphs.CaptureError, match="output 0 .*float64"):
        graphs.check_same_outputs(warm, graphs.output_specs((t.double(), t), "c"))
    with pytest.raises(graphs.CaptureError, match="different structure"):
        graphs.check_same_outputs(warm, graphs.output_specs([t, t], "c"))


def _syncing_step():
    raise RuntimeError("CUDA error: operation not permitted when stream is capturing")


SYNC_LINE = inspect.getsourcelines(_syncing_step)[1] + 1


def _capture_failure():
    """What torch.cuda.graph raises when the step synced: capture_end's error, raised while the
    step's own error was being handled (its __context__)."""
    try:
        try:
            _syncing_step()
        except RuntimeError:
            raise RuntimeError(  # noqa: B904 (the implicit context is what torch leaves too)
                "CUDA error: operation failed due to a previous error during capture"
            )
    except RuntimeError as e:
        return e


def test_a_step_that_syncs_is_named_at_its_line():
    err = _capture_failure()
    assert graphs.is_sync_error(err) and graphs.is_capture_error(err)
    assert not graphs.is_sync_error(
        RuntimeError("operation failed due to a previous error during capture")
    )
    assert graphs.is_capture_error(RuntimeError("a stale reference ... invalidate the capture"))
    msg = str(graphs.sync_error(err))
    assert f"test_graphs.py:{SYNC_LINE}: raise RuntimeError" in msg
    assert "synchronises with the host" in msg and ".item()" in msg
    assert not graphs.is_capture_error(ValueError("shapes do not match"))


def test_the_users_line_skips_torch_frames():
    layer = torch.nn.Linear(2, 2)
    try:
        layer(torch.zeros(3))  # raises inside torch/nn: the line named is this one
    except RuntimeError as e:
        err = e
    line = inspect.currentframe().f_lineno - 3
    assert graphs.user_line(err).startswith(f"{__file__}:{line}: layer(torch.zeros(3))")


class StandInGraph:
    """What CapturedStep needs of a CUDAGraph: replay() runs the captured work (here: out = 2x)."""

    def __init__(self, x, out):
        self.x, self.out, self.replays = x, out, 0

    def replay(self):
        self.out.copy_(2 * self.x)
        self.replays += 1


def test_replay_copies_new_inputs_into_the_static_ones_and_returns_the_static_outputs():
    x, out = torch.zeros(4), torch.zeros(4)
    _, spec, _ = graphs.output_specs((out,), "capture")
    step = graphs.CapturedStep(StandInGraph(x, out), (x,), [out], spec, x.device)
    (y,) = step(torch.arange(4.0))
    assert y is out and torch.equal(x, torch.arange(4.0)) and torch.equal(y, 2 * torch.arange(4.0))
    (z,) = step(torch.ones(4))
    assert z is y and torch.equal(y, torch.full((4,), 2.0))  # overwritten by the next replay
    x.fill_(5.0)
    assert torch.equal(step()[0], torch.full((4,), 10.0))  # no inputs: replay on what x holds
    assert step.graph.replays == 3
    with pytest.raises(graphs.CaptureError, match=r"input 0 is \[5\].*captured with \[4\]"):
        step(torch.zeros(5))
    with pytest.raises(graphs.CaptureError, match="float64"):
        step(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(graphs.CaptureError, match="takes 1 inputs.*got 2"):
        step(torch.zeros(4), torch.zeros(4))
    with pytest.raises(graphs.CaptureError, match="is a list"):
        step([0.0] * 4)
    assert step.graph.replays == 3  # a refused call replays nothing


def test_the_fix_registry_names_capture():
    (fix,) = [f for f in fixes.registered("launch-overhead") if f.origin == "graphs"]
    assert fix.api == "fusewise.graphs.capture"
    assert fixes.text("launch-overhead").startswith("fusewise.graphs.capture(step, *inputs)")
    assert fusewise.graphs is graphs


class FakeCuda:
    """torch.cuda's graph API played on the CPU, to run capture()'s control flow: which calls
    run during warm-up and capture, what a failed capture leaves to clean up. A step calls
    `fake.sync()` where a real one would wait for the GPU: it raises as CUDA does, but only
    while capturing, and invalidates the capture; the graph's exit then raises as capture_end
    does (an error of the step's own leaves the capture valid)."""

    def __init__(self, monkeypatch):
        self.capturing, self.invalidated, self.log = False, False, []
        fake = self

        class Graph:
            def replay(self):
                fake.log.append("replay")

        class GraphContext:
            def __init__(self, graph, pool=None, stream=None):
                fake.log.append(("capture", tuple(pool), stream))

            def __enter__(self):
                fake.capturing, fake.invalidated = True, False

            def __exit__(self, kind, *_):
                fake.capturing = False
                if fake.invalidated:  # torch: capture_end raises, the stream stays current
                    raise RuntimeError(
                        "CUDA error: operation failed due to a previous error during capture"
                    )

        class Stream:
            def __init__(self, name="side stream"):
                self.name = name

            def wait_stream(self, other):
                pass

            def __repr__(self):
                return self.name

        caller = Stream("caller's stream")

        for name, value in dict(
            device=lambda d: contextlib.nullcontext(),
            stream=lambda s: contextlib.nullcontext(),
            Stream=Stream,
            synchronize=lambda *a: None,
            current_stream=lambda *a: caller,
            set_stream=lambda s: self.log.append(("set_stream", s)),
            graph_pool_handle=lambda: (0, 7),
            CUDAGraph=Graph,
            graph=GraphContext,
        ).items():
            monkeypatch.setattr(torch.cuda, name, value)
        for name in ("_cuda_endAllocateToPool", "_cuda_releasePool"):
            monkeypatch.setattr(
                torch._C, name, lambda i, p, name=name: self.log.append((name, i, p)), raising=False
            )
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        # the CPU plays the device: the checks compare the outputs' device with it
        monkeypatch.setattr(graphs, "check_inputs", lambda inputs: torch.device("cpu"))

    # sync(): where a real step would wait for the GPU; defined below in a frame of torch's


# CUDA's error reaches the step from inside torch (C++ or torch's Python): the fake's sync() is
# compiled as a file under torch's directory, which capture() skips when it names the step's line
_SYNC = """
def sync(fake):
    if fake.capturing:
        fake.invalidated = True
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

def default_stream(fake):
    if fake.capturing:
        fake.invalidated = True
        raise RuntimeError("a stale reference to the default stream will invalidate the capture")
"""
_ns: dict = {}
exec(compile(_SYNC, os.path.join(TORCH_DIR, "_fusewise_fake_sync.py"), "exec"), _ns)
FakeCuda.sync, FakeCuda.default_stream = _ns["sync"], _ns["default_stream"]


def test_capture_flow_warm_up_then_one_capture(monkeypatch):
    fake, calls = FakeCuda(monkeypatch), []

    def step(x):
        calls.append(fake.capturing)
        return {"y": x * 2}

    x = torch.ones(3)
    captured = graphs.capture(step, x, warmup=2)
    assert calls == [False, False, True]  # warm-up twice, then one call under capture
    assert fake.log[0][:2] == ("capture", (0, 7))  # a pool of its own
    assert repr(fake.log[0][2]) == "side stream"  # the warm-up's, not the caller's
    out = captured(torch.full((3,), 4.0))
    assert set(out) == {"y"} and out["y"] is captured.static_outputs[0]
    assert (
        torch.equal(captured.static_inputs[0], torch.full((3,), 4.0)) and fake.log[-1] == "replay"
    )


def test_capture_flow_a_syncing_step_is_refused_and_cleaned_up(monkeypatch):
    fake = FakeCuda(monkeypatch)

    def step(x):
        y = x + 1
        fake.sync()  # the step's sync
        return y

    line = inspect.getsourcelines(step)[1] + 2
    with pytest.raises(graphs.CaptureError, match="synchronises with the host") as e:
        graphs.capture(step, torch.ones(2))
    assert f"test_graphs.py:{line}: fake.sync()" in str(e.value)
    assert "operation not permitted" in str(e.value)  # what CUDA said
    assert fake.log[1:] == [
        ("set_stream", torch.cuda.current_stream()),  # the caller's stream is current again
        ("_cuda_endAllocateToPool", 0, (0, 7)),  # the allocator no longer counts the capture
        ("_cuda_releasePool", 0, (0, 7)),
    ]


def test_capture_flow_other_capture_errors_are_not_called_syncs(monkeypatch):
    fake = FakeCuda(monkeypatch)

    def step(x):
        fake.default_stream()
        return x

    with pytest.raises(graphs.CaptureError, match="capture failed at .*fake.default_stream") as e:
        graphs.capture(step, torch.ones(2))
    assert "synchronises" not in str(e.value) and "stale reference" in str(e.value)
    with pytest.raises(graphs.CaptureError, match="capturing the step failed: KeyError"):
        graphs.capture(lambda x: {}["k"] if fake.capturing else x, torch.ones(2))


def test_capture_flow_shape_change_and_non_tensor_output(monkeypatch):
    FakeCuda(monkeypatch)
    grows = [torch.zeros(0)]

    def step(x):
        grows[0] = torch.cat([grows[0], x])
        return grows[0]

    with pytest.raises(graphs.CaptureError, match=r"output 0 was \[3\].* during warm-up and \[4\]"):
        graphs.capture(step, torch.ones(1), warmup=3)
    with pytest.raises(graphs.CaptureError, match="returned a int .*during warm-up"):
        graphs.capture(lambda x: (x, 3), torch.ones(1))
    with pytest.raises(graphs.CaptureError, match="output 1 is on meta.*value it had at capture"):
        graphs.capture(lambda x: (x, torch.empty(1, device="meta")), torch.ones(1))


# ---------------------------------------------------------------------------------------------
# The decode example: a correct decoder (float64, CPU)

SMALL = DecodeConfig(vocab=97, d_model=32, heads=4, layers=2, max_len=16)


def test_cached_decode_equals_the_full_forward_at_every_position():
    model, cache, _ = make_decoder(SMALL, batch=3, dtype=torch.float64)
    idx = torch.randint(0, SMALL.vocab, (3, 11))
    with torch.no_grad():
        full = model(idx)
    cache.reset()
    for i in range(idx.shape[1]):
        logits = decode_logits(model, cache, idx[:, i])
        torch.testing.assert_close(logits, full[:, i], rtol=1e-12, atol=1e-12)
    assert cache.pos.item() == idx.shape[1]


def test_greedy_generation_equals_argmax_of_full_forwards():
    model, cache, step = make_decoder(SMALL, batch=2, dtype=torch.float64)
    prompt = torch.randint(0, SMALL.vocab, (2, 4))
    marks = []
    out = generate(step, cache, prompt, 9, on_step=lambda: marks.append(1))
    seq = prompt
    with torch.no_grad():
        for _ in range(9):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq[:, 4:])
    assert len(marks) == 4 + 9 - 1  # every decode step marked
    # stale cache entries past the position are masked: a second run gives the same tokens
    assert torch.equal(generate(step, cache, prompt, 9), out)
    with pytest.raises(ValueError, match="must fit the cache's 16 positions"):
        generate(step, cache, prompt, 13)


def test_the_timing_loop_wraps_before_the_cache_is_full():
    _, cache, step = make_decoder(SMALL, batch=1, dtype=torch.float64)
    one_step = looping(step, cache, torch.tensor([3]))
    for _ in range(3 * SMALL.max_len):
        assert one_step() is None
        assert 1 <= cache.pos.item() <= SMALL.max_len - 1  # never written past the cache


def test_diagnose_takes_tokens_per_step():
    _, cache, step = make_decoder(SMALL, batch=2)
    one_step = looping(step, cache, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="tokens_per_step must be a positive int"):
        fusewise.diagnose(one_step, steps=1, warmup=0, tokens_per_step=0)
    report = fusewise.diagnose(one_step, steps=2, warmup=1, tokens_per_step=2)
    assert report.step.steps_measured == 2  # CPU: the timeline analyzer says why it skipped


# ---------------------------------------------------------------------------------------------
# The launch-overhead finding's CUDA-graph prediction, on synthetic timelines (microseconds)


def decode_timeline(steps=4, kernels=50, dur=4.0, gap=16.0):
    """Per step: `kernels` kernels of `dur` us with `gap` us launch gaps between them, and the
    same gap before the next step's first kernel: busy kernels·dur per step."""
    device, t = [], 0.0
    for _ in range(steps * kernels):
        device.append((t, t + dur, "k"))
        t += dur + gap
    return Timeline((0.0, t - gap), device, steps=steps)


def test_busy_time_counts_overlapping_kernels_once():
    tl = Timeline((0.0, 100.0), [(0.0, 10.0, "a"), (5.0, 20.0, "b"), (8.0, 9.0, "c")])
    tl.device.append((50.0, 120.0, "d"))  # clipped at the window's end
    assert _gaps.busy_us(tl) == 20.0 + 50.0


def test_graph_prediction_from_busy_and_step_time():
    tl = decode_timeline()  # busy 200 us per step
    p = graph_prediction(tl, step_ms=1.5, tokens_per_step=4)
    assert p["launches_per_step"] == 50 and p["launches_per_token"] == 12.5
    assert p["gpu_busy_ms"] == pytest.approx(0.2) and p["gpu_busy_share"] == pytest.approx(
        0.2 / 1.5
    )
    assert p["graph_step_ms_predicted"] == pytest.approx(0.2)
    assert p["graph_gain_ms"] == pytest.approx(1.3) and p["graph_gain_from"] == "plain step"
    assert p["tokens_per_s_eager"] == pytest.approx(4 / 1.5e-3, abs=0.1)
    assert p["tokens_per_s_graph"] == pytest.approx(4 / 0.2e-3, abs=0.1)
    # tokens per step unknown: per step only, nothing per token invented
    p = graph_prediction(tl, step_ms=None)
    assert "launches_per_token" not in p and "tokens_per_s_eager" not in p
    window_ms = (50 * 20 * 4 - 16) / 1e3 / 4
    assert p["graph_gain_ms"] == pytest.approx(window_ms - 0.2, abs=1e-4)
    assert p["steps_per_s_graph"] == pytest.approx(5000.0)
    assert p["graph_gain_from"] == "profiled step"


def test_graph_prediction_keeps_what_a_graph_cannot_remove():
    p = graph_prediction(decode_timeline(), 1.5, 1, {"host-sync": 0.3, "launch-overhead": 0.9})
    assert p["graph_keeps_ms"] == pytest.approx(0.3)
    assert p["graph_step_ms_predicted"] == pytest.approx(0.5)
    assert p["graph_gain_ms"] == pytest.approx(1.0)


def test_the_launch_overhead_finding_carries_the_prediction():
    from test_timeline import graph_with_short_ops

    tl = decode_timeline()
    (f,) = find_gaps(tl, graph_with_short_ops(), step_ms=1.5, tokens_per_step=4)
    assert f.kind == "launch-overhead"
    # the launch gaps (49 of 16 us a step, + 3 between steps over 4 steps), scaled to the plain
    # step: the finding's own saving is unchanged by the prediction
    window_ms = (50 * 20 * 4 - 16) / 1e3 / 4
    assert f.est_saving_ms == pytest.approx((50 * 4 - 1) * 16 / 1e3 / 4 * min(1, 1.5 / window_ms))
    assert f.evidence["graph_gain_ms"] == pytest.approx(1.3)
    assert f.evidence["launches_per_token"] == 12.5
    assert "a CUDA graph would save 1.30 ms per step" in f.title
    assert "2,667 -> 20,000 tokens/s" in f.title
    assert "fusewise.graphs.capture" in f.fix
    (f,) = find_gaps(tl, graph_with_short_ops())
    assert "steps/s" in f.title and "launches_per_token" not in f.evidence


# ---------------------------------------------------------------------------------------------
# On a GPU


def _cuda():
    return torch.device("cuda")


@pytest.mark.gpu
def test_replay_equals_eager_and_takes_new_inputs():
    w = torch.randn(64, 64, device=_cuda())

    def step(x, y):
        h = torch.relu(x @ w) + y
        return h.sum(-1), {"h": h}

    x, y = torch.randn(8, 64, device=_cuda()), torch.randn(8, 64, device=_cuda())
    captured = graphs.capture(step, x, y)
    for _ in range(3):
        nx, ny = torch.randn_like(x), torch.randn_like(y)
        s, d = captured(nx, ny)
        es, ed = step(nx, ny)
        assert torch.equal(s, es) and torch.equal(d["h"], ed["h"])
        assert torch.equal(captured.static_inputs[0], nx)
    assert s is captured.static_outputs[0]
    with pytest.raises(graphs.CaptureError, match=r"input 0 is \[4, 64\]"):
        captured(torch.randn(4, 64, device=_cuda()), ny)


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["item", "cpu", "synchronize", "print"])
def test_a_step_that_syncs_is_refused_with_its_line(how, capsys):
    x = torch.randn(16, device=_cuda())

    def step(x):
        y = x * 2
        if how == "item":
            y = y + y.sum().item()
        elif how == "cpu":
            y = y + y.cpu().sum().to(y.device)
        elif how == "synchronize":
            torch.cuda.synchronize()
        else:
            print(y)
        return y

    with pytest.raises(graphs.CaptureError, match="synchronises with the host") as e:
        graphs.capture(step, x)
    assert "test_graphs.py" in str(e.value)
    torch.cuda.synchronize()  # the device is still usable after the refused capture
    assert torch.equal(graphs.capture(lambda x: x * 2, x)(x), x * 2)


@pytest.mark.gpu
def test_a_step_whose_shapes_change_is_refused():
    cache = [torch.zeros(1, 4, device=_cuda())]

    def step(x):  # a cache that grows with torch.cat: a new shape every call
        cache[0] = torch.cat([cache[0], x[None]])
        return cache[0].sum(0), cache[0]

    with pytest.raises(graphs.CaptureError, match="output 1 was .* during warm-up"):
        graphs.capture(step, torch.ones(4, device=_cuda()))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_and_graph_decoding_give_the_same_tokens(dtype):
    c = DecodeConfig(vocab=512, d_model=64, heads=4, layers=2, max_len=64)
    _, cache, step = make_decoder(c, batch=3, device="cuda", dtype=dtype)
    prompt = torch.randint(0, c.vocab, (3, 5), device="cuda")
    eager = generate(step, cache, prompt, 40)
    captured = graphs.capture(step, prompt[:, 0].clone())
    assert torch.equal(generate(captured, cache, prompt, 40), eager)


def test_the_example_script_decodes_on_the_cpu_and_refuses_a_graph_there():
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "decode.py"
    main = runpy.run_path(str(script))["main"]
    args = ["--tokens", "6", "--prompt", "3", "--layers", "1", "--d-model", "32", "--device", "cpu"]
    out = main(args)
    assert out.shape == (1, 6) and torch.equal(main(args), out)  # greedy: the same tokens again
    if not torch.cuda.is_available():
        with pytest.raises(graphs.CaptureError, match="CUDA graphs need a CUDA device"):
            main(args + ["--mode", "graph"])


@pytest.mark.gpu
def test_a_gpu_decode_loop_gets_the_graph_prediction():
    c = DecodeConfig(vocab=512, d_model=64, heads=4, layers=2, max_len=64)
    _, cache, step = make_decoder(c, batch=2, device="cuda")
    one_step = looping(step, cache, torch.zeros(2, dtype=torch.long, device="cuda"))
    report = fusewise.diagnose(one_step, steps=5, warmup=3, tokens_per_step=2)
    (f,) = [f for f in report.findings if f.kind == "launch-overhead"]
    e = f.evidence
    assert e["launches_per_token"] == e["launches_per_step"] / 2 and e["launches_per_step"] > 20
    assert 0 < e["gpu_busy_share"] < 1 and 0 < e["graph_gain_ms"] < report.step.median_ms
    assert e["tokens_per_s_graph"] > e["tokens_per_s_eager"]
    assert "fusewise.graphs.capture" in f.fix and "decode.py" in f.where
