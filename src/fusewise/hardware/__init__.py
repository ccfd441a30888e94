"""Device ceilings: memory bandwidth and matmul rates, measured once per device and cached.

The roofline needs two numbers per device: how fast memory can be streamed (a large
device-to-device copy, counting bytes read plus bytes written) and how fast the matrix unit runs
(a large matmul on random data). Their ratio is the ridge point in FLOP/byte: an op whose
intensity is below it is memory-bound and can only be helped by moving fewer bytes. The matmul
rate depends on the dtype (hardware/matmul.py): it is measured for fp32 with TF32 off, TF32, bf16,
fp16 and fp8 where the GPU has it (fp32 and bf16 on the CPU); `matmul_TFLOPs` is the headline
(bf16 on a GPU, fp32 on the CPU) and `matmul_for(dtype, tf32=)` the rate of a dtype.

Measured numbers are cached on disk, keyed by device name and library versions, so a diagnosis does
not pay for the measurement again. The datasheet table is a fallback (``measure=False``) and a
comparison: datasheet peaks are rarely reached, which is why fusewise measures.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .matmul import (
    RATE_KEYS,
    cuda_tf32,
    datasheet_matmul,
    fp8_supported,
    keys_to_measure,
    matmul_settings,
    measure_matmul_rate,
    rate_key,
    tf32_allowed,
)

__all__ = [
    "RATE_KEYS",
    "Ceilings",
    "ceilings",
    "cuda_tf32",
    "datasheet",
    "datasheet_matmul",
    "device_name",
    "fp8_supported",
    "matmul_settings",
    "measure_bandwidth",
    "measure_matmul",
    "measure_matmuls",
    "rate_key",
    "tf32_allowed",
    "versions",
]

# A cache entry's layout; an entry of another (older) layout is measured again, not read.
CACHE_SCHEMA = 2

# name fragment (as torch reports it) -> (memory bandwidth GB/s, dense bf16 TFLOP/s)
# Sources: NVIDIA H200 datasheet (141 GB HBM3e, 4.8 TB/s; 989 TFLOP/s bf16 dense = 1979 sparse / 2);
# NVIDIA H100 datasheet (SXM 3.35 TB/s, 989 TFLOP/s; PCIe 2.0 TB/s, 756 TFLOP/s);
# NVIDIA A100 datasheet (80GB SXM 2.039 TB/s, 40GB 1.555 TB/s, 312 TFLOP/s bf16 dense);
# NVIDIA L4 datasheet (300 GB/s, 121 TFLOP/s bf16 dense); NVIDIA A10 datasheet (600 GB/s, 125);
# RTX 4090 Ada whitepaper (1008 GB/s, 165 TFLOP/s bf16 dense with fp32 accumulate).
# More specific names first: lookup takes the first fragment found in the device name.
DATASHEET: dict[str, tuple[float, float]] = {
    "H200": (4800.0, 989.0),
    "H100 PCIe": (2000.0, 756.0),
    "H100": (3350.0, 989.0),
    "A100-SXM4-80GB": (2039.0, 312.0),
    "A100 80GB PCIe": (1935.0, 312.0),
    "A100": (1555.0, 312.0),
    "L4": (300.0, 121.0),
    "A10": (600.0, 125.0),
    "RTX 4090": (1008.0, 165.0),
}


@dataclass(frozen=True)
class Ceilings:
    device_name: str
    device_type: str  # "cuda" or "cpu"
    bandwidth_GBps: float  # bytes read + written per second, / 1e9
    matmul_TFLOPs: float
    source: str  # "measured" or "datasheet"
    datasheet_bandwidth_GBps: float | None = None
    datasheet_matmul_TFLOPs: float | None = None
    versions: str = ""
    # TFLOP/s per rate key (hardware/matmul.py RATE_KEYS: fp32 = TF32 off, tf32, bf16, fp16, fp8),
    # measured or from the datasheet as `source` says; empty when only the headline is known
    matmul_by_dtype: dict = field(default_factory=dict)

    @property
    def headline_key(self) -> str:
        """The dtype of matmul_TFLOPs: bf16 on a GPU, fp32 on the CPU."""
        return "bf16" if self.device_type == "cuda" else "fp32"

    def matmul_for(self, dtype, tf32: bool = False) -> float | None:
        """TFLOP/s of a matmul in `dtype` (torch.dtype or name; tf32: fp32 allowed to run as
        TF32), or None when this device has no rate for it (float64, integers, fp8 on a GPU
        without it, or ceilings that know only their headline)."""
        return self.rate(rate_key(dtype, tf32))

    def rate(self, key: str | None) -> float | None:
        """TFLOP/s of a rate key ("fp32", "tf32", "bf16", "fp16", "fp8"), None when unknown."""
        if key in self.matmul_by_dtype:
            return self.matmul_by_dtype[key]
        return self.matmul_TFLOPs if key == self.headline_key else None

    @property
    def ridge(self) -> float:
        """FLOP per byte at which an op stops being memory-bound (at the headline rate)."""
        return self.matmul_TFLOPs * 1e12 / (self.bandwidth_GBps * 1e9)

    def ridge_for(self, tflops: float) -> float:
        """The ridge point against another compute ceiling (a dtype's matmul rate)."""
        return tflops * 1e12 / (self.bandwidth_GBps * 1e9)

    def seconds_for_bytes(self, nbytes: float) -> float:
        return nbytes / (self.bandwidth_GBps * 1e9)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["ridge"] = self.ridge
        return d


def versions() -> str:
    import triton

    cuda = torch.version.cuda or "none"
    return f"torch {torch.__version__}, triton {triton.__version__}, cuda {cuda}"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"CPU {platform.processor() or platform.machine()} x{os.cpu_count()}"


def datasheet(name: str) -> tuple[float, float] | None:
    for fragment, numbers in DATASHEET.items():
        if fragment in name:
            return numbers
    return None


def _cache_path() -> Path:
    root = os.environ.get("FUSEWISE_CACHE_DIR") or Path.home() / ".cache" / "fusewise"
    return Path(root) / "ceilings.json"


def _time_cuda(fn, reps: int) -> float:
    """Median seconds of fn() on the current stream, timed with CUDA events after a warm-up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _time_cpu(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _rng(device: torch.device) -> torch.Generator:
    """A generator of our own: measuring must not advance the user's random state (a diagnosis
    measures on a cold cache, in the middle of a run that must stay reproducible)."""
    return torch.Generator(device=device).manual_seed(0)


def measure_bandwidth(device: torch.device) -> float:
    """GB/s of a large copy, counting bytes read plus bytes written (2 GiB on a GPU)."""
    nbytes = (1 << 30) if device.type == "cuda" else (1 << 27)
    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=device, generator=_rng(device))
    dst = torch.empty_like(src)
    timer = _time_cuda if device.type == "cuda" else _time_cpu
    seconds = timer(lambda: dst.copy_(src), reps=20 if device.type == "cuda" else 5)
    return 2 * nbytes / seconds / 1e9


def measure_matmuls(device: torch.device) -> dict[str, float]:
    """TFLOP/s per rate key of a large matmul on random data (sizes in hardware/matmul.py); each
    fp32 / TF32 measurement under its own precision setting, the user's put back afterwards."""
    timer = _time_cuda if device.type == "cuda" else _time_cpu
    rates = {}
    for key in keys_to_measure(device):
        try:
            rates[key] = measure_matmul_rate(device, key, timer, _rng(device))
        except RuntimeError as e:
            if key != "fp8":
                raise
            # torch._scaled_mm refuses some builds and layouts: the rate stays unknown, said once
            warnings.warn(f"fusewise: fp8 matmul rate not measured ({e})", stacklevel=2)
    return rates


def measure_matmul(device: torch.device) -> float:
    """TFLOP/s of the headline matmul: bf16 8192^3 on a GPU, fp32 1024^3 on the CPU."""
    key = "bf16" if device.type == "cuda" else "fp32"
    timer = _time_cuda if device.type == "cuda" else _time_cpu
    return measure_matmul_rate(device, key, timer, _rng(device))


def ceilings(
    device: torch.device | str | None = None, *, measure: bool = True, refresh: bool = False
) -> Ceilings:
    """The device's ceilings: measured once and cached, or from the datasheet if measure=False.

    device defaults to the current CUDA device when there is one, else the CPU.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    name = device_name(device)
    sheet = datasheet(name) if device.type == "cuda" else None
    sheet_bw, sheet_mm = sheet if sheet else (None, None)
    if not measure:
        if sheet is None:
            raise ValueError(f"no datasheet figures for {name!r}; call ceilings(measure=True)")
        rates = datasheet_matmul(name) or {}
        return Ceilings(
            name, device.type, sheet_bw, sheet_mm, "datasheet", sheet_bw, sheet_mm, "", rates
        )

    key = f"{name} | {versions()}"
    path = _cache_path()
    cache = {}
    if path.exists():
        try:
            cache = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            cache = {}  # a corrupt cache is re-measured, not trusted
    c = cache.get(key)
    if c is not None and not refresh and c.get("schema") == CACHE_SCHEMA:
        return Ceilings(
            name,
            device.type,
            c["bandwidth_GBps"],
            c["matmul_TFLOPs"],
            "measured",
            sheet_bw,
            sheet_mm,
            versions(),
            dict(c["matmul_by_dtype"]),
        )
    # not cached, refreshed, or cached by an older fusewise without the per-dtype rates
    headline = "bf16" if device.type == "cuda" else "fp32"
    with torch.device(device):
        bw, rates = measure_bandwidth(device), measure_matmuls(device)
    mm = rates[headline]
    cache[key] = {
        "schema": CACHE_SCHEMA,
        "bandwidth_GBps": bw,
        "matmul_TFLOPs": mm,
        "matmul_by_dtype": rates,
        "measured_at": time.time(),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cache, indent=1))
    except OSError:
        pass  # a read-only home still gets the measured numbers, just not cached
    return Ceilings(name, device.type, bw, mm, "measured", sheet_bw, sheet_mm, versions(), rates)


def time_matmul_ms(m: int, n: int, k: int, key: str, *, batch: int = 1, device="cuda") -> float:
    """Median ms of one [batch,] [m, k] @ [k, n] matmul of rate key `key` on random data, under
    that key's fp32 precision (the user's setting put back): the matmul-shape finding times an
    unaligned shape against its padded one with this."""
    from .matmul import cuda_tf32, matmul_fn

    device = torch.device(device)
    timer = _time_cuda if device.type == "cuda" else _time_cpu
    fn = matmul_fn(m, n, k, key, device, _rng(device), batch=batch)
    with cuda_tf32(key == "tf32"):
        return timer(fn, 5) * 1e3
