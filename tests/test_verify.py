"""fusewise verify: interleaved measurement, the comparison's verdict and interval, the loss check,
and the script runs (unpatched and patched, from the same seeds, patched where step 1 ends)."""

import json
import textwrap

import pytest
import torch

from fusewise.cli import main
from fusewise.verify import (
    Samples,
    VerifyError,
    check_losses,
    compare,
    interleave_steps,
    verify_script,
)
from fusewise.verify.measure import FASTER, SAME, SLOWER, round_orders
from fusewise.verify.script import model_roots


def samples(name, rounds):
    s = Samples(name)
    for ms in rounds:
        s.add_round(list(ms))
    return s


def test_a_clear_difference_is_claimed_with_its_interval():
    before = samples("before", [[10.0, 10.2, 9.9, 10.1]] * 4)
    after = samples("after", [[7.0, 7.1, 6.9, 7.2]] * 4)
    c = compare(before, after)
    assert c.verdict == FASTER
    assert c.low_ms <= c.saving_ms <= c.high_ms and c.low_ms > 2.5 and c.high_ms < 3.5
    assert c.speedup == pytest.approx(before.median_ms / after.median_ms)
    assert "saves 3.00 ms" in c.describe() or "saves" in c.describe()
    assert compare(after, before).verdict == SLOWER


def test_noise_gives_no_measurable_difference():
    # the same distribution in both: whatever the medians say, no sign is claimed
    gen = torch.Generator().manual_seed(3)
    a = samples("a", [(10 + torch.randn(8, generator=gen)).tolist() for _ in range(4)])
    b = samples("b", [(10 + torch.randn(8, generator=gen)).tolist() for _ in range(4)])
    c = compare(a, b)
    assert c.verdict == SAME and c.low_ms < 0 < c.high_ms
    assert "no measurable difference" in c.describe()


def test_rounds_that_disagree_on_the_sign_are_no_difference():
    # pooled, "before" looks slower; round by round the sign flips: drift, not the fix
    before = samples("before", [[20.0] * 5, [5.0] * 5])
    after = samples("after", [[10.0] * 5, [8.0] * 5])
    c = compare(before, after)
    assert c.rounds_agreeing == 1 and c.rounds == 2
    assert c.verdict == SAME


def test_round_orders_alternate():
    assert round_orders(["a", "b", "c"], 3) == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]


def test_interleave_steps_alternates_the_variants_and_keeps_losses():
    calls = []

    def make(name, loss):
        def step():
            calls.append(name)
            return torch.tensor(loss)

        return step

    out = interleave_steps(
        {"a": make("a", 1.0), "b": make("b", 2.0)}, warmup=1, per_round=2, rounds=3
    )
    assert calls == list("ab" + "aabb" + "bbaa" + "aabb")  # warm-up, then a b / b a / a b
    assert len(out["a"].ms) == 6 and len(out["a"].round_ms) == 3
    assert out["a"].losses == [[1.0] * 7] and out["b"].losses == [[2.0] * 7]  # warm-up too
    with pytest.raises(ValueError, match="rounds >= 2"):
        interleave_steps({"a": make("a", 1.0)}, rounds=1)


def test_check_losses():
    ok = check_losses([2.0, 1.5, 1.2], [2.0, 1.5001, 1.2], rtol=1e-3, noise=[2.0, 1.5, 1.2])
    assert ok.equal and ok.steps == 3 and ok.noise_rel_diff == 0
    assert "equal over 3 values" in ok.describe()
    bad = check_losses([2.0, 1.5], [2.0, 1.9], rtol=1e-2)
    assert not bad.equal and "NOT equal" in bad.describe()
    assert not check_losses([], [], rtol=1e-2).equal


def test_model_roots_are_the_outermost_owners():
    inner = torch.nn.Linear(4, 4)
    outer = torch.nn.Sequential(inner, torch.nn.LayerNorm(4))
    other = torch.nn.Linear(3, 3)  # not in the optimizer
    opt = torch.optim.SGD(outer.parameters(), lr=0.1)
    roots = model_roots([opt])
    assert any(r is outer for r in roots)
    assert not any(r is inner or r is other for r in roots)


TRAIN = """
import sys, torch
torch.nn.Module  # noqa
model = torch.nn.Sequential(
    torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(32, 64)
for i in range(int(sys.argv[1])):
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
"""


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_verify_script_runs_both_variants_from_the_same_seeds(tmp_path):
    script = write(tmp_path, "train.py", TRAIN)
    out = verify_script(script, ["40"], warmup=2, steps=3, rounds=2, diagnose=False)
    assert set(out.variants) == {"unpatched", "patched"}
    for s in out.variants.values():
        assert len(s.ms) == 6 and len(s.round_ms) == 2 and len(s.losses) == 2
        assert len(s.losses[0]) == 5  # every .backward() of the 2 + 3 steps
    # the same seeds: the unpatched runs are identical, the patched one equal within tolerance
    assert out.variants["unpatched"].losses[0] == out.variants["unpatched"].losses[1]
    assert out.losses.equal and out.losses.noise_rel_diff == 0
    # step 1 ran unpatched in both: its loss is bit-identical
    assert out.variants["patched"].losses[0][0] == out.variants["unpatched"].losses[0][0]
    names = {(c.what, c.name) for c in out.patch.swapped}
    assert names == {("norm", "1"), ("norm", "3"), ("optimizer", "optimizer")}
    assert [c.before for c in out.comparisons] == ["unpatched"]
    # the script's tensors are on the CPU: its kernels ran under the interpreter (or, on a GPU
    # machine, the eager reference), and the report says not to expect a saving
    assert any("did not run as a compiled Triton kernel" in n for n in out.notes)
    d = out.to_dict()
    json.dumps(d)
    assert d["comparisons"][0]["verdict"] in (FASTER, SLOWER, SAME)


def test_verify_script_that_falls_short_says_so(tmp_path):
    script = write(tmp_path, "train.py", TRAIN)
    with pytest.raises(VerifyError, match="ended after 3 step"):
        verify_script(script, ["3"], warmup=2, steps=3, rounds=2, diagnose=False)


def test_verify_cli_with_diagnoses(tmp_path, capsys):
    script = write(tmp_path, "train.py", TRAIN)
    out = tmp_path / "v.json"
    rc = main(["verify", script, "--steps", "2", "--warmup", "2", "--json", str(out), "--", "40"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "before and after" in text and "losses equal" in text
    d = json.loads(out.read_text())
    assert set(d["variants"]) >= {"unpatched", "patched"}
    # the first diagnosis' findings, each with its prediction and whether it is gone
    for f in d["findings"]:
        assert f["predicted_ms"] >= 0 and f["gone"] in (True, False)


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--warmup", "1"], "must be at least 2"),
        (["--rounds", "1"], "must be at least 2"),
        (["--rtol", "0"], "--rtol must be a positive number"),
        (["--rtol", "nan"], "--rtol must be a positive number"),
    ],
)
def test_verify_cli_refuses_what_cannot_be_measured(argv, said, tmp_path, capsys):
    script = write(tmp_path, "train.py", TRAIN)
    assert main(["verify", script, *argv, "--", "40"]) == 2
    assert said in capsys.readouterr().out


def test_verify_cli_hint_for_script_arguments(tmp_path, capsys):
    script = write(tmp_path, "train.py", TRAIN)
    with pytest.raises(SystemExit):
        main(["verify", script, "--batch", "3"])
    assert "fusewise verify" in capsys.readouterr().err


@pytest.mark.parametrize(
    "what, kinds",
    [
        ({"norms"}, {"norm"}),
        ({"loss"}, {"loss"}),
        ({"optimizer"}, {"optimizer"}),
        (
            {"norms", "activations", "loss", "optimizer"},
            {"norm", "activation", "loss", "optimizer"},
        ),
        ({"rotary"}, {"rotary"}),
        (
            {"norms", "activations", "rotary", "loss", "optimizer"},
            {"norm", "activation", "rotary", "loss", "optimizer"},
        ),
    ],
)
def test_patcher_patches_only_its_group(what, kinds):
    """Each fix group runs alone in verify's attribution: a group's run must change nothing else
    (patch's other switches default to on)."""
    hf_tiny = pytest.importorskip("hf_tiny")
    model = hf_tiny.causal_lm("llama")
    opt = torch.optim.AdamW(model.parameters())
    from fusewise.verify.script import Patcher

    patcher = Patcher(frozenset(what))
    patcher(1, [opt])
    assert {c.what for c in patcher.report.swapped} == kinds
    assert any(r is model for r in patcher.roots)
    patcher(2, [opt])  # only where step 1 ends
    assert len(patcher.report.changes) == len({c.name + c.what for c in patcher.report.changes})


@pytest.mark.parametrize(
    "pattern, group",
    [
        ("norm", "norms"),
        ("gated-activation", "activations"),
        ("rotary", "rotary"),
        ("cross-entropy", "loss"),
        ("optimizer", "optimizer"),
        ("elementwise", None),  # patch has no fix for a generic chain
    ],
)
def test_each_fusion_chain_pattern_maps_to_the_patch_group_that_fixes_it(pattern, group):
    from fusewise.report.findings import Finding
    from fusewise.verify.report import group_of
    from fusewise.verify.run import ALL

    f = Finding("fusion-chain", "t", "x.py:1", 1.0, 1.0, "fix", pattern=pattern)
    assert group_of(f) == group
    assert group is None or group in ALL
