"""Numbers shown to a reader, shared by the text and HTML renderers."""

from __future__ import annotations

_ORDER = ("fp32", "tf32", "bf16", "fp16", "fp8")


def rate(tflops: float) -> str:
    """A FLOP rate in the unit that keeps its digits: a CPU's 0.05 TFLOP/s is "50.0 GFLOP/s",
    never "0.0 TFLOP/s"."""
    if tflops >= 1:
        return f"{tflops:,.1f} TFLOP/s"
    return f"{tflops * 1e3:,.1f} GFLOP/s"


def matmul_rates(device: dict) -> str:
    """The device's matmul ceilings in words: "matmul fp32 51.2, tf32 ..., bf16 ... TFLOP/s" per
    dtype when they were measured (fp32 = TF32 off), else the headline alone. Reads a report dict
    of any fusewise version (the per-dtype fields are newer than the headline)."""
    rates = device.get("matmul_by_dtype") or {}
    if not rates:
        return f"matmul {rate(device['matmul_TFLOPs'])}"
    keys = [k for k in _ORDER if k in rates] + sorted(k for k in rates if k not in _ORDER)
    return "matmul " + ", ".join(f"{k} {rate(rates[k])}" for k in keys)
