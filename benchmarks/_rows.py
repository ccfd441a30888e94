"""What every benchmark writes (the commit it measured and long-format CSV rows), and the
CUDA-graph capture the benchmarks time the kernels alone with."""

import csv
import os
import subprocess


def commit() -> str:
    """FUSEWISE_COMMIT (set it where the tree has no .git, e.g. the GPU machine), else git's."""
    if os.environ.get("FUSEWISE_COMMIT"):
        return os.environ["FUSEWISE_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def append_csv(path: str, rows: list[dict]) -> None:
    if not rows:
        return
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)


def row(op, provider, mode, shape, dtype, ms, value, pct="", peak="", *, commit_id=None) -> dict:
    """One long-format row (STYLE.md): the measurement plus GPU, versions, commit and date."""
    import datetime

    import torch
    import triton

    return dict(
        op=op,
        provider=provider,
        mode=mode,
        shape=shape,
        dtype=dtype,
        ms=round(ms, 5),
        gbps_or_tflops=round(value, 1),
        pct_of_ceiling=pct if pct == "" else round(pct, 1),
        peak_bytes=peak,
        gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        torch=torch.__version__,
        triton=triton.__version__,
        commit=commit_id or commit(),
        date=datetime.date.today().isoformat(),
    )


def graph_replay(run):
    """run captured in a CUDA graph, warmed up on a side stream first as torch.cuda.graphs asks:
    timing its replay times the kernels without the host's launches."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay
