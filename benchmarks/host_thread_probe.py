"""Why a Python autograd.Function's backward costs about twice its host time on CUDA tensors
(issue #14; results README, 2026-12-02 evening: every piece ~2x slower inside a forward+backward,
thread CPU time = wall time). autograd runs a CUDA graph's backward on its device thread; this
times the same pure-Python work, a torch.empty on the device and a small op's launch, on the main
thread and inside a backward on that thread, interleaved, with the CPU each thread ran on.

    PYTHONPATH=src python benchmarks/host_thread_probe.py [--calls 400]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch


def _cpu_of_this_thread() -> int:
    with open(f"/proc/self/task/{threading.get_native_id()}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])  # field 39: the CPU it last ran on


def python_work() -> float:
    t = time.perf_counter()
    s = 0
    for i in range(300):
        s += i * i % 7
    return time.perf_counter() - t


def empty_work(dev) -> float:
    t = time.perf_counter()
    for _ in range(10):
        torch.empty(4096, device=dev)
    return time.perf_counter() - t


def launch_work(x) -> float:
    t = time.perf_counter()
    for _ in range(10):
        x.add_(1.0)
    return time.perf_counter() - t


PIECES = {
    "python": lambda x: python_work(),
    "empty": lambda x: empty_work(x.device),
    "launch": launch_work,
}
seen: dict = {}


class Probe(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        buf = torch.zeros(8, device=g.device)
        for name, fn in PIECES.items():
            seen.setdefault(("backward", name), []).append(fn(buf))
        seen.setdefault("cpus_backward", set()).add(_cpu_of_this_thread())
        return g


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.zeros(8, device=dev, requires_grad=True)
    buf = torch.zeros(8, device=dev)
    for _ in range(20):
        Probe.apply(x).sum().backward()
    seen.clear()
    for _ in range(args.calls):
        for name, fn in PIECES.items():
            seen.setdefault(("main", name), []).append(fn(buf))
        seen.setdefault("cpus_main", set()).add(_cpu_of_this_thread())
        Probe.apply(x).sum().backward()
    if dev == "cuda":
        torch.cuda.synchronize()
    print(
        f"device {dev}; main thread ran on CPUs {sorted(seen['cpus_main'])}, the backward on "
        f"{sorted(seen['cpus_backward'])}"
    )
    print(f"{'piece':<8}{'main us':>10}{'backward us':>13}{'ratio':>7}")
    for name in PIECES:
        a = statistics.median(seen[("main", name)]) * 1e6
        b = statistics.median(seen[("backward", name)]) * 1e6
        print(f"{name:<8}{a:>10.1f}{b:>13.1f}{b / a:>7.2f}")


if __name__ == "__main__":
    main()
