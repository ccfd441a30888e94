"""A self-contained HTML report (no network): tables and an inline-SVG roofline plot."""

from __future__ import annotations

import html
import math

from ._units import matmul_rates
from .report import incomplete_graph


def _roofline_svg(r: dict, w: int = 560, h: int = 320) -> str:
    d = r["device"]
    pts = [
        (row["intensity"], row["flops"] / (row["ms_per_step"] * 1e-3) / 1e12, row["name"])
        for row in r["top"]
        if row["flops"] > 0 and row["ms_per_step"] > 0 and math.isfinite(row["intensity"])
    ]
    x_lo, x_hi = -2.0, 4.0  # log10 FLOP/byte
    peak = d["matmul_TFLOPs"]
    y_hi = math.log10(peak) + 0.5
    y_lo = y_hi - 6

    def sx(i):
        return 50 + (math.log10(max(i, 1e-9)) - x_lo) / (x_hi - x_lo) * (w - 70)

    def sy(t):
        return h - 30 - (math.log10(max(t, 1e-12)) - y_lo) / (y_hi - y_lo) * (h - 50)

    ridge = d["ridge"]
    bw_tb = d["bandwidth_GBps"] / 1e3
    roof = (
        f'<polyline fill="none" stroke="#444" stroke-width="2" points="'
        f"{sx(10**x_lo):.1f},{sy(bw_tb * 10**x_lo):.1f} {sx(ridge):.1f},{sy(peak):.1f} "
        f'{sx(10**x_hi):.1f},{sy(peak):.1f}"/>'
    )
    headline = d.get("matmul_dtype") or "matmul"
    labels = (
        f'<text x="{sx(ridge) + 4:.1f}" y="{sy(peak) - 6:.1f}" font-size="10">'
        f"ridge {ridge:,.0f} FLOP/B, peak {peak:,.3g} TFLOP/s ({headline}), "
        f"{d['bandwidth_GBps']:,.0f} GB/s</text>"
    )
    # one roof per measured matmul dtype (fp32 without TF32 sits far below bf16 on a GPU)
    for key, tflops in sorted((d.get("matmul_by_dtype") or {}).items(), key=lambda kv: kv[1]):
        x0 = sx(max(tflops * 1e3 / d["bandwidth_GBps"], 10**x_lo))
        roof += (
            f'<line x1="{x0:.1f}" y1="{sy(tflops):.1f}" x2="{sx(10**x_hi):.1f}" '
            f'y2="{sy(tflops):.1f}" stroke="#888" stroke-dasharray="4 3"/>'
            f'<text x="{sx(10**x_hi) - 30:.1f}" y="{sy(tflops) - 3:.1f}" font-size="9">'
            f"{html.escape(key)}</text>"
        )
    # points below the plotted range sit on its floor rather than off the picture
    pts = [(i, max(t, 10 ** (y_lo + 0.05)), n) for i, t, n in pts]
    dots = "".join(
        f'<circle cx="{sx(i):.1f}" cy="{sy(t):.1f}" r="4" fill="#c0392b"><title>'
        f"{html.escape(n)}: {i:.1f} FLOP/B, {t:.3f} TFLOP/s</title></circle>"
        f'<text x="{sx(i) + 6:.1f}" y="{sy(t) - 4:.1f}" font-size="9">{html.escape(n[6:])}</text>'
        for i, t, n in pts
    )
    axes = (
        f'<text x="{w / 2:.0f}" y="{h - 5}" font-size="11" text-anchor="middle">'
        f'intensity (FLOP/byte, log)</text><text x="12" y="{h / 2:.0f}" font-size="11" '
        f'transform="rotate(-90 12 {h / 2:.0f})" text-anchor="middle">TFLOP/s (log)</text>'
    )
    return (
        f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">'
        f"{roof}{labels}{dots}{axes}</svg>"
    )


def _table(rows: list[dict], cols: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(row.get(c)))}</td>" for c in cols) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return "" if v is None else str(v)


_FINDING_COLUMNS = ["kind", "pattern", "where", "est_saving_ms", "bytes_avoidable", "fix", "title"]
_TOP_COLUMNS = [
    "name",
    "ms_per_step",
    "share",
    "flops",
    "bytes",
    "intensity",
    "bound",
    "ceiling",
    "pct_of_ceiling",
]


def render_html(r: dict) -> str:
    d, s = r["device"], r["step"]
    findings = [dict(f, evidence=None) for f in r["findings"]]
    warning = incomplete_graph(s)
    warning_html = f'<p style="color:#a60"><b>{html.escape(warning)}</b></p>' if warning else ""
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>fusewise report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;
margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px}}th{{background:#eee}}
</style></head><body><h1>fusewise diagnosis</h1>
<p>{html.escape(d["name"])}: {d["bandwidth_GBps"]:,.0f} GB/s, {html.escape(matmul_rates(d))},
ridge {d["ridge"]:,.1f} FLOP/byte.
Step {s["median_ms"]:.2f} ms (median of {s["steps_measured"]}).</p>{warning_html}
<h2>Findings</h2>{_table(findings, _FINDING_COLUMNS)}
<h2>Roofline of the top ops</h2>{_roofline_svg(r)}
<h2>Breakdown</h2>{_table(r["top"], _TOP_COLUMNS)}
<h2>Not run</h2>{_table(r["skipped"], ["analysis", "reason"])}
</body></html>"""
