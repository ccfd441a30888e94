"""The command line: env, diagnose SCRIPT (in-process, steps found through optimizer.step() or
fusewise.step(), script stopped after the measured steps), and the demos' entry points."""

import json
import os
import textwrap
from pathlib import Path

import pytest

from fusewise.cli import main

TRAIN = """
import sys, torch
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.LayerNorm(256))
opt = torch.optim.AdamW(model.parameters(), foreach=False)
x = torch.randn(512, 256)
n = int(sys.argv[1])
done = 0
for i in range(n):
    try:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    except Exception:  # a script that swallows errors must still be stopped
        pass
    done += 1
open(sys.argv[2], "w").write(str(done))
"""

INFER = """
import torch, fusewise
x = torch.randn(256, 512)
for i in range(100):
    y = torch.softmax(x @ x.T, -1) @ x
    fusewise.step()
"""


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_diagnose_script_stops_after_the_measured_steps(tmp_path):
    script = write(tmp_path, "train.py", TRAIN)
    marker, out = tmp_path / "done.txt", tmp_path / "r.json"
    rc = main(
        [
            "diagnose",
            script,
            "--steps",
            "2",
            "--warmup",
            "1",
            "--json",
            str(out),
            "--",
            "50",
            str(marker),
        ]
    )
    assert rc == 0
    assert not marker.exists()  # stopped at step 1 + 2·2 + 1 = 6 of 50, before the end
    d = json.loads(out.read_text())
    assert d["step"]["steps_measured"] == 2 and d["step"]["ops_recorded"] > 0
    found = {(f["pattern"], f["where"].split(":")[0].endswith("train.py")) for f in d["findings"]}
    assert ("optimizer", True) in found  # the per-parameter AdamW loop, at the script's line


def test_diagnose_script_with_fusewise_step(tmp_path):
    script = write(tmp_path, "infer.py", INFER)
    out = tmp_path / "r.html"
    assert main(["diagnose", script, "--steps", "1", "--warmup", "1", "--html", str(out)]) == 0
    assert "<svg" in out.read_text()


def test_diagnose_script_that_ends_too_soon(tmp_path, capsys):
    script = write(tmp_path, "train.py", TRAIN)
    rc = main(["diagnose", script, "--steps", "3", "--", "2", str(tmp_path / "m.txt")])
    assert rc == 1
    assert "ended after 2 step(s); the diagnosis needs 9" in capsys.readouterr().out


def test_diagnose_missing_script(capsys):
    assert main(["diagnose", "no/such/script.py"]) == 2
    assert "no such script" in capsys.readouterr().out


def test_env_prints_ceilings(tmp_path, monkeypatch, capsys):
    from fusewise import hardware

    monkeypatch.setenv("FUSEWISE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(hardware, "measure_bandwidth", lambda d: 50.0)
    monkeypatch.setattr(hardware, "measure_matmul", lambda d: 1.0)
    assert main(["env", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "50 GB/s" in text and "ridge point" in text and "torch" in text


@pytest.mark.parametrize("argv", [["diagnose", "x.py", "--steps", "0"]])
def test_bad_arguments(argv, tmp_path, capsys):
    script = write(tmp_path, "x.py", "pass\n")
    argv = [a if a != "x.py" else script for a in argv]
    assert main(argv) == 2


ATTN = """
import argparse, torch, fusewise
ap = argparse.ArgumentParser()
ap.add_argument("--seq", type=int)
ap.add_argument("--sdpa", action="store_true")
a = ap.parse_args()
q = torch.randn(2, 4, a.seq, 32, requires_grad=True)
k, v = torch.randn(2, 4, a.seq, 32), torch.randn(2, 4, a.seq, 32)
for i in range(20):
    if a.sdpa:
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    else:
        y = torch.softmax(q @ k.transpose(-2, -1) / 5.6, -1) @ v  # the [S, S] scores
    y.sum().backward()
    fusewise.step()
"""


@pytest.mark.parametrize("sdpa", [False, True])
def test_sizes_fits_the_memory_exponent(sdpa, tmp_path):
    script = write(tmp_path, "attn.py", ATTN)
    out = tmp_path / "r.json"
    args = [
        "diagnose",
        script,
        "--steps",
        "1",
        "--warmup",
        "1",
        "--sizes",
        "seq=256,512",
        "--json",
        str(out),
    ] + (["--", "--sdpa"] if sdpa else [])
    assert main(args) == 0
    d = json.loads(out.read_text())
    scaling = [f for f in d["findings"] if f["title"].startswith("peak memory grows")]
    assert not any(s["analysis"] == "memory-scaling" for s in d["skipped"])
    if sdpa:
        assert scaling == []  # linear: nothing to report
    else:
        (f,) = scaling
        assert f["kind"] == "quadratic-memory" and f["evidence"]["exponent"] >= 1.9
        path, line = f["where"].rsplit(":", 1)
        assert path.endswith("attn.py") and "q @ k.transpose" in ATTN.splitlines()[int(line) - 1]


def test_sizes_must_be_two_numbers(tmp_path, capsys):
    script = write(tmp_path, "attn.py", ATTN)
    assert main(["diagnose", script, "--sizes", "seq=256"]) == 2
    assert "--sizes wants NAME=V1,V2" in capsys.readouterr().out


def test_demo_runs_and_shows_before_and_after(capsys, monkeypatch, tmp_path):
    """`make demo`'s command, on whatever device is present (small sizes on the CPU)."""
    monkeypatch.setenv("FUSEWISE_CACHE_DIR", str(tmp_path))
    assert main(["demo", "--steps", "2", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert "naive step" in out and "what changed" in out
    assert "fusion-chain (norm)" in out and "fusion-chain (optimizer)" in out
    # measured interleaved, with the interval and the verdict; the first steps' losses agree
    assert "95% interval" in out and "losses equal over 2 values" in out
    assert "findings that the clean step fixes" in out or "that the fusewise step fixes" in out


def test_the_demo_predicts_from_the_findings_its_fixed_step_addresses():
    """Launch-overhead and idle-gap findings name fixes the fixed step does not make (CUDA graphs,
    the host): they are listed apart, not added to the saving the fixed step is predicted."""
    from fusewise.demo import addressed
    from fusewise.report.findings import Finding

    def finding(kind, ms, pattern=None):
        return Finding(kind, "t", "x.py:1", ms, 0.0, "fix", pattern=pattern)

    findings = [
        finding("fusion-chain", 3.0, "norm"),
        finding("fusion-chain", 1.0, "optimizer"),
        finding("attention-fallback", 2.0),
        finding("launch-overhead", 4.0),
        finding("idle-gap", 0.5),
        finding("idle-gap", 0.25),
        finding("fusion-chain", 0.5, "elementwise"),
    ]
    ours, others = addressed(findings)
    assert ours == 6.0
    assert others == {"launch-overhead": 4.0, "idle-gap": 0.75, "fusion-chain elementwise": 0.5}


def test_demo_norms_checks_the_kernels(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEWISE_CACHE_DIR", str(tmp_path))
    assert main(["demo", "norms"]) == 0
    out = capsys.readouterr().out
    assert "LayerNorm" in out and "add + RMSNorm" in out and "error vs float64" in out


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, as JSON.parse and other strict parsers do."""

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_user_strings_are_never_markup(tmp_path, capsys, request):
    """A path with rich markup in it ([/x] closes nothing, [bold] is a style) is printed as it is,
    and the report files are written. The script sits in a short folder of its own: the table
    is 150 wide, and a long temporary path (pytest-xdist's) would be cut with an ellipsis."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="fw"))
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    folder = base / "c[" / "x]"  # a path with "c[/x]" in it
    folder.mkdir(parents=True)
    script = write(folder, "train[bold].py", TRAIN)
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    rc = main(
        [
            "diagnose",
            script,
            "--steps",
            "1",
            "--warmup",
            "1",
            "--json",
            str(out),
            "--html",
            str(page),
            "--",
            "50",
            str(tmp_path / "m.txt"),
        ]
    )
    assert rc == 0 and out.exists() and page.exists()
    d = strict_json(out.read_text())
    assert any("train[bold].py" in f["where"] for f in d["findings"])
    text = capsys.readouterr().out.replace("\n", "").replace("│", "").replace(" ", "")
    assert "train[bold].py" in text


def test_report_json_is_strict(tmp_path):
    """Ops that move no bytes have infinite intensity: written as null, never as Infinity."""
    from fusewise.report import Device, Report, StepSummary, TopOp

    inf, nan = float("inf"), float("nan")
    r = Report(
        device=Device("x", "cpu", 1.0, 1.0, 1.0),
        step=StepSummary(nan, None, 1, None, 0),
        top=[TopOp("aten::t", 0.1, 0.1, 1.0, 0.0, inf, "compute", 0.0)],
    )
    d = strict_json(r.to_json())
    assert d["top"][0]["intensity"] is None and d["step"]["median_ms"] is None


@pytest.mark.parametrize("case", ["missing-folder", "the-script", "a-folder", "same-file"])
def test_output_paths_are_checked_before_the_run(case, tmp_path, capsys):
    script = write(tmp_path, "train.py", TRAIN)
    marker = tmp_path / "ran.txt"
    outputs = {
        "missing-folder": ["--json", str(tmp_path / "no" / "r.json")],
        "the-script": ["--json", script],
        "a-folder": ["--html", str(tmp_path)],
        "same-file": ["--json", str(tmp_path / "r"), "--html", str(tmp_path / "r")],
    }
    before = open(script).read()
    assert main(["diagnose", script, *outputs[case], "--", "3", str(marker)]) == 2
    said = capsys.readouterr().out
    assert {
        "missing-folder": "does not exist",
        "the-script": "refusing to overwrite",
        "a-folder": "is a folder",
        "same-file": "name the same file",
    }[case] in said
    assert not marker.exists() and open(script).read() == before  # nothing ran, nothing lost


def test_console_entry_exits_with_the_diagnosis_status(tmp_path):
    """`python -m fusewise diagnose` ends with the diagnosis' status once the report is out (the
    stopped script's teardown is skipped), and with 1 when the script ended too soon."""
    import os
    import subprocess
    import sys

    script = write(tmp_path, "train.py", TRAIN)
    out = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "fusewise",
            "diagnose",
            script,
            "--steps",
            "1",
            "--warmup",
            "1",
            "--json",
            str(out),
            "--",
            "50",
            str(tmp_path / "m"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert strict_json(out.read_text())["step"]["steps_measured"] == 1
    short = subprocess.run(
        [sys.executable, "-m", "fusewise", "diagnose", script, "--", "1", str(tmp_path / "m")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert short.returncode == 1 and "ended after 1 step(s)" in short.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("entry", ["console", "main"])
@pytest.mark.parametrize("sizes", [False, True], ids=["plain", "sizes"])
def test_cli_on_a_gpu_training_script_exits_0(sizes, entry, tmp_path):
    """`fusewise diagnose examples/train_gpt.py` on the GPU, as a user runs it: once aborted
    after its report (munmap_chunk) with --sizes, and crashed without (a profile read after the
    next profiler session began, freed at exit). "main": through cli.main and a normal
    interpreter exit, which runs the teardown the console entry skips."""
    import os
    import pathlib
    import subprocess
    import sys

    script = pathlib.Path(__file__).parents[1] / "examples" / "train_gpt.py"
    out = tmp_path / "r.json"
    soft = "import sys; from fusewise.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [
        sys.executable,
        *(["-m", "fusewise"] if entry == "console" else ["-c", soft]),
        "diagnose",
        str(script),
        "--steps",
        "2",
        "--warmup",
        "1",
        "--json",
        str(out),
    ]
    argv += ["--sizes", "seq=64,128"] if sizes else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        argv + ["--", "--steps", "30"], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (done.stdout[-1500:], done.stderr[-3000:])
    d = strict_json(out.read_text())
    assert d["device"]["type"] == "cuda" and d["findings"]
    assert any(s["analysis"] == "memory-scaling" for s in d["skipped"]) != sizes


# --- the runner on real scripts ----------------------------------------------------------------

MODEL = """
import torch
class Tiny(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = torch.nn.Linear(d, d)
    def forward(self, x):  # x [B, S, d]: [B, S, S] scores, quadratic in S
        return torch.softmax(x @ x.transpose(1, 2), -1) @ self.proj(x)
"""

# nanoGPT's configurator: --key=value overrides a global of the same name and type
CONFIGURATOR = """
import sys
from ast import literal_eval
for arg in sys.argv[1:]:
    assert arg.startswith("--") and "=" in arg, arg
    key, val = arg[2:].split("=")
    if key not in globals():
        raise ValueError(f"Unknown config key: {key}")
    attempt = literal_eval(val)
    assert type(attempt) == type(globals()[key])
    globals()[key] = attempt
"""

NANO_TRAIN = """
import os, sys, torch
from model import Tiny  # a sibling module: needs the script's folder on sys.path
block_size = 16
steps = 40
exec(open(os.path.join(os.path.dirname(__file__), "configurator.py")).read())
def main():
    model = Tiny(32)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        model(torch.randn(4, block_size, 32)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return 0
if __name__ == "__main__":
    sys.exit(main())
"""


def test_nanogpt_shaped_script_from_another_folder_with_sizes(tmp_path, monkeypatch):
    """A multi-file script (sibling import, `--key=value` configurator, sys.exit(main())) run
    from another working directory, at two sizes: found and fitted as python would run it."""
    import sys

    proj = tmp_path / "proj"
    proj.mkdir()
    write(proj, "model.py", MODEL)
    write(proj, "configurator.py", CONFIGURATOR)
    script = write(proj, "train.py", NANO_TRAIN)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path_before = list(sys.path)
    out = tmp_path / "r.json"
    rc = main(
        [
            "diagnose",
            script,
            "--steps",
            "1",
            "--warmup",
            "1",
            "--sizes",
            "block_size=256,512",
            "--json",
            str(out),
            "--",
            "--steps=40",
        ]
    )
    assert rc == 0 and sys.path == path_before
    d = strict_json(out.read_text())
    (fit,) = [f for f in d["findings"] if f["title"].startswith("peak memory grows")]
    assert fit["evidence"]["exponent"] >= 1.9 and fit["where"].endswith("model.py:8")


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--steps=40"], ["--steps=40", "--seq=64"]),
        (["--seq=8", "--steps=40"], ["--seq=64", "--steps=40"]),
        (["--seq", "8", "-v"], ["--seq", "64", "-v"]),
    ],
    ids=["appended", "key-value-replaced", "two-args-replaced"],
)
def test_sizes_argument_takes_the_scripts_own_form(args, expected):
    from fusewise.cli import _with_size

    assert _with_size(args, "seq", "64") == expected


STEPS_THEN = """
import argparse, sys, torch
ap = argparse.ArgumentParser()
ap.add_argument("--end", default="finish")
a = ap.parse_args()
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(2):
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
if a.end == "exit":
    sys.exit(0)
if a.end == "raise":
    def load_batch():
        raise ValueError("no more data")
    load_batch()
"""


@pytest.mark.parametrize(
    "script_args, said",
    [
        (["--end", "finish"], "ended after 2 step(s); the diagnosis needs 4"),
        (["--end", "exit"], "exited (sys.exit(0)) after 2 step(s); the diagnosis needs 4"),
        (["--help"], "exited (sys.exit(0)) after 0 step(s)"),
        (
            ["--nope"],
            "exited (sys.exit(2)) after 0 step(s); the diagnosis needs 4 (--warmup 1 + 2 x "
            "--steps 1 + 1). A step ends at each optimizer.step() or fusewise.step(). It "
            "stopped before its first step",
        ),
        (["--end", "raise"], "raised ValueError in step 3 (a profiled step) at "),
    ],
    ids=["finished", "sys-exit", "help", "bad-argument", "raised"],
)
def test_how_the_script_ended_is_said(script_args, said, tmp_path, capsys):
    script = write(tmp_path, "train.py", STEPS_THEN)
    rc = main(["diagnose", script, "--steps", "1", "--warmup", "1", "--", *script_args])
    out = capsys.readouterr().out
    assert rc == 1 and said in " ".join(out.split())
    if script_args == ["--end", "raise"]:
        line = next(i for i, t in enumerate(STEPS_THEN.splitlines(), 1) if "raise ValueError" in t)
        assert f"train.py:{line}: no more data" in out  # the innermost user line, named first
        tb = out[out.index("Traceback") :]
        assert "load_batch()" in tb and "runpy" not in tb and "capture/script.py" not in tb


def test_warmup_0_is_refused_for_a_script(tmp_path, capsys):
    script = write(tmp_path, "train.py", STEPS_THEN)
    assert main(["diagnose", script, "--warmup", "0"]) == 2
    assert "--warmup must be at least 1" in " ".join(capsys.readouterr().out.split())


def test_script_arguments_without_the_separator_get_a_hint(tmp_path, capsys):
    script = write(tmp_path, "train.py", STEPS_THEN)
    with pytest.raises(SystemExit) as e:
        main(["diagnose", script, "--end", "exit"])
    assert e.value.code == 2
    assert (
        f"arguments for the script go after --: fusewise diagnose {script} [options] -- "
        f"--end exit" in capsys.readouterr().err
    )


CFG = """
import argparse
ap = argparse.ArgumentParser()
ap.add_argument("--seq", type=int, default=64)
args, _ = ap.parse_known_args()  # read when imported: a second run must import it again
"""

CFG_TRAIN = """
import torch
from cfg import args
from model import Tiny
model = Tiny(32)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(20):
    model(torch.randn(4, args.seq, 32)).sum().backward()
    opt.step()
"""


def test_sizes_reimport_the_scripts_own_modules(tmp_path):
    """A sibling module that reads sys.argv when imported sees each size (the second run once
    reused the first run's module, silently measuring one size twice)."""
    write(tmp_path, "cfg.py", CFG)
    write(tmp_path, "model.py", MODEL)
    script = write(tmp_path, "train.py", CFG_TRAIN)
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "diagnose",
                script,
                "--steps",
                "1",
                "--warmup",
                "1",
                "--sizes",
                "seq=256,512",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    fit = strict_json(out.read_text())["step"]["memory_scaling"]
    assert fit["exponent"] >= 1.9 and fit["sizes"] == {"seq": [256, 512]}


CHDIR = """
import argparse, os, torch
ap = argparse.ArgumentParser(); ap.add_argument("--d", type=int, default=8)
a = ap.parse_args()
os.makedirs(os.path.join(os.path.dirname(__file__), "sub"), exist_ok=True)
os.chdir(os.path.join(os.path.dirname(__file__), "sub"))
model = torch.nn.Linear(a.d, a.d)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(20):
    model(torch.randn(4, a.d)).sum().backward()
    opt.step()
"""


def test_a_script_that_changes_directory(tmp_path, monkeypatch):
    """Output paths are the user's (resolved before the run), the second --sizes run finds the
    script, and the working directory is put back."""
    proj, here = tmp_path / "proj", tmp_path / "here"
    proj.mkdir()
    here.mkdir()
    write(proj, "chd.py", CHDIR)
    monkeypatch.chdir(here)
    rc = main(
        [
            "diagnose",
            "../proj/chd.py",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--sizes",
            "d=8,16",
            "--json",
            "r.json",
        ]
    )
    assert rc == 0 and (here / "r.json").exists() and os.getcwd() == str(here)


TWO_OPTIMIZERS = """
import sys, torch, fusewise
a, b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
oa, ob = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.AdamW(b.parameters())
class Wrapper(torch.optim.Optimizer):  # steps an inner optimizer, as ZeroRedundancyOptimizer
    def __init__(self, inner):
        self.inner = inner
        super().__init__(inner.param_groups, {})
    def step(self, closure=None):
        return self.inner.step()
wrapped = Wrapper(torch.optim.SGD(b.parameters(), lr=0.1))
for _ in range(20):
    b(a(torch.randn(4, 8))).sum().backward()
    if sys.argv[1] == "two":
        oa.step(); ob.step()
    elif sys.argv[1] == "two-marked":
        oa.step(); ob.step(); fusewise.step()
    else:
        wrapped.step()
"""


@pytest.mark.parametrize("case", ["two", "two-marked", "nested"])
def test_what_ends_a_step_with_several_optimizers(case, tmp_path, capsys):
    """Two optimizers per iteration would cut it in pieces: refused with the way out
    (fusewise.step(), after which only it ends steps); an optimizer stepping another inside its
    step() ends one step."""

    script = write(tmp_path, "train.py", TWO_OPTIMIZERS)
    out = tmp_path / "r.json"
    rc = main(["diagnose", script, "--steps", "1", "--warmup", "1", "--json", str(out), "--", case])
    said = " ".join(capsys.readouterr().out.split())
    if case == "two":
        assert rc == 1 and "2 optimizers (SGD, AdamW) each ended steps" in said
        assert "Call fusewise.step() at the end of each iteration" in said
        return
    assert rc == 0
    phases = strict_json(out.read_text())["step"]
    assert phases["ops_recorded"] > 0
    top = {t["name"] for t in strict_json(out.read_text())["top"]}
    assert "aten::addmm" in top or "aten::mm" in top  # the forward is in the step


@pytest.mark.parametrize("sizes", ["n=inf,5", "n=nan,5", "n=0,5", "n=5,5", "n=5"])
def test_sizes_must_be_two_finite_positive_numbers(sizes, tmp_path, capsys):
    script = write(tmp_path, "train.py", STEPS_THEN)
    assert main(["diagnose", script, "--sizes", sizes]) == 2
    assert "--sizes wants NAME=V1,V2" in capsys.readouterr().out


def test_output_paths_through_symlinks(tmp_path, capsys):
    script = write(tmp_path, "train.py", STEPS_THEN)
    (tmp_path / "a.json").write_text("{}")
    os.symlink(tmp_path / "a.json", tmp_path / "alias.json")
    os.symlink(tmp_path / "no" / "r.json", tmp_path / "dangling.json")
    same = ["--json", str(tmp_path / "a.json"), "--html", str(tmp_path / "alias.json")]
    assert main(["diagnose", script, *same]) == 2
    assert "name the same file" in capsys.readouterr().out
    assert main(["diagnose", script, "--json", str(tmp_path / "dangling.json")]) == 2
    assert "does not exist" in capsys.readouterr().out


def test_an_error_before_the_first_step(tmp_path, capsys):
    script = write(tmp_path, "train.py", "import torch\nraise ImportError\n")
    assert main(["diagnose", script]) == 1
    said = " ".join(capsys.readouterr().out.split())
    assert "raised ImportError before its first step ended (in start-up or step 1) at " in said


def test_console_entry_exits_even_when_main_raises(tmp_path):
    """Whatever main() does (a bug of ours, an error exit, a closed pipe), the console entry
    ends the process: a script's non-daemon thread once kept it alive forever."""
    import subprocess
    import sys

    code = (
        "import sys, threading, time, fusewise.cli as c\n"
        "threading.Thread(target=time.sleep, args=(3600,)).start()\n"
        "def boom(argv): raise RuntimeError('boom')\n"
        "c.main = boom\n"
        "sys.argv = ['fusewise', 'diagnose', 'x.py']\n"
        "c.run()\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "RuntimeError: boom" in done.stderr


PROFILED = """
import torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
with torch.profiler.profile(schedule=schedule) as p:  # starts while the diagnosis profiles
    for _ in range(20):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        p.step()
"""


def test_a_script_running_its_own_profiler_is_told_why(tmp_path, capsys):
    script = write(tmp_path, "train.py", PROFILED)
    assert main(["diagnose", script, "--steps", "1", "--warmup", "1"]) == 1
    said = " ".join(capsys.readouterr().out.split())
    assert "The script runs torch.profiler itself, which cannot nest" in said


def test_a_graph_missing_ops_is_reported_not_silent(capsys, monkeypatch):
    """Kernels of the recorded step launched by ops the graph's walk never reached are counted
    in the report (from the trace; analyze() puts them in the step summary), and above 1% of the
    step the text and the HTML say the graph is incomplete; a report without the fields, or
    without a finite step time, warns of nothing."""
    from types import SimpleNamespace

    from rich.console import Console

    from fusewise.diagnose import driver
    from fusewise.report import Device, Report, StepSummary
    from fusewise.report.html import render_html
    from fusewise.report.report import incomplete_graph

    trace = SimpleNamespace(unwalked_kernels=2, unwalked_us=500.0)
    assert driver.kernels_without_op(SimpleNamespace(trace=trace)) == (2, 0.5)
    assert driver.kernels_without_op(SimpleNamespace(trace=None)) == (0, 0.0)
    assert driver.kernels_without_op(SimpleNamespace(trace=SimpleNamespace())) == (0, 0.0)
    for lost_ms, warned in ((0.5, True), (0.09, False)):
        r = Report(
            device=Device("x", "cuda", 1.0, 1.0, 1.0),
            step=StepSummary(10.0, None, 3, None, 7, 2, lost_ms),
        )
        d = r.as_dict()
        assert d["step"]["kernels_without_op"] == 2
        r.render(Console(width=200, force_terminal=False))
        text = capsys.readouterr().out
        assert ("incomplete op graph: 2 kernels" in text) is warned
        assert ("incomplete op graph" in render_html(d)) is warned
    assert incomplete_graph({"median_ms": float("nan"), "kernels_without_op_ms": 0.0}) is None
    assert incomplete_graph({"median_ms": 10.0}) is None  # a report from before the fields

    from test_diagnose import golden, observed

    from fusewise.hardware import Ceilings

    monkeypatch.setattr(driver, "kernels_without_op", lambda obs: (3, 1.5))
    ceil = Ceilings("NVIDIA H200 (PERF.md)", "cuda", 4274.0, 686.0, "test")
    step = driver.analyze(observed(golden("naive"), {}, [10.0, 11.0, 12.0], 20.0), ceil).step
    assert (step.kernels_without_op, step.kernels_without_op_ms) == (3, 1.5)
