"""matmul-precision and matmul-shape: the matmuls that run far from their ceiling for a reason
the user can change in one place. Stateless: (Observation, Ceilings) -> list[Finding].

- matmul-precision: fp32 matmuls on a GPU that ran without TF32 (or with it, where bf16 autocast
  is the next step). Their measured device time in the recorded step, against the same FLOPs at
  the TF32 and bf16 rates measured for this device (hardware.py), reaching the same fraction of
  those ceilings as they reach of theirs now.
- matmul-shape: matmuls whose dimensions are not multiples of 8 (16-bit) / 4 (fp32), or of 64
  for the large ones (a 50257-token vocabulary); the saving is measured, by timing the shape and
  its padded shape on this GPU and scaling the recorded time by the ratio. And lines that launch
  many tiny, launch-bound matmuls per step.

Neither is reported for a CPU step: there is no TF32 there, tensor-core alignment is a GPU
matter, and the recorded CPU times carry the recorder's overhead.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from .. import fixes, hardware
from ..hardware import tf32_allowed
from ..report import Finding
from . import thresholds as T
from ._matmuls import input_dtype, is_matmul, mnk, operands
from .registry import Skip, analyzer

ASSUMPTION = (
    "each of the shapes with most time timed on this GPU in fp32, TF32 and bf16 (random data, "
    "row-major) and the recorded time scaled by the measured ratio; the other shapes (and all "
    "where no GPU can time them) assumed to reach the same fraction of the faster ceiling as "
    "they reach of theirs now (ceilings measured on this device: hardware.ceilings)"
)


def gpu_matmuls(graph, dtype: str | None = None) -> list:
    """The recorded matmuls on GPU tensors (a CPU matmul in a GPU step runs no tensor core),
    of `dtype` when given."""
    out = []
    for op in graph.ops:
        if not is_matmul(op) or any(v.device == "cpu" for v in operands(op, graph)):
            continue
        if dtype is None or all(v.dtype == dtype for v in operands(op, graph)):
            out.append(op)
    return out


def _worth(saving_ms: float, step_ms: float) -> bool:
    return saving_ms >= T.MATMUL_MIN_SAVING_MS and saving_ms >= T.MATMUL_MIN_SHARE * step_ms


def _heaviest_line(ops) -> tuple[str, dict[str, float]]:
    """The line with most of the ops' measured time, and the time per line (largest first)."""
    per_line: dict[str, float] = defaultdict(float)
    for op in ops:
        per_line[op.where] += op.ms
    ranked = dict(sorted(per_line.items(), key=lambda kv: (-kv[1], kv[0])))
    return next(iter(ranked)), ranked


# --- matmul-precision -------------------------------------------------------------------------


@analyzer("matmul-precision")
def analyze_precision(obs, ceilings) -> list[Finding]:
    if obs.device != "cuda":
        return []  # no TF32 on a CPU; bf16 there is not judged from host-timed recordings
    if not gpu_matmuls(obs.graph, "float32"):
        return []
    if obs.matmul_settings is None:
        raise Skip(
            "the step's fp32 matmul settings were not recorded (an observation made without "
            "capture.schedule.StepSchedule): whether TF32 was on is unknown"
        )
    timer = _time_on_gpu if torch.cuda.is_available() else None
    return find_precision(obs.graph, ceilings, obs.matmul_settings, obs.median_ms, timer)


def predicted_ms(ops, graph, now: str, targets, rates: dict, timer=None):
    """({target key: the ops' predicted time}, ms of the ops whose shape was timed). The
    MATMUL_PRECISION_SHAPES_TIMED shapes with most recorded time are timed by timer(batch, m, n,
    k, key) -> ms at `now` and at each target, their recorded time scaled by the ratio; the
    other shapes by the ratio of the ceilings (the same fraction of either)."""
    by_shape: dict[tuple, list] = defaultdict(list)
    for op in ops:
        by_shape[mnk(op, graph)].append(op)
    ms_of = {shape: sum(op.ms for op in group) for shape, group in by_shape.items()}
    ranked = sorted(ms_of, key=lambda s: (-ms_of[s], s))[: T.MATMUL_PRECISION_SHAPES_TIMED]
    out, timed_ms = dict.fromkeys(targets, 0.0), 0.0
    for shape, ms in ms_of.items():
        ratios = {t: rates[now] / rates[t] for t in targets}
        if timer is not None and shape in ranked:
            try:
                base = timer(*shape, now)
                ratios = {t: timer(*shape, t) / base for t in targets}
                timed_ms += ms
            except torch.cuda.OutOfMemoryError:
                pass  # beside the user's model: this shape keeps the ceilings' ratio
        for t in targets:
            out[t] += ms * ratios[t]
    return out, timed_ms


def find_precision(graph, ceilings, settings: dict, step_ms: float, timer=None) -> list[Finding]:
    """One finding for the step's fp32 GPU matmuls (the setting is global): TF32 when it was
    off, else bf16 autocast; est_saving_ms from measured times and ceilings (ASSUMPTION)."""
    ops = gpu_matmuls(graph, "float32")
    tf32 = bool(tf32_allowed(settings))
    now_key = "tf32" if tf32 else "fp32"
    rates = {k: ceilings.rate(k) for k in ("fp32", "tf32", "bf16")}
    needed = ["tf32", "bf16"] if tf32 else ["fp32", "tf32", "bf16"]
    missing = [k for k in needed if rates[k] is None]
    if missing:
        raise Skip(
            f"no {', '.join(missing)} matmul rate for {ceilings.device_name} (ceilings measured "
            "by an older fusewise, or given without per-dtype rates): hardware.ceilings(refresh="
            "True) measures them"
        )
    measured_ms = sum(op.ms for op in ops)
    if measured_ms <= 0:
        raise Skip("the recorded step has no device time for its fp32 matmuls")
    flops = sum(op.flops for op in ops)
    fraction = flops / (measured_ms * 1e-3) / 1e12 / rates[now_key]
    # autocast's casts: each forward matmul's fp32 operands read (4 B) and written in bf16 (2 B);
    # the backward reuses the saved bf16 copies
    cast_bytes = sum(
        6 * math.prod(v.shape) for op in ops if op.phase == "forward" for v in operands(op, graph)
    )
    cast_ms = ceilings.seconds_for_bytes(cast_bytes) * 1e3
    targets = ("bf16",) if tf32 else ("tf32", "bf16")
    predicted, timed_ms = predicted_ms(ops, graph, now_key, targets, rates, timer)
    bf16_ms = predicted["bf16"] + cast_ms
    where, per_line = _heaviest_line(ops)
    evidence = dict(
        measured_ms=measured_ms,
        matmuls=len(ops),
        gflop=flops / 1e9,
        settings=dict(settings),
        ran_as=now_key,
        fraction_of_ceiling=fraction,
        timed_share=timed_ms / measured_ms,
        rates_TFLOPs=rates,
        predicted_ms_bf16_autocast=bf16_ms,
        cast_ms_bf16_autocast=cast_ms,
        saving_ms_bf16_autocast=measured_ms - bf16_ms,
        ms_by_line=dict(list(per_line.items())[:5]),
        assumption=ASSUMPTION + "; autocast adds the casts of the forward matmuls' operands",
    )
    if not tf32:
        tf32_ms = predicted["tf32"]
        evidence.update(predicted_ms_tf32=tf32_ms, saving_ms_tf32=measured_ms - tf32_ms)
        saving, option = measured_ms - tf32_ms, "tf32"
        title = (
            f"{len(ops)} fp32 matmuls ran without TF32: {measured_ms:.2f} ms of the step at "
            f"{100 * fraction:.0f}% of the fp32 rate; ~{saving:.2f} ms less with TF32, "
            f"~{measured_ms - bf16_ms:.2f} ms less under bf16 autocast"
        )
    else:
        saving, option = measured_ms - bf16_ms, "autocast"
        title = (
            f"{len(ops)} fp32 matmuls ran as TF32: {measured_ms:.2f} ms of the step; "
            f"~{saving:.2f} ms less under bf16 autocast"
        )
    if not _worth(saving, step_ms):
        return []
    return [
        Finding(
            kind="matmul-precision",
            title=title,
            where=where,
            est_saving_ms=saving,
            bytes_avoidable=0.0,
            fix=fixes.text("matmul-precision", option),
            evidence=evidence,
        )
    ]


# --- matmul-shape -----------------------------------------------------------------------------


def padded(value: int, dtype: str) -> int:
    """The multiple a matmul dimension should be (MATMUL_ALIGN_ELEMENTS, MATMUL_BIG_MULTIPLE for
    a large one), rounded up to; the value itself when it already is one."""
    multiple = T.MATMUL_ALIGN_ELEMENTS[dtype]
    if value >= T.MATMUL_BIG_DIM:
        multiple = math.lcm(multiple, T.MATMUL_BIG_MULTIPLE)
    return -(-value // multiple) * multiple


@analyzer("matmul-shape")
def analyze_shape(obs, ceilings) -> list[Finding]:
    if obs.device != "cuda":
        return []  # tensor-core alignment and launch-bound kernels are GPU matters
    timer, why = None, "no CUDA device here to time the padded shape on"
    if torch.cuda.is_available():
        timer, why = _time_on_gpu, None
    tf32 = tf32_allowed(obs.matmul_settings)
    return find_unaligned(obs.graph, obs.median_ms, bool(tf32), timer, why) + find_tiny(
        obs.graph, obs.median_ms
    )


def _time_on_gpu(batch: int, m: int, n: int, k: int, key: str) -> float:
    return hardware.time_matmul_ms(m, n, k, key, batch=batch)


def find_unaligned(graph, step_ms: float, tf32: bool, timer=None, why=None) -> list[Finding]:
    """One finding per line whose matmuls have unaligned dimensions. timer(batch, m, n, k, key)
    -> ms times one matmul on this GPU; None: the saving cannot be measured (`why`), and the
    finding says so with est_saving_ms 0 rather than a number nobody measured."""
    by_line: dict[str, list] = defaultdict(list)
    for op in gpu_matmuls(graph):
        dtype = input_dtype(op, graph)
        if dtype not in T.MATMUL_ALIGN_ELEMENTS:
            continue
        batch, m, n, k = mnk(op, graph)
        pad = tuple(padded(d, dtype) for d in (m, n, k))
        if pad != (m, n, k):
            key = hardware.rate_key(dtype, tf32)
            by_line[op.where].append((op, (batch, m, n, k, key), (batch, *pad, key)))
    if not by_line:
        return []
    ratios = _measure_ratios(by_line, timer)
    findings = []
    for where, entries in sorted(by_line.items()):
        ms = sum(op.ms for op, _, _ in entries)
        saving = sum(
            op.ms * (1 - min(1.0, ratios[shape])) for op, shape, _ in entries if shape in ratios
        )
        unmeasured = sorted({s for _, s, _ in entries if s not in ratios})
        dims = sorted({(d, p) for _, s, ps in entries for d, p in zip(s[1:4], ps[1:4]) if d != p})
        timed = any(shape in ratios for _, shape, _ in entries)
        ok = _worth(saving, step_ms) if timed else _worth(ms, step_ms)
        if not ok:
            continue
        text = ", ".join(f"{d} -> {p}" for d, p in dims)
        findings.append(
            Finding(
                kind="matmul-shape",
                title=(
                    f"{len(entries)} matmuls with unaligned dimensions ({text}): {ms:.2f} ms "
                    + (f"of the step; ~{saving:.2f} ms less padded" if timed else "(not timed)")
                ),
                where=where,
                est_saving_ms=saving if timed else 0.0,
                bytes_avoidable=0.0,
                fix=fixes.text("matmul-shape", "align"),
                evidence=dict(
                    measured_ms=ms,
                    matmuls=len(entries),
                    dims_padded=[list(x) for x in dims],
                    time_ratio_padded={_label(s): r for _, s, _ in entries if (r := ratios.get(s))},
                    shapes_not_timed=[_label(s) for s in unmeasured],
                    saving_measured=timed,
                    why_not_measured=None if timed else (why or _UNTIMED),
                    method=(
                        "each shape and its padded shape timed on this GPU (random data, "
                        "row-major); the recorded time scaled by padded / actual"
                    ),
                ),
            )
        )
    return findings


_UNTIMED = (
    "its shapes were not among the MATMUL_SHAPES_MEASURED with most time, or could not be timed "
    "(out of memory beside the model)"
)


def _label(shape: tuple) -> str:
    batch, m, n, k, key = shape
    lead = f"{batch}x" if batch > 1 else ""
    return f"{lead}[{m}x{k}]@[{k}x{n}] {key}"


def _measure_ratios(by_line, timer) -> dict[tuple, float]:
    """padded / actual time for the MATMUL_SHAPES_MEASURED shapes with most recorded time. A
    shape that cannot be timed (out of memory beside the user's model) stays untimed: the
    finding lists it under shapes_not_timed."""
    ms_of: dict[tuple, float] = defaultdict(float)
    pad_of = {}
    for entries in by_line.values():
        for op, shape, pad in entries:
            ms_of[shape] += op.ms
            pad_of[shape] = pad
    ranked = sorted(ms_of, key=lambda s: (-ms_of[s], s))[: T.MATMUL_SHAPES_MEASURED]
    ratios = {}
    for shape in ranked if timer is not None else ():
        try:
            ratios[shape] = timer(*pad_of[shape]) / timer(*shape)
        except torch.cuda.OutOfMemoryError:
            continue
    return ratios


def find_tiny(graph, step_ms: float) -> list[Finding]:
    """Lines launching at least MATMUL_TINY_MIN_COUNT matmuls per step, each under SHORT_OP_US of
    device time: launch-bound. Saving: their measured device time less that of one matmul (one
    batched launch of the same work assumed to take about as long as the longest one)."""
    by_line: dict[str, list] = defaultdict(list)
    for op in gpu_matmuls(graph):
        if 0 < op.ms * 1e3 < T.SHORT_OP_US:
            by_line[op.where].append(op)
    findings = []
    for where, ops in sorted(by_line.items()):
        if len(ops) < T.MATMUL_TINY_MIN_COUNT:
            continue
        ms = sum(op.ms for op in ops)
        saving = ms - max(op.ms for op in ops)
        if not _worth(saving, step_ms):
            continue
        findings.append(
            Finding(
                kind="matmul-shape",
                title=(
                    f"{len(ops)} tiny matmuls per step from one line ({ms:.3f} ms of device time, "
                    f"each under {T.SHORT_OP_US:g} us): launch-bound"
                ),
                where=where,
                est_saving_ms=saving,
                bytes_avoidable=0.0,
                fix=fixes.text("matmul-shape", "tiny"),
                evidence=dict(
                    measured_ms=ms,
                    matmuls=len(ops),
                    longest_us=max(op.ms for op in ops) * 1e3,
                    assumption=(
                        "one batched matmul takes about as long as the longest of them; the host "
                        "launch gaps between them are not counted"
                    ),
                ),
            )
        )
    return findings
