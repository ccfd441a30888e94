"""The HTML report in a real headless browser (Debian's chromium), with a screenshot."""

import shutil
import subprocess

import pytest
from test_diagnose import golden, observed

from fusewise.diagnose.driver import analyze
from fusewise.hardware import Ceilings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def report():
    ceil = Ceilings("NVIDIA H200 (PERF.md)", "cuda", 4274.0, 686.0, "test")
    op_ms = {"aten::mm": 2.0, "aten::_softmax": 0.5, "aten::bmm": 0.7, "aten::mul": 0.3}
    return analyze(observed(golden("naive"), op_ms, [10.0, 11.0, 12.0], 20.0), ceil)


def test_html_is_self_contained(tmp_path):
    path = tmp_path / "r.html"
    report().save_html(path)
    page = path.read_text()
    assert "<svg" in page and "ridge 161 FLOP/B" in page
    for remote in ("http://", "https://", "src=", "@import"):
        assert remote not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_html_renders_in_headless_chromium(tmp_path):
    path, png = tmp_path / "r.html", tmp_path / "r.png"
    report().save_html(path)
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={png}",
            "--window-size=1100,1400",
            f"file://{path}",
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 30_000  # tables and a plot, not a blank page (a blank one is ~5 kB)
