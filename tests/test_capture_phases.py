"""Phases of the recorded step by dataflow: gradient processing between the backward and the
optimizer (clip_grad_norm_, manual scaling) is "post-backward", also with gradient accumulation,
where the next micro-batch's forward runs after a backward and stays "forward"."""

import pathlib

import pytest
import torch

from fusewise.capture.opgraph import Recorder
from fusewise.capture.profiled import ProfiledCapture
from fusewise.diagnose.chains import find_chains
from fusewise.hardware import Ceilings

H200 = Ceilings("NVIDIA H200 (PERF.md)", "cuda", 4274.0, 686.0, "test")
HERE = pathlib.Path(__file__).name


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU())
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _phases_by_line(graph):
    by_line: dict[str, set[str]] = {}
    for op in graph.ops:
        by_line.setdefault(op.where.split(":")[-1], set()).add(op.phase)
    return by_line


def _line(text):
    for i, line in enumerate(pathlib.Path(__file__).read_text().splitlines(), 1):
        if text in line and "_line(" not in line:
            return str(i)
    raise AssertionError(text)


CAPTURES = pytest.mark.parametrize(
    "capture", [Recorder, ProfiledCapture], ids=["recorder", "profiler"]
)


@CAPTURES
def test_clip_grad_norm_is_post_backward_and_its_chain_is_grad_clip(capture):
    model, opt = _model()
    x = torch.randn(64, 512)
    with capture() as rec:
        model(x).square().mean().backward()  # FWD
        for p in model.parameters():
            p.grad.div_(1024.0)  # UNSCALE (a loss scale taken out by hand, then clipped)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)  # CLIP
        opt.step()  # OPT
    by_line = _phases_by_line(rec.graph)
    assert by_line[_line("# CLIP")] == by_line[_line("# UNSCALE")] == {"post-backward"}
    assert by_line[_line("# FWD")] == {"forward", "backward"}
    assert by_line[_line("# OPT")] == {"optimizer"}  # reads the clipped gradients
    clip = [f for f in find_chains(rec.graph, H200) if f.evidence["phase"] == "post-backward"]
    assert clip and all(f.pattern == "grad-clip" for f in clip)
    assert HERE in clip[0].where
    assert "foreach=True" in clip[0].fix


@CAPTURES
def test_gradient_accumulation_keeps_the_next_forward_forward(capture):
    model, opt = _model()
    xs = torch.randn(2, 16, 512)
    with capture() as rec:
        for x in xs:
            (model(x).square().mean() / 2).backward()  # MICRO
        for p in model.parameters():
            p.grad.mul_(0.5)  # SCALE
        loss = model(xs[0]).sum()  # AFTER (reads parameters, not gradients)
        opt.step()
    by_line = _phases_by_line(rec.graph)
    assert by_line[_line("# MICRO")] == {"forward", "backward"}
    assert by_line[_line("# SCALE")] == {"post-backward"}
    assert by_line[_line("# AFTER")] == {"forward"}
    assert loss.requires_grad
