"""`fusewise demo norms`: the seed's normalisation example, measured on this machine.

The naive LayerNorm (a mean pass, a variance pass, a normalise pass) and an unfused residual add +
RMSNorm are timed against PyTorch's own op and the fusewise kernel; each row shows the bytes a
fused kernel must move, the bandwidth achieved against the measured copy ceiling, and the error
against a float64 reference. Without a GPU the fusewise kernels run under Triton's interpreter:
their results are checked, their times are not meaningful and are not shown.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import hardware, ops
from .ops import reference
from .ops.norms import cost


def _time_ms(fn, device) -> float:
    for _ in range(3):
        fn()
    if device.type == "cuda":
        import triton

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _rel_err(got, ref) -> float:
    got, ref = got.double().cpu(), ref.double().cpu()
    return ((got - ref).norm() / ref.norm()).item()


def run(console: Console) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.type == "cuda"
    ceil = hardware.ceilings(device)
    console.print(
        f"[bold]fusewise demo[/] on {escape(ceil.device_name)}: copy ceiling "
        f"{ceil.bandwidth_GBps:,.0f} GB/s, matmul {ceil.matmul_TFLOPs:,.1f} TFLOP/s, "
        f"ridge {ceil.ridge:,.0f} FLOP/byte ({ceil.source})"
    )
    dtype = torch.bfloat16 if gpu else torch.float32
    m, n = (16384, 4096) if gpu else (4096, 1024)
    check_rows = m if gpu else 64  # the interpreter checks a slice; the GPU checks everything
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, n, device=device, dtype=dtype, generator=g) * 2 + 0.5
    r = torch.randn(m, n, device=device, dtype=dtype, generator=g)
    w = 1 + 0.1 * torch.randn(n, device=device, dtype=dtype, generator=g)
    b = 0.1 * torch.randn(n, device=device, dtype=dtype, generator=g)

    cases = {
        "LayerNorm": (
            "layer_norm",
            lambda x, r: reference.layer_norm(x, w, b),
            {
                "naive (3 passes)": lambda x, r: reference.layer_norm(x, w, b),
                "torch F.layer_norm": lambda x, r: F.layer_norm(x, (n,), w, b),
                "fusewise layer_norm": lambda x, r: ops.layer_norm(x, w, b),
            },
        ),
        "add + RMSNorm": (
            "add_rms_norm",
            lambda x, r: reference.add_rms_norm(x, r, w)[0],
            {
                "x + r, F.rms_norm": lambda x, r: F.rms_norm(x + r, (n,), w, 1e-6),
                "fusewise add_rms_norm": lambda x, r: ops.add_rms_norm(x, r, w)[0],
            },
        ),
    }
    for title, (kind, oracle, providers) in cases.items():
        c = cost.norm(kind, m, n, dtype)
        floor_ms = ceil.seconds_for_bytes(c.bytes) * 1e3
        t = Table(
            title=f"{title}, x [{m}, {n}] {str(dtype).replace('torch.', '')}: a fused kernel "
            f"moves {c.bytes / 1e6:,.0f} MB, {floor_ms:.3f} ms at the copy ceiling"
        )
        for col in ("provider", "ms", "GB/s", "% of ceiling", "error vs float64"):
            t.add_column(col, justify="left" if col == "provider" else "right")
        xs, rs = x[:check_rows], r[:check_rows]
        ref = oracle(xs.double(), rs.double())
        for name, fn in providers.items():
            err = _rel_err(fn(xs, rs), ref)
            with torch.no_grad():
                interpreted = name.startswith("fusewise") and not gpu
                ms = None if interpreted else _time_ms(lambda fn=fn: fn(x, r), device)
            if ms is None:
                t.add_row(name, "interpreter", "-", "-", f"{err:.1e}")
            else:
                gbps = c.bytes / ms / 1e6
                pct = 100 * gbps / ceil.bandwidth_GBps
                t.add_row(name, f"{ms:.3f}", f"{gbps:,.0f}", f"{pct:.0f}%", f"{err:.1e}")
        console.print(t)
    console.print("paths taken:", ops.paths())
    if not gpu:
        console.print(
            "[dim]No GPU here: the fusewise rows ran the real Triton kernels under "
            "TRITON_INTERPRET=1 (checked against float64, not timed). GB/s counts the bytes a "
            "fused kernel needs, so the naive rows show what extra passes cost.[/]"
        )
    return 0
