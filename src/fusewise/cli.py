"""`fusewise` command line: env (ceilings and versions), demo (the norm kernels, measured)."""

from __future__ import annotations

import argparse
import os
import sys

from rich.console import Console


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fusewise", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="versions and the device's measured ceilings")
    env.add_argument("--refresh", action="store_true", help="measure again, ignoring the cache")
    env.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if present)")
    demo = sub.add_parser("demo", help="diagnose a built-in GPT step, fix it, diagnose again")
    demo.add_argument(
        "what",
        nargs="?",
        default="diagnose",
        choices=["diagnose", "norms"],
        help="diagnose (default), or norms: the fused norms against eager PyTorch",
    )
    args = parser.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 150)
    if args.command == "env":
        return _env(console, args.device, args.refresh)
    if args.what == "norms":
        _interpret_without_gpu(argv)
        from . import demo_norms

        return demo_norms.run(console)
    from . import demo

    return demo.run(console)


def _env(console: Console, device: str | None, refresh: bool) -> int:
    import platform

    from rich.table import Table

    from . import __version__, hardware

    c = hardware.ceilings(device, refresh=refresh)
    t = Table(title=f"fusewise {__version__} on {c.device_name}", show_header=False)
    t.add_row("python", platform.python_version())
    t.add_row("versions", hardware.versions())
    t.add_row("memory bandwidth", f"{c.bandwidth_GBps:,.0f} GB/s (copy, read + write; {c.source})")
    t.add_row("matmul rate", f"{c.matmul_TFLOPs:,.1f} TFLOP/s ({c.source})")
    t.add_row("ridge point", f"{c.ridge:,.0f} FLOP/byte")
    if c.datasheet_bandwidth_GBps:
        t.add_row("datasheet", f"{c.datasheet_bandwidth_GBps:,.0f} GB/s, "
                  f"{c.datasheet_matmul_TFLOPs:,.0f} TFLOP/s: measured is "
                  f"{100 * c.bandwidth_GBps / c.datasheet_bandwidth_GBps:.0f}% and "
                  f"{100 * c.matmul_TFLOPs / c.datasheet_matmul_TFLOPs:.0f}%")  # fmt: skip
    console.print(t)
    return 0


def _interpret_without_gpu(argv: list[str] | None) -> None:
    """Without a GPU the demo runs the Triton kernels under the interpreter. Triton reads
    TRITON_INTERPRET when a kernel is decorated (at import), so restart with it set."""
    import torch

    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return
    env = dict(os.environ, TRITON_INTERPRET="1")
    args = sys.argv[1:] if argv is None else argv
    os.execve(sys.executable, [sys.executable, "-m", "fusewise", *args], env)
