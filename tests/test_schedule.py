"""The step schedule both drivers share (capture/schedule.py): what runs in which step, how many
steps it needs, and that an unfinished schedule leaves nothing open."""

import pytest
import torch

import fusewise
from fusewise.capture import profiler
from fusewise.capture.schedule import StepSchedule
from fusewise.capture.script import ScriptRun


def counting_step():
    calls = []
    w = torch.randn(64, 64)

    def step():
        calls.append(torch.is_grad_enabled())
        (w @ w).relu().sum()

    return step, calls


@pytest.mark.parametrize("steps, warmup", [(1, 0), (2, 1), (3, 2)])
def test_diagnose_calls_the_step_warmup_plus_twice_steps_plus_one_times(steps, warmup):
    step, calls = counting_step()
    r = fusewise.diagnose(step, steps=steps, warmup=warmup)
    assert len(calls) == warmup + 2 * steps + 1
    assert r.step.steps_measured == steps and r.step.ops_recorded > 0


def test_the_schedule_by_hand():
    s = StepSchedule(steps=2, warmup=1, cuda=False)
    assert s.needed == 6
    assert [s.phase(k) for k in range(1, 7)] == [
        "a warm-up step",
        "a timed step",
        "a timed step",
        "a profiled step",
        "a profiled step",
        "the recorded step",
    ]
    s.start()
    w = torch.randn(32, 32)
    done = []
    for _ in range(6):
        w @ w
        done.append(s.step_ended())
    assert done == [False] * 5 + [True] and s.complete
    obs = s.observation(size=("seq", 128.0))
    assert len(obs.times_ms) == 2 and obs.size == ("seq", 128.0) and obs.device == "cpu"
    assert any(op.name == "aten.mm.default" for op in obs.graph.ops)  # the recorded step
    assert obs.op_ms.get("aten::mm", 0) > 0  # the profiled steps
    with pytest.raises(RuntimeError, match="complete"):
        s.step_ended()


def test_an_unfinished_schedule_says_so_and_closes_what_it_opened():
    s = StepSchedule(steps=1, warmup=0, cuda=False)
    s.start()
    s.step_ended()  # the timed step: the profiler is now running
    with pytest.raises(RuntimeError, match="saw 1 of the 3 steps"):
        s.observation()
    s.close()
    prof = profiler.start(cuda=False)  # would raise if the schedule's profiler were still on
    profiler.stop(prof)
    profiler.release(prof)


def test_a_step_that_raises_in_the_recorded_step_leaves_no_profiler_or_recorder():
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 4:
            raise ValueError("step 4")
        torch.ones(3).sum()

    with pytest.raises(ValueError, match="step 4"):
        fusewise.diagnose(step, steps=1, warmup=1)
    r = fusewise.diagnose(lambda: torch.ones(3).sum(), steps=1, warmup=0)  # starts clean
    assert r.step.ops_recorded > 0


def test_the_script_runner_drives_the_same_schedule(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(
        "import torch, fusewise\n"
        "w = torch.randn(16, 16)\n"
        "for i in range(100):\n"
        "    w @ w\n"
        "    fusewise.step()\n"
    )
    run = ScriptRun(steps=2, warmup=1)
    run.run(str(script), [])
    assert run.ended == "stopped" and run.complete
    assert run.schedule.ends == run.schedule.needed == 6
    obs = run.schedule.observation()
    assert len(obs.times_ms) == 2 and any(op.name == "aten.mm.default" for op in obs.graph.ops)


def test_no_device_sync_between_profiled_steps(monkeypatch):
    """The schedule syncs where it must (timed steps, the profiler's stop, the recorded step)
    and never between profiled steps: a sync there would be profiled as the user's own host
    wait, and the GPU's idle after it reported as a host-sync finding."""
    synced_at = []
    s = StepSchedule(steps=3, warmup=1, cuda=False)
    monkeypatch.setattr(s, "_sync", lambda: synced_at.append(s.ends + 1))
    s.start()
    while not s.step_ended():
        pass
    # ends 1 (warm-up), 2-4 (timed), 5-7 (profiled), 8 (recorded)
    assert synced_at == [1, 2, 3, 4, 7, 8]


def test_a_session_collects_the_garbage_only_when_a_session_stopped_since(monkeypatch):
    """A full collection walks every live object (~100 ms beside a model): a session's start
    collects only when a session stopped since the last collection (its objects may be cyclic
    garbage), so the recorded step's session, started after the schedule collected the
    profiled steps' one, does not pay it inside the step."""
    import gc

    collections = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(1) or real(*a))
    profiler.collect()
    assert len(collections) == 1
    prof = profiler.start(cuda=False)
    assert len(collections) == 1  # nothing stopped since the collection: none at the start
    profiler.stop(prof)
    profiler.release(prof)
    second = profiler.start(cuda=False)
    assert len(collections) == 2  # the first session's objects: collected before this one
    profiler.stop(second)
    profiler.release(second)


def test_the_garbage_collector_is_paused_while_a_session_runs_and_restored_after():
    """A collection inside a session that frees another profile's kineto objects crashed the
    process (capture/profiler.py): sessions pause the collector, and every way out restores it."""
    import gc

    from fusewise.capture import profiled

    assert gc.isenabled()
    prof = profiler.start(cuda=False)
    assert not gc.isenabled()
    profiler.stop(prof)
    assert gc.isenabled()
    profiler.resume_gc(prof)  # a second resume (a session stopped twice) changes nothing
    assert gc.isenabled()
    profiler.release(prof)

    with profiled.ProfiledCapture(cuda=False) as cap:
        assert not gc.isenabled()
        torch.ones(3).sum()
    assert gc.isenabled() and cap.graph is not None

    calls = []

    def step():  # raises in the profiled steps: the schedule's close() stops the session
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("step 3")
        torch.ones(3).sum()

    with pytest.raises(ValueError, match="step 3"):
        fusewise.diagnose(step, steps=1, warmup=1)
    assert gc.isenabled()

    gc.disable()  # a user's own choice is kept
    try:
        profiler.stop(profiler.start(cuda=False))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_recorded_session_starts_after_optimizer_step_returns():
    """capture/_deferred.py: started from optimizer.step()'s post hook, the start waits for the
    step to return and runs at the script's next Python call, once; nothing is left installed."""
    import sys

    from fusewise.capture import _deferred

    events = []
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def hook(*_):
        if not events:
            events.append(("armed", _deferred.after_optimizer_step(lambda: events.append("start"))))

    def next_call():
        events.append("next call")

    handle = opt.register_step_post_hook(hook)
    try:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        events.append("step returned")
        torch.ones(2).sum()  # a C call from here: not a Python call, starts nothing
        events.append("after a C call")
        next_call()
    finally:
        handle.remove()
        _deferred.disarm()
    assert events == [("armed", True), "step returned", "after a C call", "start", "next call"]
    assert sys.getprofile() is None

    # outside optimizer.step(), or with another profile function installed: not deferred
    assert _deferred.after_optimizer_step(lambda: None) is False
    sys.setprofile(lambda *a: None)
    try:
        assert _deferred.after_optimizer_step(lambda: None) is False
    finally:
        sys.setprofile(None)


def test_an_aborted_run_leaves_no_profile_function(tmp_path):
    """The script ends in the step whose end armed the start: close() removes the waiting
    profile function (and the run says it ended too soon)."""
    import sys

    script = tmp_path / "short.py"
    script.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 4)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(3):\n"
        "    m(torch.randn(2, 4)).sum().backward()\n"
        "    opt.step()\n"
    )
    run = ScriptRun(steps=1, warmup=1)  # needs 4 steps; the 3rd ends the profiled ones
    run.run(str(script), [])
    assert run.ended == "finished" and not run.complete
    assert sys.getprofile() is None


class _Session:
    """What profiler.let_cupti_go reads of a torch.profiler.profile."""

    def __init__(self, *activities):
        self.activities = list(activities)


_CPU, _CUDA = torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA


@pytest.mark.parametrize(
    "cuda_version, activities, before, after",
    [
        ("13.0", (_CPU, _CUDA), None, "1"),
        ("12.6", (_CPU, _CUDA), None, "1"),
        ("12.4", (_CPU, _CUDA), None, None),  # teardown with CUDA graphs crashed before 12.6
        (None, (_CPU, _CUDA), None, None),  # a CPU or ROCm build
        ("13.0", (_CPU,), None, None),  # CUPTI is attached by CUDA sessions only
        ("13.0", (_CPU, _CUDA), "0", "0"),  # the user's choice, either way
        ("13.0", (_CPU, _CUDA), "1", "1"),
        ("13.0", (_CPU, _CUDA), "", ""),
    ],
)
def test_a_session_tracing_cuda_lets_cupti_go_unless_told_otherwise(
    monkeypatch, cuda_version, activities, before, after
):
    """kineto leaves CUPTI attached after a CUDA session, slowing every later CUDA call of the
    process, unless TEARDOWN_CUPTI=1 (capture/profiler.py)."""
    import os

    monkeypatch.setattr(torch.version, "cuda", cuda_version)
    monkeypatch.setenv("TEARDOWN_CUPTI", "placeholder" if before is None else before)
    if before is None:
        monkeypatch.delenv("TEARDOWN_CUPTI")
    set_here = profiler.let_cupti_go(_Session(*activities))
    assert os.environ.get("TEARDOWN_CUPTI") == after
    assert set_here == (before is None and after == "1")


def test_every_session_asks_for_cupti_to_go_once_started(monkeypatch):
    """The profiled steps' session and the recorded step's (capture/profiled.py) alike, after
    the start: a session that fails to start leaves the variable as it was."""
    from fusewise.capture import profiled

    asked = []
    monkeypatch.setattr(profiler, "let_cupti_go", lambda p: asked.append((p, p.profiler)))
    for start in (profiler.start, profiled.start):
        prof = start(cuda=False)
        profiler.stop(prof)
        profiler.release(prof)
        assert asked[-1][0] is prof and asked[-1][1] is not None  # started when asked
    assert len(asked) == 2

    class FailsToStart(_Session):
        def __enter__(self):
            raise RuntimeError("another profiler is running")

    with pytest.raises(RuntimeError, match="another profiler"):
        profiler.enter(FailsToStart(_CPU, _CUDA))
    assert len(asked) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUPTI is attached by CUDA sessions")
def test_a_diagnosis_on_the_gpu_asks_kineto_to_detach_cupti(monkeypatch):
    import os

    monkeypatch.setenv("TEARDOWN_CUPTI", "placeholder")  # absent during the test, restored after
    monkeypatch.delenv("TEARDOWN_CUPTI")
    x = torch.randn(64, 64, device="cuda")
    fusewise.diagnose(lambda: (x @ x).relu().sum(), steps=1, warmup=1)
    safe = profiler._cuda_version(torch.version.cuda) >= profiler.TEARDOWN_SAFE_FROM
    assert os.environ.get("TEARDOWN_CUPTI") == ("1" if safe else None)


@pytest.mark.parametrize(
    "teardown, activities, synced",
    [
        ("1", (_CPU, _CUDA), True),
        ("0", (_CPU, _CUDA), False),
        ("1", (_CPU,), False),
    ],
)
def test_a_stop_that_lets_cupti_go_syncs_the_device_at_once(
    monkeypatch, teardown, activities, synced
):
    """kineto finalizes CUPTI at the next CUDA runtime call after the stop: made at once, it
    cannot land inside the next session (the H200's recorded step lost its kernels' times)."""

    events = []

    class Stopping(_Session):
        def __exit__(self, *exc):
            events.append("stop")

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))
    monkeypatch.setenv("TEARDOWN_CUPTI", teardown)
    profiler.stop(Stopping(*activities))
    assert events == (["stop", "sync"] if synced else ["stop"])
