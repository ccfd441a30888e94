"""Terminal rendering of a report dict with rich tables. Every string that comes from the user's
run (paths, op and device names, fix texts, error messages) is shown as plain text, never read as
rich markup: a folder named `c[/x]` or a line with `[bold]` in it prints as it is."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ._units import matmul_rates
from .report import incomplete_graph


def render_text(r: dict, console) -> None:
    d, s = r["device"], r["step"]
    peak = s.get("peak_memory_bytes")
    console.print(
        f"[bold]fusewise {r['fusewise_version']}[/] on {escape(d['name'])}: bandwidth "
        f"{d['bandwidth_GBps']:,.0f} GB/s, {escape(matmul_rates(d))}, "
        f"ridge {d['ridge']:,.1f} FLOP/byte"
        + (f" (at {d['matmul_dtype']})" if d.get("matmul_dtype") else "")
    )
    console.print(
        f"step: {s['median_ms']:.2f} ms (median of {s['steps_measured']})"
        + (f", peak memory {peak / 1e9:.2f} GB" if peak else "")
    )
    warning = incomplete_graph(s)
    if warning:
        console.print(Text(warning, style="bold yellow"))
    fit = s.get("memory_scaling")
    if fit:
        ((name, sizes),) = fit["sizes"].items()
        a, b = fit["live_peak_bytes"]
        console.print(
            Text(
                f"peak memory scales as {name}^{fit['exponent']:.2f} ({a / 1e6:,.1f} MB "
                f"at {sizes[0]:g}, {b / 1e6:,.1f} MB at {sizes[1]:g}; from the op "
                f"graph)"
            )
        )
    t = Table(title="top ops (roofline)")
    cols = ("op", "ms/step", "share", "GFLOP", "MB", "FLOP/B", "bound", "ceiling", "% of ceiling")
    for col in cols:
        t.add_column(col, justify="left" if col == "op" else "right")
    for row in r["top"]:
        t.add_row(
            Text(row["name"]),
            f"{row['ms_per_step']:.3f}",
            f"{100 * row['share']:.0f}%",
            f"{row['flops'] / 1e9:,.2f}",
            f"{row['bytes'] / 1e6:,.1f}",
            "-" if row["intensity"] is None else f"{row['intensity']:,.1f}",
            row["bound"],
            row.get("ceiling", ""),
            f"{row['pct_of_ceiling']:.0f}%",
        )
    console.print(t)
    f = Table(title="findings, by predicted saving")
    f.add_column("finding", no_wrap=True)
    f.add_column("where", no_wrap=True)
    f.add_column("saving ms", justify="right", no_wrap=True)
    f.add_column("ops now ms", justify="right", no_wrap=True)  # measured, recorded step
    f.add_column("MB avoidable", justify="right", no_wrap=True)
    f.add_column("fix", overflow="fold")
    for x in r["findings"]:
        name = x["kind"] + (f" ({x['pattern']})" if x["pattern"] else "")
        ev = x["evidence"]
        now = ev.get("measured_ms_unfused", ev.get("measured_ms"))
        f.add_row(
            Text(name),
            Text(x["where"]),
            f"{x['est_saving_ms']:.3f}",
            "" if now is None else f"{now:.3f}",
            f"{x['bytes_avoidable'] / 1e6:,.1f}",
            Text(x["fix"]),
        )
    console.print(f if r["findings"] else "no findings")
    for sk in r["skipped"]:
        console.print(Text(f"not run: {sk['analysis']}: {sk['reason']}", style="dim"))
