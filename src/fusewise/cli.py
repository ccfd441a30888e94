"""`fusewise` command line: env (ceilings and versions), demo (the norm kernels, measured)."""

from __future__ import annotations

import argparse
import math
import os
import sys

from rich.console import Console
from rich.markup import escape
from rich.text import Text

_DIAGNOSE_HELP = """\
Run SCRIPT in this process, as `python SCRIPT ARGS` would, and diagnose its steps.

A step ends at each optimizer.step() (any torch optimizer). A loop without an optimizer
(inference, decoding) marks its steps itself: call fusewise.step() at the end of each.
The first --warmup steps run untouched, the next --steps are timed, the next --steps are
profiled, and one more is recorded op by op; then the script is stopped. It needs
warmup + 2 x steps + 1 steps in all, and says so if the script ends sooner."""


_VERIFY_HELP = """\
Run SCRIPT in this process unpatched and patched (fusewise.patch on its model: norms, gated
MLPs and loss; its torch AdamW swapped for fusewise's), interleaved over --rounds rounds, and
measure the difference with a 95% interval; "no measurable difference" when that is the truth.

Each run starts from the same seeds; the patch is applied at the end of step 1. Before: a
diagnosis of the unpatched step, whose findings get their predicted saving set against the
measured one; after: a diagnosis of the patched step, with the findings that are gone."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in argv:  # everything after -- belongs to the diagnosed script
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(prog="fusewise", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="versions and the device's measured ceilings")
    env.add_argument("--refresh", action="store_true", help="measure again, ignoring the cache")
    env.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if present)")
    dg = sub.add_parser(
        "diagnose",
        help="run SCRIPT in-process and diagnose its steps",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_DIAGNOSE_HELP,
        epilog="Arguments after -- are passed to SCRIPT: fusewise diagnose train.py --steps 3 "
        "-- --batch_size=8",
    )
    dg.add_argument("script")
    dg.add_argument("--steps", type=int, default=5, help="steps timed, and steps profiled")
    dg.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="steps run first, untouched (at least 1: a step is timed from the end "
        "of the one before)",
    )
    dg.add_argument("--json", default=None, help="write the report as JSON here")
    dg.add_argument("--html", default=None, help="write a self-contained HTML report here")
    dg.add_argument(
        "--sizes",
        default=None,
        metavar="NAME=V1,V2",
        help="run the script twice, with --NAME=V1 and then --NAME=V2 (replacing "
        "a --NAME given after --, in its form), and fit how peak memory "
        "scales (e.g. seq_len=512,1024)",
    )
    vf = sub.add_parser(
        "verify",
        help="run SCRIPT unpatched and patched, interleaved, and measure what the fix saved",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_VERIFY_HELP,
        epilog="Arguments after -- are passed to SCRIPT: fusewise verify train.py -- --steps 100",
    )
    vf.add_argument("script")
    vf.add_argument("--steps", type=int, default=10, help="steps timed in each run")
    vf.add_argument("--warmup", type=int, default=3, help="steps untouched in each run (>= 2)")
    vf.add_argument("--rounds", type=int, default=2, help="runs of each variant (>= 2)")
    vf.add_argument("--rtol", type=float, default=1e-2, help="loss tolerance, relative, per step")
    vf.add_argument(
        "--no-diagnose",
        action="store_true",
        help="skip the diagnoses before and after (no predicted savings, no findings gone)",
    )
    vf.add_argument("--json", default=None, help="write the verification as JSON here")
    demo = sub.add_parser("demo", help="diagnose a built-in GPT step, fix it, diagnose again")
    demo.add_argument("--steps", type=int, default=7, help="steps timed and profiled per variant")
    demo.add_argument("--warmup", type=int, default=2)
    demo.add_argument(
        "what",
        nargs="?",
        default="diagnose",
        choices=["diagnose", "norms"],
        help="diagnose (default), or norms: the fused norms against eager PyTorch",
    )
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        hint = ""
        if args.command in ("diagnose", "verify"):
            hint = (
                f"; arguments for the script go after --: fusewise {args.command} {args.script} "
                f"[options] -- {' '.join(unknown)}"
            )
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    args.script_args = script_args
    console = Console(width=None if sys.stdout.isatty() else 150)
    if args.command == "env":
        return _env(console, args.device, args.refresh)
    if args.command == "diagnose":
        return _diagnose_script(console, args)
    if args.command == "verify":
        return _verify_script(console, args)
    if args.what == "norms":
        _interpret_without_gpu(argv)
        from . import demo_norms

        return demo_norms.run(console)
    from . import demo

    return demo.run(console, steps=args.steps, warmup=args.warmup)


def _env(console: Console, device: str | None, refresh: bool) -> int:
    import platform

    from rich.table import Table

    from . import __version__, hardware

    c = hardware.ceilings(device, refresh=refresh)
    t = Table(title=f"fusewise {__version__} on {escape(c.device_name)}", show_header=False)
    t.add_row("python", platform.python_version())
    t.add_row("versions", hardware.versions())
    t.add_row("memory bandwidth", f"{c.bandwidth_GBps:,.0f} GB/s (copy, read + write; {c.source})")
    t.add_row("matmul rate", f"{c.matmul_TFLOPs:,.1f} TFLOP/s ({c.headline_key}, {c.source})")
    if c.matmul_by_dtype:  # fp32 = TF32 off
        rates = ", ".join(f"{k} {v:,.1f}" for k, v in c.matmul_by_dtype.items())
        t.add_row("matmul per dtype", f"{rates} TFLOP/s (fp32: TF32 off)")
    t.add_row("ridge point", f"{c.ridge:,.0f} FLOP/byte")
    if c.datasheet_bandwidth_GBps:
        t.add_row(
            "datasheet",
            f"{c.datasheet_bandwidth_GBps:,.0f} GB/s, "
            f"{c.datasheet_matmul_TFLOPs:,.0f} TFLOP/s: measured is "
            f"{100 * c.bandwidth_GBps / c.datasheet_bandwidth_GBps:.0f}% and "
            f"{100 * c.matmul_TFLOPs / c.datasheet_matmul_TFLOPs:.0f}%",
        )
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


def run() -> None:
    """The console entry point (`fusewise ...`, `python -m fusewise ...`). After a diagnosed
    script the process ends with os._exit once the report is out: the script was stopped
    mid-run in this process, and its half-built state (threads, DataLoader workers, atexit
    handlers, profiler and CUDA teardown) is not ours to run down; its exit status is the
    diagnosis', never a crash during that teardown."""
    argv = sys.argv[1:]
    if argv[:1] not in (["diagnose"], ["verify"]):
        raise SystemExit(main(argv))
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's errors, rich's on a closed pipe
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        rc = 130
    except BaseException:  # a bug of ours: said, then the same hard exit
        import traceback

        traceback.print_exc()
        rc = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe
            pass
    os._exit(rc)


def _output_problem(path: str | None, flag: str, script: str, taken: dict) -> str | None:
    """Why the report could not be written to `path` (checked before the script runs, so a typo
    never costs the run), or None."""
    if path is None:
        return None
    target = os.path.realpath(path)  # through symlinks: two names of one file are one file
    folder = os.path.dirname(target)
    if os.path.isdir(path):
        return f"{flag} {path} is a folder; give a file path"
    if not os.path.isdir(folder):
        return f"{flag} {path}: the folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or (
        os.path.exists(target) and not os.access(target, os.W_OK)
    ):
        return f"{flag} {path}: not writable"
    if os.path.exists(target) and os.path.samefile(target, script):
        return f"{flag} {path} is the script being diagnosed; refusing to overwrite it"
    if target in taken:
        return f"{flag} and {taken[target]} name the same file {path}"
    taken[target] = flag
    return None


def _diagnose_script(console: Console, args) -> int:
    from . import hardware
    from .diagnose.driver import analyze

    if args.steps < 1 or args.warmup < 1:
        console.print(
            Text(
                "--steps and --warmup must be at least 1 (a step of a script is "
                "timed from the end of the one before, so the first is never "
                "timed)",
                style="red",
            )
        )
        return 2
    if not os.path.isfile(args.script):
        console.print(Text(f"no such script: {args.script}", style="red"))
        return 2
    # absolute now: the script may change the working directory
    args.json, args.html = (os.path.abspath(p) if p else p for p in (args.json, args.html))
    taken: dict = {}
    for path, flag in ((args.json, "--json"), (args.html, "--html")):
        problem = _output_problem(path, flag, args.script, taken)
        if problem:
            console.print(Text(problem, style="red"))
            return 2
    sizes = _parse_sizes(args.sizes) if args.sizes else None
    if args.sizes and sizes is None:
        console.print(
            Text(
                f"--sizes wants NAME=V1,V2 with two different numbers, got {args.sizes!r}",
                style="red",
            )
        )
        return 2
    observations = _observe(console, args, sizes)
    if observations is None:
        return 1
    obs = observations[-1]
    if sizes:  # the second size's observation carries the first (memory scaling)
        obs.other = observations[0]
    report = analyze(obs, hardware.ceilings(obs.device))
    if args.json:  # files first: the terminal rendering must never cost them
        report.save_json(args.json)
    if args.html:
        report.save_html(args.html)
    report.render(console)
    return 0


def _verify_script(console: Console, args) -> int:
    from .verify import VerifyError, verify_script

    if not os.path.isfile(args.script):
        console.print(Text(f"no such script: {args.script}", style="red"))
        return 2
    if args.warmup < 2 or args.steps < 2 or args.rounds < 2:
        console.print(
            Text(
                "--warmup, --steps and --rounds must be at least 2 (step 1 runs unpatched and "
                "step 2 compiles the kernels; two rounds give the order both ways)",
                style="red",
            )
        )
        return 2
    if not (0 < args.rtol < math.inf):
        console.print(
            Text(
                f"--rtol must be a positive number (the largest relative difference of two "
                f"losses still called equal, e.g. 1e-2), got {args.rtol}",
                style="red",
            )
        )
        return 2
    args.json = os.path.abspath(args.json) if args.json else None
    problem = _output_problem(args.json, "--json", args.script, {})
    if problem:
        console.print(Text(problem, style="red"))
        return 2
    try:
        result = verify_script(
            args.script,
            args.script_args,
            warmup=args.warmup,
            steps=args.steps,
            rounds=args.rounds,
            rtol=args.rtol,
            diagnose=not args.no_diagnose,
            progress=lambda text: console.print(Text(f"fusewise verify: {text}", style="dim")),
        )
    except VerifyError as e:
        console.print(Text(str(e), style="red"))
        return 1
    if args.json:
        result.save_json(args.json)
    result.render(console)
    return 0


def _observe(console: Console, args, sizes) -> list | None:
    """The script's Observation, or one per size with --sizes; None (said) if a run fell short."""
    from .capture.script import ScriptRun

    if not sizes:
        variants = [(args.script_args, None)]
    else:
        name, a, b, written = sizes
        variants = [
            (_with_size(args.script_args, name, v), (name, x)) for v, x in zip(written, (a, b))
        ]
    observations = []
    for script_args, size in variants:
        run = ScriptRun(args.steps, args.warmup)
        run.run(args.script, script_args)
        if not run.complete:
            said = run.shortfall(args.script)
            if sizes:
                said += f"\n(run with the arguments {script_args}, for --sizes {args.sizes})"
            console.print(Text(said, style="red"))
            return None
        observations.append(run.schedule.observation(size=size))
    return observations


def _with_size(args: list[str], name: str, value: str) -> list[str]:
    """The script's arguments with --name set to value: an existing `--name=x` or `--name x`
    is replaced in its own form; otherwise `--name=value` is appended (one argument, which
    argparse, click and nanoGPT's `--key=value` configurator all read)."""
    flag = f"--{name}"
    out, i, found = [], 0, False
    while i < len(args):
        if args[i].startswith(flag + "="):
            out.append(f"{flag}={value}")
            found = True
        elif args[i] == flag and i + 1 < len(args):
            out += [flag, value]
            found, i = True, i + 1
        else:
            out.append(args[i])
        i += 1
    return out if found else [*out, f"{flag}={value}"]


def _parse_sizes(text: str):
    """'seq_len=512,1024' -> ('seq_len', 512.0, 1024.0, ['512', '1024']), or None if malformed:
    the script gets the values as written (1.0 stays 1.0, for parsers that check the type)."""
    name, _, values = text.lstrip("-").partition("=")
    written = values.split(",")
    try:
        a, b = (float(v) for v in written)
    except ValueError:
        return None
    if not name or not (0 < a < math.inf and 0 < b < math.inf) or a == b:
        return None
    return name, a, b, written
