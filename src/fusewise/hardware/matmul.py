"""Matmul rates per dtype: the datasheet table, the measurement, and torch's fp32 matmul settings.

A matmul's ceiling depends on the dtype it runs in: on an H100/H200 fp32 without TF32 runs on the
SIMT cores (~67 TFLOP/s on the datasheet), TF32 on the tensor cores at about half the bf16 rate,
bf16/fp16 at ~989, fp8 at twice that. Judging an fp32 matmul against the bf16 ceiling says "6%
of the ceiling" where the truth is "fp32, with TF32 off". Keys: "fp32" (TF32 off), "tf32",
"bf16", "fp16", "fp8" (e4m3, torch._scaled_mm; compute capability >= 8.9).
"""

from __future__ import annotations

import contextlib

import torch

RATE_KEYS = ("fp32", "tf32", "bf16", "fp16", "fp8")

# name fragment -> dense TFLOP/s per key (no sparsity). Sources: NVIDIA H100/H200 datasheets (SXM:
# fp32 67, tf32 494.7, bf16/fp16 989.4, fp8 1978.9; H100 PCIe: 51, 378, 756, 1513); A100
# datasheet (19.5, 156, 312, 312; no fp8); L4 datasheet (30.3, 60, 121, 121, 242.5: the sparse
# figures halved); A10 datasheet (31.2, 62.5, 125, 125); RTX 4090 Ada whitepaper (82.6, 82.6,
# 165.2, 165.2 with fp32 accumulate, fp8 330.3 with fp32 accumulate). Same order as DATASHEET.
DATASHEET_MATMUL: dict[str, dict[str, float]] = {
    "H200": dict(fp32=67.0, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9),
    "H100 PCIe": dict(fp32=51.0, tf32=378.0, bf16=756.0, fp16=756.0, fp8=1513.0),
    "H100": dict(fp32=67.0, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9),
    "A100": dict(fp32=19.5, tf32=156.0, bf16=312.0, fp16=312.0),
    "L4": dict(fp32=30.3, tf32=60.0, bf16=121.0, fp16=121.0, fp8=242.5),
    "A10": dict(fp32=31.2, tf32=62.5, bf16=125.0, fp16=125.0),
    "RTX 4090": dict(fp32=82.6, tf32=82.6, bf16=165.2, fp16=165.2, fp8=330.3),
}

_FP8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
_KEY_OF_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def rate_key(dtype, tf32: bool = False) -> str | None:
    """The rate key of a matmul in `dtype` (a torch.dtype or its name, "float32" or
    "torch.float32"); tf32: whether fp32 matmuls may use TF32. None for a dtype without a matmul
    ceiling of its own here (float64, integers)."""
    name = str(dtype).replace("torch.", "")
    if name in _FP8:
        return "fp8"
    key = _KEY_OF_DTYPE.get(name)
    if key == "fp32" and tf32:
        return "tf32"
    return key


def datasheet_matmul(name: str) -> dict[str, float] | None:
    for fragment, rates in DATASHEET_MATMUL.items():
        if fragment in name:
            return dict(rates)
    return None


# --- torch's fp32 matmul settings ---------------------------------------------------------------


def _new_api() -> bool:
    """torch >= 2.9 has per-backend fp32 precision (torch.backends.*.fp32_precision); reading a
    legacy flag (allow_tf32, get_float32_matmul_precision) after it was set raises there."""
    return hasattr(torch.backends.cuda.matmul, "fp32_precision")


def _effective(specific: str, generic: str) -> bool:
    """TF32 under the new API: the backend's own setting, or the generic one where it says
    "none" (inherit)."""
    return specific == "tf32" or (specific == "none" and generic == "tf32")


def matmul_settings() -> dict:
    """What decides whether an fp32 matmul may run as TF32, as set now: torch's float32 matmul
    precision ("highest" = no TF32 on CUDA; "high"/"medium" allow it; None when the legacy and
    the new API were mixed and torch refuses to say), whether cuBLAS matmuls may use TF32, and
    whether cuDNN convolutions may (on by default). Read through the new per-backend API where
    torch has it, so that reading never raises."""
    try:
        precision = torch.get_float32_matmul_precision()
    except RuntimeError:  # legacy and new API mixed: the per-backend values below still hold
        precision = None
    b = torch.backends
    if _new_api():
        matmul = _effective(b.cuda.matmul.fp32_precision, b.fp32_precision)
        conv = _effective(b.cudnn.conv.fp32_precision, b.cudnn.fp32_precision)
        if b.cudnn.conv.fp32_precision == "none" and b.cudnn.fp32_precision == "none":
            conv = b.fp32_precision in ("tf32", "none")  # cuDNN's default is TF32
    else:
        matmul, conv = bool(b.cuda.matmul.allow_tf32), bool(b.cudnn.allow_tf32)
    return {
        "float32_matmul_precision": precision,
        "cuda.matmul.allow_tf32": matmul,
        "cudnn.allow_tf32": conv,
    }


def tf32_allowed(settings: dict | None, *, convolution: bool = False) -> bool | None:
    """Whether fp32 matmuls (or convolutions) of a step with these settings ran as TF32; None
    when the settings were not recorded."""
    if settings is None:
        return None
    if convolution:
        return bool(settings["cudnn.allow_tf32"])
    return bool(settings["cuda.matmul.allow_tf32"])


@contextlib.contextmanager
def cuda_tf32(enabled: bool):
    """cuBLAS fp32 matmuls as TF32 (enabled) or full fp32 inside the block, the user's setting put
    back after it, also on an error. Through the per-backend API where torch has it (setting and
    restoring it leaves torch's legacy getters working); the legacy flag otherwise."""
    m = torch.backends.cuda.matmul
    if _new_api():
        saved = m.fp32_precision
        m.fp32_precision = "tf32" if enabled else "ieee"
        try:
            yield
        finally:
            m.fp32_precision = saved
    else:
        saved = m.allow_tf32
        m.allow_tf32 = enabled
        try:
            yield
        finally:
            m.allow_tf32 = saved


# --- measuring ----------------------------------------------------------------------------------

# key -> (n, repetitions) of the n^3 matmul that measures it. 8192^3 bf16 is ~1.1 ms on an H200;
# fp32 without TF32 runs ~15x slower, so it gets 4096^3 (~2 ms). On the CPU: fp32 1024^3, and bf16
# at 512^3, since a CPU without bf16 units runs it many times slower than fp32.
_CUDA_SIZES = {"fp32": (4096, 5), "tf32": (8192, 5), "bf16": (8192, 10), "fp16": (8192, 10)}
_CUDA_SIZES["fp8"] = (8192, 10)
_CPU_SIZES = {"fp32": (1024, 3), "bf16": (512, 3)}


def fp8_supported(device: torch.device) -> bool:
    """fp8 matmuls (torch._scaled_mm, e4m3) need compute capability >= 8.9 (Ada, Hopper)."""
    return (
        device.type == "cuda"
        and hasattr(torch, "_scaled_mm")
        and torch.cuda.get_device_capability(device) >= (8, 9)
    )


def keys_to_measure(device: torch.device) -> tuple[str, ...]:
    if device.type != "cuda":
        return tuple(_CPU_SIZES)
    return tuple(k for k in _CUDA_SIZES if k != "fp8" or fp8_supported(device))


def matmul_fn(m: int, n: int, k: int, key: str, device, generator=None, batch: int = 1):
    """A zero-argument callable running [batch,] [m, k] @ [k, n] in the dtype of `key` on random
    data (fp8: e4m3 through torch._scaled_mm, unit scales, bf16 out). Under "tf32" the caller
    sets the precision (cuda_tf32): this only builds the operands."""
    if key == "fp8":
        a = torch.randn(m, k, device=device, generator=generator).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device, generator=generator).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}.get(
        key, torch.float16
    )
    lead = (batch,) if batch > 1 else ()
    a = torch.randn(*lead, m, k, dtype=dtype, device=device, generator=generator)
    b = torch.randn(*lead, k, n, dtype=dtype, device=device, generator=generator)
    return lambda: a @ b


def measure_matmul_rate(device: torch.device, key: str, timer, generator) -> float:
    """TFLOP/s of an n^3 matmul of `key` (sizes above), timed by timer(fn, reps) in seconds."""
    n, reps = (_CUDA_SIZES if device.type == "cuda" else _CPU_SIZES)[key]
    fn = matmul_fn(n, n, n, key, device, generator)
    with cuda_tf32(key == "tf32"):
        seconds = timer(fn, reps)
    return 2 * n**3 / seconds / 1e12
