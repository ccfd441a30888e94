"""Capture a step in a CUDA graph, put new data in its inputs, replay, and compare with the same
step run eagerly on that data (the pattern of torch.cuda.graphs' documentation)."""

import torch


def replay_matches_eager(step, new_data) -> None:
    """step() -> tuple of tensors; new_data() writes new values into the captured inputs."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up off the capture stream, as torch asks
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = step()
    with torch.no_grad():
        new_data()
    g.replay()
    fresh = step()
    for u, v in zip(static, fresh, strict=True):
        assert torch.equal(u, v)
