"""benchmarks/_rows.commit(): the commit a benchmark row names is the tree that ran."""

import importlib.util
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _rows_in(repo: str):
    """A copy of benchmarks/_rows.py inside `repo` (it finds the repository from its own path)."""
    os.makedirs(os.path.join(repo, "benchmarks"))
    path = os.path.join(repo, "benchmarks", "_rows.py")
    shutil.copy(os.path.join(HERE, "..", "benchmarks", "_rows.py"), path)
    spec = importlib.util.spec_from_file_location("rows_copy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_commit_names_a_src_that_differs_from_it(tmp_path, monkeypatch):
    monkeypatch.delenv("FUSEWISE_COMMIT", raising=False)
    repo = str(tmp_path)
    rows = _rows_in(repo)
    os.makedirs(os.path.join(repo, "src"))
    with open(os.path.join(repo, "src", "k.py"), "w") as f:
        f.write("A = 1\n")
    git = ["git", "-C", repo, "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    sha = subprocess.check_output([*git, "rev-parse", "--short", "HEAD"], text=True).strip()
    assert rows.commit() == sha
    with open(os.path.join(repo, "benchmarks", "notes.txt"), "w") as f:
        f.write("outside src: not counted\n")
    assert rows.commit() == sha
    with open(os.path.join(repo, "src", "k.py"), "w") as f:
        f.write("A = 2\n")
    assert rows.commit() == sha + "+modified-src"
    monkeypatch.setenv("FUSEWISE_COMMIT", "abc1234")
    assert rows.commit() == "abc1234"


def test_commit_outside_a_repository(tmp_path, monkeypatch):
    monkeypatch.delenv("FUSEWISE_COMMIT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert _rows_in(str(tmp_path)).commit() == "unknown"
