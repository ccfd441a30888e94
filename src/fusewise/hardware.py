"""Device ceilings: memory bandwidth and matmul rate, measured once per device and cached.

The roofline needs two numbers per device: how fast memory can be streamed (a large
device-to-device copy, counting bytes read plus bytes written) and how fast the matrix unit runs
(a large bf16 matmul on random data; fp32 on the CPU). Their ratio is the ridge point in FLOP/byte:
an op whose intensity is below it is memory-bound and can only be helped by moving fewer bytes.

Measured numbers are cached on disk, keyed by device name and library versions, so a diagnosis does
not pay for the measurement again. The datasheet table is a fallback (``measure=False``) and a
comparison: datasheet peaks are rarely reached, which is why fusewise measures.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

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

    @property
    def ridge(self) -> float:
        """FLOP per byte at which an op stops being memory-bound."""
        return self.matmul_TFLOPs * 1e12 / (self.bandwidth_GBps * 1e9)

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


def measure_matmul(device: torch.device) -> float:
    """TFLOP/s of a large matmul on random data: bf16 8192^3 on a GPU, fp32 1024^3 on the CPU."""
    if device.type == "cuda":
        n, dtype, reps = 8192, torch.bfloat16, 10
    else:
        n, dtype, reps = 1024, torch.float32, 3
    rng = _rng(device)
    a = torch.randn(n, n, dtype=dtype, device=device, generator=rng)
    b = torch.randn(n, n, dtype=dtype, device=device, generator=rng)
    timer = _time_cuda if device.type == "cuda" else _time_cpu
    seconds = timer(lambda: a @ b, reps=reps)
    return 2 * n**3 / seconds / 1e12


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
        return Ceilings(name, device.type, sheet_bw, sheet_mm, "datasheet", sheet_bw, sheet_mm)

    key = f"{name} | {versions()}"
    path = _cache_path()
    cache = {}
    if path.exists():
        try:
            cache = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            cache = {}  # a corrupt cache is re-measured, not trusted
    if key in cache and not refresh:
        c = cache[key]
        return Ceilings(
            name,
            device.type,
            c["bandwidth_GBps"],
            c["matmul_TFLOPs"],
            "measured",
            sheet_bw,
            sheet_mm,
            versions(),
        )
    with torch.device(device):
        bw, mm = measure_bandwidth(device), measure_matmul(device)
    cache[key] = {"bandwidth_GBps": bw, "matmul_TFLOPs": mm, "measured_at": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cache, indent=1))
    except OSError:
        pass  # a read-only home still gets the measured numbers, just not cached
    return Ceilings(name, device.type, bw, mm, "measured", sheet_bw, sheet_mm, versions())
