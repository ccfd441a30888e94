"""What every benchmark writes (the commit it measured and long-format CSV rows), and the
CUDA-graph capture the benchmarks time the kernels alone with."""

import csv
import os
import subprocess


def commit() -> str:
    """FUSEWISE_COMMIT (set it where the tree has no .git, e.g. the GPU machine), else git's,
    with "+modified-src" where src/ differs from it: a tree copied over another checkout (the
    GPU machine's is the landed main) would otherwise be labelled with a commit it is not."""
    if os.environ.get("FUSEWISE_COMMIT"):
        return os.environ["FUSEWISE_COMMIT"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    git = ["git", "-C", root]
    try:
        sha = subprocess.check_output([*git, "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    same = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", "src"]).returncode == 0
    return sha if same else sha + "+modified-src"


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


NUMERIC = ("ms", "gbps_or_tflops", "pct_of_ceiling")


def read_csv(path: str) -> list[dict]:
    """Rows as append_csv wrote them, the measurements as floats again ("" stays "")."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in NUMERIC:
            if r.get(k) not in (None, ""):
                r[k] = float(r[k])
    return rows


def isolated(script: str, argv: list[str], providers: list[str], csv_path: str | None) -> list:
    """Runs `script argv --providers P --csv ...` once per provider, each in a fresh process, and
    returns every row. In one process the order of providers moves their times: anything timed
    after torch.compile has run was 5-8% faster on the H200 (h200_rotary_order_dcea58d.txt), so
    a comparison across providers in one process can favour whichever comes last."""
    import sys
    import tempfile

    argv = _without(argv, "--isolate", "--providers", "--csv")
    with tempfile.TemporaryDirectory() as d:
        part = os.path.join(d, "rows.csv")
        for p in providers:
            cmd = [sys.executable, script, *argv, "--providers", p, "--csv", part]
            if subprocess.run(cmd).returncode:
                print(f"# {p}: its process failed (above); its rows are missing", flush=True)
        rows = read_csv(part) if os.path.exists(part) else []
    if csv_path:
        append_csv(csv_path, rows)
    return rows


def _without(argv: list[str], flag: str, *options: str) -> list[str]:
    """argv less `flag` and less each option with its value (`--x v` or `--x=v`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        elif arg != flag and not arg.startswith(tuple(o + "=" for o in options)):
            out.append(arg)
    return out
