"""`fusewise verify SCRIPT`: the user's unchanged script, unpatched and patched, measured.

1. The first diagnosis (unpatched): the findings and their predicted savings.
2. Interleaved runs: `rounds` rounds, each running every variant once, the order reversed every
   round (unpatched, patched; patched, unpatched; ...). Variants: unpatched; patched (norms,
   gated MLPs, rotary embeddings, loss, optimizer); and, when the findings fall in more than one
   of the fix groups (norms, activations, rotary, loss, optimizer: verify/report.GROUPS), each
   group alone, so each group's findings get a measured saving of their own.
3. The comparison of each patched variant against the unpatched one (measure.compare) and the
   loss trajectories (patched against unpatched; the unpatched runs against each other give the
   run-to-run noise).
4. The diagnosis of the patched step: which findings are gone.
"""

from __future__ import annotations

from ..capture.script import ScriptRun
from ..diagnose.driver import analyze
from ..hardware import ceilings
from ..ops import _dispatch
from .measure import Samples, check_losses, compare, round_orders
from .report import FindingCheck, VerifyReport, group_of
from .script import Patcher, run_variant, seed_everything

ALL = frozenset({"norms", "activations", "rotary", "loss", "optimizer"})
UNPATCHED, PATCHED = "unpatched", "patched"


class VerifyError(RuntimeError):
    """The script fell short of the steps verify needs; the message says how."""


def diagnose_script(script, argv, what: frozenset[str], *, steps: int, warmup: int):
    """(Report, PatchReport) of the script's step, patched with `what` from step 1's end."""
    patcher = Patcher(what)
    run = ScriptRun(steps, warmup, on_step_end=patcher)
    seed_everything()
    run.run(script, argv)
    if not run.complete:
        raise VerifyError(run.shortfall(script))
    obs = run.schedule.observation()
    patcher.roots = []
    return analyze(obs, ceilings(obs.device)), patcher.report


def _key(f) -> tuple:
    return (f.kind, f.pattern or "", f.where)


def verify_script(
    script: str,
    argv: list[str] | None = None,
    *,
    warmup: int = 3,
    steps: int = 10,
    rounds: int = 2,
    diagnose: bool = True,
    diagnose_steps: int = 3,
    rtol: float = 1e-2,
    attribute: bool = True,
    progress=None,
) -> VerifyReport:
    """Verify `script` (see the module's docstring). warmup: steps untouched per run (at least 2:
    step 1 runs unpatched, step 2 compiles fusewise's kernels); steps: steps timed per run;
    rounds: runs of each variant (at least 2); rtol: the loss tolerance (relative, per step).
    progress(text): told what runs next. Raises VerifyError when the script falls short."""
    argv = list(argv or [])
    say = progress or (lambda text: None)
    if warmup < 2 or steps < 2 or rounds < 2:
        raise ValueError("verify needs warmup >= 2, steps >= 2 and rounds >= 2")
    if not (0 < rtol < float("inf")):
        raise ValueError(f"rtol must be a positive number (e.g. 1e-2), got {rtol}")
    before = None
    if diagnose:
        say("diagnosing the unpatched step")
        before, _ = diagnose_script(script, argv, frozenset(), steps=diagnose_steps, warmup=2)
    groups = sorted({g for f in (before.findings if before else []) for g in [group_of(f)] if g})
    variants = {UNPATCHED: frozenset(), PATCHED: ALL}
    if attribute and len(groups) > 1:
        variants.update({f"{g} only": frozenset({g}) for g in groups})
    samples = {name: Samples(name) for name in variants}
    _dispatch.forget_paths()  # the paths the runs below take, nothing from before
    patch_report = None
    for r, order in enumerate(round_orders(list(variants), rounds)):
        for name in order:
            say(f"round {r + 1} of {rounds}: {name}")
            result, run, report = run_variant(
                script, argv, variants[name], warmup=warmup, steps=steps
            )
            if result is None:
                raise VerifyError(run.shortfall(script))
            s = samples[name]
            s.add_round(result.ms)
            s.losses += result.losses
            s.peak_bytes = max(s.peak_bytes or 0, result.peak_bytes or 0) or None
            s.tokens_per_step = result.tokens_per_step
            if name == PATCHED:
                patch_report = report
    comparisons = [compare(samples[UNPATCHED], samples[n]) for n in variants if n != UNPATCHED]
    base = samples[UNPATCHED].losses
    losses = check_losses(
        base[0], samples[PATCHED].losses[0], rtol, noise=base[1] if len(base) > 1 else None
    )
    out = VerifyReport(script, samples, comparisons, losses, patch=patch_report)
    slow = sorted(op for op, path in _dispatch.paths().items() if path != _dispatch.TRITON)
    if slow:
        out.notes.append(
            f"In the patched runs fusewise's {', '.join(slow)} did not run as a compiled Triton "
            "kernel (eager reference or the interpreter: the kernels need a CUDA GPU; the "
            "warnings said why), so the patched step is not expected to be faster here."
        )
    if before is None:
        return out
    say("diagnosing the patched step")
    after, _ = diagnose_script(script, argv, ALL, steps=diagnose_steps, warmup=2)
    out.after_findings = after.findings
    left = {_key(f) for f in after.findings}
    by_name = {c.after: c for c in comparisons}
    swapped = {c.what for c in patch_report.swapped} if patch_report else set()
    group_name = {
        "norms": "norm",
        "activations": "activation",
        "rotary": "rotary",
        "loss": "loss",
        "optimizer": "optimizer",
    }
    for f in before.findings:
        g = group_of(f)
        c = by_name.get(f"{g} only") or (by_name[PATCHED] if g else None)
        check = FindingCheck(
            f.kind,
            f.pattern or "",
            f.where,
            f.title,
            f.est_saving_ms,
            g,
            applied=bool(g) and group_name[g] in swapped,
            gone=_key(f) not in left,
        )
        if c is not None and check.applied:
            check.measured_ms, check.measured_low_ms, check.measured_high_ms = (
                c.saving_ms,
                c.low_ms,
                c.high_ms,
            )
        out.findings.append(check)
    if len(groups) == 1:
        out.notes.append(
            "One fix group among the findings: its measured saving is the whole patched "
            "step's against the unpatched one."
        )
    out.notes.append(
        "Step 1 of every run is unpatched (patch is applied where it ends); the losses compare "
        "every value given to .backward(), in order, from the same seeds."
    )
    return out
