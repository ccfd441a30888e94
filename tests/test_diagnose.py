"""The diagnosis: recorder semantics, and the analyzers on golden op graphs of the example GPT
step (tests/data, made by tests/data/make_golden.py), exact; plus diagnose() end to end."""

import json
import pathlib

import pytest
import torch

import fusewise
from fusewise.capture.opgraph import OpGraph, Recorder
from fusewise.diagnose.chains import find_chains
from fusewise.diagnose.quadratic import find_quadratic
from fusewise.examples import gpt
from fusewise.hardware import Ceilings
from fusewise.report import Skipped

DATA = pathlib.Path(__file__).parent / "data"
H200 = Ceilings("NVIDIA H200 (PERF.md)", "cuda", 4274.0, 686.0, "test")


def golden(variant: str) -> OpGraph:
    return OpGraph.from_json((DATA / f"gpt_{variant}_step.json").read_text())


def line_of(text: str) -> str:
    """path:line of the example's source line containing text (as the recorder names it)."""
    path = pathlib.Path(gpt.__file__)
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if text in line:
            return f"src/fusewise/examples/gpt.py:{i}"
    raise AssertionError(text)


NORM = "return (x - mean) / torch.sqrt"
SCORES = "scores = q @ k.transpose"
LOGITS = "logits = self.head(x)"
OPT_STEP = "opt.step()"


def by_key(findings):
    return {(f.pattern, f.where, f.evidence.get("phase")): f for f in findings}


def test_naive_step_has_the_four_classic_chains():
    found = by_key(find_chains(golden("naive"), H200))
    assert ("norm", line_of(NORM), "forward") in found
    assert ("attention", line_of(SCORES), "forward") in found
    assert ("cross-entropy", line_of(LOGITS), "forward") in found
    assert ("optimizer", line_of(OPT_STEP), "optimizer") in found
    # backward chains are attributed to the forward line that made them
    assert ("norm", line_of(NORM), "backward") in found
    assert ("attention", line_of(SCORES), "backward") in found


def test_optimizer_chain_minimum_is_the_adamw_byte_model():
    g = golden("naive")
    f = by_key(find_chains(g, H200))[("optimizer", line_of(OPT_STEP), "optimizer")]
    n_params = sum(p.numel() for p in gpt.GPT(gpt.GPTConfig()).parameters())
    n_tensors = len(list(gpt.GPT(gpt.GPTConfig()).parameters()))
    assert f.evidence["chains"] == n_tensors  # one per parameter of the for-loop
    # read param, grad, m, v; write param, m, v: 28 B per fp32 parameter (the step counter's
    # add_ is a one-op update of its own, not part of the chain)
    assert f.evidence["bytes_fused_minimum"] == 28 * n_params
    assert f.bytes_avoidable == f.evidence["bytes_as_written"] - f.evidence["bytes_fused_minimum"]
    assert f.est_saving_ms == pytest.approx(f.bytes_avoidable / 4274e9 * 1e3)


def test_clean_step_has_none_of_them():
    findings = find_chains(golden("clean"), H200)
    patterns = {f.pattern for f in findings}
    assert not patterns & {"norm", "attention", "optimizer"}, [f.title for f in findings]
    # F.cross_entropy is log_softmax + nll_loss in eager torch: still a chain, and a smaller one
    # than the naive step's (no fp32 copy of the logits there on a GPU; same on this fp32 CPU run)
    assert find_quadratic(golden("clean")) == []


def test_quadratic_scores_are_named_with_their_line():
    (q,) = find_quadratic(golden("naive"))
    c = gpt.GPTConfig()
    assert q.where == line_of(SCORES)
    assert q.evidence["shape"][-2:] == [c.seq, c.seq]
    assert q.evidence["bytes"] == c.batch * c.heads * c.seq * c.seq * 4


def test_findings_are_ranked_by_saving():
    savings = [f.est_saving_ms for f in find_chains(golden("naive"), H200)]
    assert savings == sorted(savings, reverse=True) and savings[0] > 0


# --- the recorder -----------------------------------------------------------------------------


def test_views_move_nothing_and_in_place_writes_make_new_values():
    x = torch.randn(8, 16, requires_grad=True)
    with Recorder() as rec:
        y = x.view(16, 8)  # line A
        z = y * 2
        z.add_(1)
        z.sum().backward()
    ops = rec.graph.ops
    view = next(o for o in ops if o.name == "aten.view.default" and o.phase == "forward")
    assert view.is_view and view.bytes == 0
    add_ = next(o for o in ops if o.name == "aten.add_.Tensor")
    mul = next(o for o in ops if o.name == "aten.mul.Tensor" and o.phase == "forward")
    assert add_.inputs == mul.outputs and add_.outputs != mul.outputs  # read the mul, wrote anew
    assert add_.bytes == 2 * 8 * 16 * 4  # read and write the tensor
    here = pathlib.Path(__file__).name
    assert view.where.endswith(f"{here}:{view.where.split(':')[-1]}") and here in mul.where
    backward_lines = {
        o.where for o in ops if o.phase == "backward" and not o.name.endswith("detach.default")
    }
    assert backward_lines <= {mul.where, view.where, next(o for o in ops if "sum" in o.name).where}


def test_optimizer_ops_are_marked():
    p = torch.nn.Parameter(torch.randn(10))
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = torch.randn(10)
    with Recorder() as rec:
        opt.step()
    assert rec.graph.ops and all(o.phase == "optimizer" for o in rec.graph.ops)


def test_profiled_recording_of_an_optimizer_step():
    """The recorder names a profiler range per op by its index. torch.optim wraps step() in a
    record_function while a profiler runs, whose markers are ops too: they once took an index
    and no op, and the last one pointed past the list (IndexError on every GPU diagnosis)."""
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(4, 8)

    def step():
        opt.zero_grad()
        with torch.profiler.record_function("user range"):
            model(x).square().mean().backward()
        opt.step()

    step()
    names = {}
    for profile in (False, True):
        with Recorder(profile=profile) as rec:
            step()
        names[profile] = [o.name for o in rec.graph.ops]
    assert names[True] == names[False] and "aten.mm.default" in names[True]
    assert not any(n.startswith("profiler.") for n in names[True])


def test_graph_json_round_trip():
    g = golden("clean")
    again = OpGraph.from_json(g.to_json())
    assert again.ops == g.ops and again.values == g.values


# --- diagnose() end to end ----------------------------------------------------------------------


def test_diagnose_end_to_end_restores_state(tmp_path):
    step, model, opt = gpt.make_step(variant="naive")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = fusewise.diagnose(step, steps=2, warmup=1, restore=[model, opt], ceilings=H200)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # the diagnosis left the model as it found it
    assert opt.state == {} or all(len(s) == 0 for s in opt.state.values())
    d = json.loads(report.to_json())
    assert set(d) == {"fusewise_version", "device", "step", "top", "findings", "skipped"}
    # the fields of the first schema, then the per-dtype matmul rates added later
    assert set(d["device"]) == {"name", "type", "bandwidth_GBps", "matmul_TFLOPs", "ridge"} | {
        "matmul_dtype",
        "matmul_by_dtype",
    }
    assert d["step"]["median_ms"] > 0 and d["step"]["steps_measured"] == 2
    assert {
        "name",
        "ms_per_step",
        "share",
        "flops",
        "bytes",
        "intensity",
        "bound",
        "pct_of_ceiling",
        "dtype",
        "ceiling",
    } == set(d["top"][0])
    for f in d["findings"]:
        assert set(f) == {
            "kind",
            "pattern",
            "title",
            "where",
            "est_saving_ms",
            "bytes_avoidable",
            "evidence",
            "fix",
        }
    kinds = {(f["kind"], f["pattern"]) for f in d["findings"]}
    assert {
        ("fusion-chain", "norm"),
        ("fusion-chain", "attention"),
        ("fusion-chain", "optimizer"),
        ("quadratic-memory", None),
    } <= kinds
    assert any(
        s["analysis"] == "memory-scaling" for s in d["skipped"]
    )  # said, not silently skipped
    text = str(report)
    assert "norm" in text and "gpt.py" in text
    html_path = tmp_path / "r.html"
    report.save_html(html_path)
    page = html_path.read_text()
    assert "<svg" in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")


def _dropout_run(device, optimizer="torch"):
    """A model with dropout, a step that draws from torch's, Python's and NumPy's generators and
    accumulates gradients (no zero_grad: a diagnosis must also put the gradients back)."""
    import random

    import numpy as np

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 4)
    ).to(device)
    if optimizer == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    else:  # a bf16 model with fp32 masters: restoring the model must not undo them
        model = model.to(torch.bfloat16)
        opt = fusewise.optim.AdamW(model.parameters(), lr=1e-2, master_weights=True)

    def step():
        x = torch.randn(8, 16, device=device) * (1 + random.random() + float(np.random.rand()))
        model(x.to(next(model.parameters()).dtype)).float().square().mean().backward()
        opt.step()

    return model, opt, step


@pytest.mark.parametrize("optimizer", ["torch", "fusewise-masters"])
@pytest.mark.parametrize("order", ["model-first", "optimizer-first"])
def test_restore_leaves_the_run_bit_identical(optimizer, order, device):
    """After diagnose(restore=...), the next step equals the step of a run never diagnosed: the
    parameters, the optimizer state (fp32 masters too, whichever is restored first), the
    gradients and every random generator are put back."""
    results = []
    for diagnosed in (False, True):
        model, opt, step = _dropout_run(device, optimizer)
        step()
        if diagnosed:
            restore = [model, opt] if order == "model-first" else [opt, model]
            fusewise.diagnose(step, steps=1, warmup=1, restore=restore, ceilings=H200)
        step()
        step()
        results.append(
            [
                t.detach().clone()
                for t in [*model.parameters(), *(p.grad for p in model.parameters())]
            ]
        )
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_restore_of_a_single_object_and_bad_objects():
    model, opt, step = _dropout_run("cpu")
    step()
    before = [p.detach().clone() for p in model.parameters()]
    fusewise.diagnose(step, steps=1, warmup=0, restore=model, ceilings=H200)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(TypeError, match="restore= takes .* state_dict.*got Tensor"):
        fusewise.diagnose(step, steps=1, warmup=0, restore=[model, torch.ones(1)], ceilings=H200)


def test_measuring_ceilings_leaves_the_random_state_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEWISE_CACHE_DIR", str(tmp_path))  # a cold cache: it measures
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    fusewise.hardware.ceilings("cpu")
    assert torch.equal(torch.rand(4), expected)


def test_an_op_returning_its_own_input_is_not_a_view_cycle():
    """lift_fresh (torch.tensor(...) inside a step) returns the tensor it was given; the view
    resolution once looped forever on it (seen with fusewise.optim.AdamW's pointer tables)."""
    with Recorder() as rec:
        t = torch.tensor([1.0, 2.0, 3.0])
        (t * 2).sum()
    lift = [o for o in rec.graph.ops if o.name.startswith("aten.lift_fresh")]
    assert lift and lift[0].inputs == lift[0].outputs
    assert find_chains(rec.graph, H200) == []  # returns, rather than hanging


def test_square_activation_is_not_attention():
    """[B, S, d] with d == S made by an add is an activation, not scores (a false positive the
    H200 demo showed with d_model = seq = 1024)."""
    x = torch.randn(2, 512, 512)
    with Recorder() as rec:
        (x + 1.0).sum()
    assert find_quadratic(rec.graph) == []
    q, k = torch.randn(2, 4, 512, 16), torch.randn(2, 4, 512, 16)
    with Recorder() as rec:
        torch.softmax(q @ k.transpose(-2, -1), -1)
    (f,) = find_quadratic(rec.graph)
    assert f.evidence["shape"][-2:] == [512, 512] and "test_diagnose.py" in f.where


def test_a_billion_parameter_step_records_on_meta_tensors():
    """The recorder's cost grows with the number of ops, not bytes: a 1.1e9-parameter step on
    the meta device (no data) records fully and its chains are found (timing:
    benchmarks/capture_overhead.py)."""
    c = gpt.GPTConfig(vocab=128256, seq=2048, d_model=2048, heads=16, layers=2, batch=4)
    with torch.device("meta"):
        model = gpt.GPT(c, "naive")
    assert sum(p.numel() for p in model.parameters()) > 0.6e9
    idx = torch.zeros(c.batch, c.seq, dtype=torch.long, device="meta")
    with Recorder() as rec:
        model(idx, idx).backward()
    found = {f.pattern for f in find_chains(rec.graph, H200)}
    assert {"attention", "norm", "cross-entropy"} <= found


def observed(graph, op_ms=None, times_ms=(1.0,), captured_ms=2.0, device="cuda", **kw):
    """An Observation of a recorded (golden) graph, with the timings given."""
    from fusewise.capture.observation import Observation

    return Observation(graph, list(times_ms), dict(op_ms or {}), captured_ms, device, **kw)


def test_a_failing_analyzer_is_reported_not_fatal(monkeypatch):
    from fusewise.diagnose import chains, driver, registry

    def broken(obs, ceil):
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(registry._ANALYZERS, "fusion-chains", broken)
    assert registry.analyzers()["fusion-chains"] is broken
    r = driver.analyze(observed(golden("naive")), H200)
    assert Skipped("fusion-chains", "failed: ZeroDivisionError: boom") in r.skipped
    assert any(f.kind == "quadratic-memory" for f in r.findings)  # the others still ran
    monkeypatch.undo()
    assert registry.analyzers()["fusion-chains"] is chains.analyze


def test_every_analyzer_is_registered_and_says_why_it_did_not_run():
    """The driver runs every analyzer module of diagnose/ (the driver lists none); one that cannot
    run on the observation says why under skipped."""
    from fusewise.diagnose import driver, registry

    names = set(registry.analyzers())
    assert names >= {
        "fusion-chains",
        "quadratic-intermediates",
        "attention-fallback",
        "host-syncs",
        "timeline gaps (launch overhead, data loading, idle host)",
        "memory-scaling",
    }
    r = driver.analyze(observed(golden("naive")), H200)
    assert {s.analysis for s in r.skipped} == {
        "memory-scaling",
        "timeline gaps (launch overhead, data loading, idle host)",
    }
    assert "--sizes" in next(s.reason for s in r.skipped if s.analysis == "memory-scaling")


def test_the_cross_entropy_fix_names_fusewise_op():
    """Fix texts come from the registry the op families fill: the loss chain of the golden
    graph points at fusewise.ops.linear_cross_entropy, the norm at fusewise's norms."""
    found = by_key(find_chains(golden("naive"), H200))
    assert (
        "fusewise.ops.linear_cross_entropy"
        in found[("cross-entropy", line_of(LOGITS), "forward")].fix
    )
    assert "fusewise.ops.layer_norm" in found[("norm", line_of(NORM), "forward")].fix
    assert "fusewise.optim.AdamW" in found[("optimizer", line_of(OPT_STEP), "optimizer")].fix


def _matmul_alone_ms(a, times: int = 5) -> float:
    """The fastest of a few timings of a @ a: under xdist another test's kernels can share the
    GPU for one of them (the H200 at 94fb466: one timing of 3.84 ms where the matmul takes 1.36)."""
    best = float("inf")
    for _ in range(times):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ a
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


@pytest.mark.gpu
def test_gpu_op_times_are_device_time_not_host_gaps():
    """Under the recorder the host is slow (it records every op), so the GPU idles between ops.
    Each op's time must still be its kernels' device time: a tiny elementwise op takes a few
    microseconds, and a large matmul about what it takes alone."""
    from fusewise.capture.opgraph import Recorder

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    small = torch.randn(1024, device="cuda")
    for _ in range(3):
        a @ a
    alone = _matmul_alone_ms(a)
    with Recorder() as rec:
        for _ in range(50):
            small = small * 1.0001 + 1e-3
        a @ a
    ops = rec.graph.ops
    tiny = sorted(op.ms for op in ops if op.name.startswith(("aten.mul", "aten.add")))
    assert len(tiny) == 100 and 0 < tiny[50] < 0.02, tiny[50]
    mm = next(op.ms for op in ops if op.name.startswith("aten.mm"))
    assert 0.7 * alone < mm < 1.3 * alone, (mm, alone)


def test_attention_fallback_is_found_only_on_the_math_path():
    """SDPA runs a fused kernel on the CPU too; forcing torch's math backend makes it write the
    [B, H, S, S] scores out, which is the finding (with the mask named as a likely cause)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fusewise.diagnose.attention import find_attention_fallback

    q = torch.randn(2, 4, 256, 16)
    mask = torch.ones(256, 256, dtype=torch.bool).tril()
    ceil = Ceilings("test", "cpu", 100.0, 1.0, "test")
    with Recorder() as fused:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert fused.graph.attention[0]["kernel"] is not None
    assert find_attention_fallback(fused.graph, ceil) == []
    with sdpa_kernel(SDPBackend.MATH), Recorder() as rec:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    (f,) = find_attention_fallback(rec.graph, ceil)
    assert f.kind == "attention-fallback" and "test_diagnose.py" in f.where
    assert "attn_mask" in f.title and f.evidence["mask"] == "bool [256, 256]"
    scores = 2 * 4 * 256 * 256 * 4
    assert f.bytes_avoidable > 2 * scores  # scores and probabilities at least written and read
    assert OpGraph.from_json(rec.graph.to_json()).attention == rec.graph.attention


@pytest.mark.gpu
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_diagnose_a_gpt_training_step_on_the_gpu(autocast):
    """The README's first example on a real GPU step: it once raised IndexError on the H200."""
    step, model, opt = gpt.make_step(variant="naive", device="cuda")

    def run():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            return step()

    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = fusewise.diagnose(run, steps=3, warmup=1, restore=[model, opt])
    d = json.loads(report.to_json())
    assert not [s for s in d["skipped"] if s["reason"].startswith("failed")], d["skipped"]
    patterns = {f["pattern"] for f in d["findings"] if f["kind"] == "fusion-chain"}
    assert {"norm", "attention", "optimizer"} <= patterns
    assert d["step"]["ops_recorded"] > 0 and d["top"][0]["ms_per_step"] > 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_restore_none_a_dict_and_the_gradient_tensors_kept(device):
    """restore=None is no restore; a dict is refused with what to pass; the gradients are put
    back into the tensors the parameters had (references to them, e.g. DDP's bucket views,
    stay good)."""
    model, opt, step = _dropout_run(device)
    step()
    fusewise.diagnose(step, steps=1, warmup=0, restore=None, ceilings=H200)
    with pytest.raises(TypeError, match=r"not a dict: pass list\(your_dict.values\(\)\)"):
        fusewise.diagnose(step, steps=1, warmup=0, restore={"m": model}, ceilings=H200)
    grads = [(p.grad, p.grad.clone()) for p in model.parameters()]
    fusewise.diagnose(step, steps=1, warmup=0, restore=[model, opt], ceilings=H200)
    for p, (g, values) in zip(model.parameters(), grads):
        assert p.grad is g and torch.equal(g, values)


@pytest.mark.parametrize(
    "call, causes, not_said",
    [
        (
            dict(
                dtype="float32",
                mask=None,
                is_causal=True,
                shape=[2, 4, 64, 64],
                dropout=0.0,
                device="cuda",
            ),
            [],
            ["float32", "is_causal=True"],
        ),
        (
            dict(
                dtype="float32",
                mask="bool [64, 64]",
                is_causal=True,
                shape=[2, 4, 64, 64],
                dropout=0.2,
                device="cuda",
            ),
            ["attn_mask"],
            ["is_causal=True", "dropout"],
        ),
        (
            dict(
                dtype="float64",
                mask=None,
                is_causal=False,
                shape=[2, 4, 64, 60],
                dropout=0.2,
                device="cpu",
            ),
            ["float64", "head dim 60", "dropout_p=0.2"],
            [],
        ),
    ],
    ids=["fp32-causal-gpu", "mask-gpu", "fp64-cpu-dropout"],
)
def test_attention_fallback_names_only_causes_that_hold(call, causes, not_said):
    """fp32 is no cause (the GPU's memory-efficient kernel and the CPU's flash kernel take it);
    is_causal=True is not suggested to a call that has it; dropout is a cause on the CPU only."""
    from fusewise.diagnose.attention import _suspects

    said = " ".join(c + " " + r for c, r in _suspects(call))
    assert all(c in said for c in causes) and not any(n in said for n in not_said), said


def test_an_analyzer_module_that_cannot_load_or_registers_nothing_is_said(monkeypatch):
    """A module of diagnose/ that fails to import, or that defines an analyzer but forgot
    @analyzer, is listed under skipped; the analyzers that load still run."""
    import pkgutil
    import sys
    import types

    from fusewise.diagnose import driver, registry

    real = pkgutil.iter_modules

    def with_two_more(path):
        yield from real(path)
        for name in ("broken_dep", "forgot_decorator"):
            yield pkgutil.ModuleInfo(None, name, False)

    forgot = types.ModuleType("fusewise.diagnose.forgot_decorator")
    forgot.analyze = lambda obs, ceil: []
    monkeypatch.setattr(registry.pkgutil, "iter_modules", with_two_more)
    monkeypatch.setitem(sys.modules, "fusewise.diagnose.forgot_decorator", forgot)
    r = driver.analyze(observed(golden("naive")), H200)
    said = {s.analysis: s.reason for s in r.skipped}
    assert said["module broken_dep"].startswith("failed to import: ModuleNotFoundError")
    assert "registers no analyzer" in said["module forgot_decorator"]
    assert any(f.kind == "fusion-chain" for f in r.findings)


def test_findings_of_equal_saving_come_in_a_fixed_order():
    from fusewise.diagnose import driver

    runs = [driver.analyze(observed(golden("naive"), device="cpu"), H200) for _ in range(2)]
    keys = [[(f.est_saving_ms, f.kind, f.where) for f in r.findings] for r in runs]
    assert keys[0] == keys[1]
    ties = [k[:2] for k in keys[0]]
    assert ties == sorted(ties, key=lambda t: (-t[0], t[1]))


def test_memory_scaling_says_why_when_a_size_allocated_nothing():
    from fusewise.diagnose import driver

    empty = observed(OpGraph(), size=("seq", 64.0))
    obs = observed(golden("naive"), size=("seq", 128.0), other=empty)
    r = driver.analyze(obs, H200)
    said = {s.analysis: s.reason for s in r.skipped}
    assert "allocated nothing" in said["memory-scaling"] and r.step.memory_scaling is None


def test_memory_scaling_of_a_cpu_step_on_a_gpu_machine_fits_the_graphs_alone():
    """A CPU step measures no device peak (0 at both sizes, as on the H200): the fit comes from
    the op graphs, with no measured exponent (it once divided by zero there)."""
    from fusewise.diagnose import scaling

    a, b = golden("naive"), golden("naive")
    fit = scaling.fit(a, 64.0, b, 128.0, name="seq", measured=(0, 0))
    assert fit is not None and "measured_exponent" not in fit
    fit = scaling.fit(a, 64.0, b, 128.0, name="seq", measured=(1e6, 2e6))
    assert fit["measured_exponent"] == 1.0
