"""How long the op-graph recorder takes on a ~1e9-parameter step (meta tensors: no data, so the
time is the recorder's own per-op cost), and the recorded/plain ratio of the example GPT step
on this machine's device. python benchmarks/capture_overhead.py"""

import statistics
import time

import torch

from fusewise.capture.opgraph import Recorder
from fusewise.examples.gpt import GPT, GPTConfig, make_step


def main():
    c = GPTConfig(vocab=128256, seq=2048, d_model=2048, heads=16, layers=12, batch=4)
    with torch.device("meta"):
        model = GPT(c, "naive")
    n = sum(p.numel() for p in model.parameters())
    idx = torch.zeros(c.batch, c.seq, dtype=torch.long, device="meta")
    t = time.perf_counter()
    with Recorder() as rec:
        model(idx, idx).backward()
    print(
        f"{n / 1e9:.2f}e9-parameter forward+backward: {len(rec.graph.ops)} ops recorded in "
        f"{time.perf_counter() - t:.2f} s (meta tensors)"
    )
    cuda = torch.cuda.is_available()
    step, _, _ = make_step(device="cuda" if cuda else "cpu")
    for _ in range(3):
        step()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    with Recorder():
        step()
        if cuda:
            torch.cuda.synchronize()
    rec_s = time.perf_counter() - t
    print(
        f"example step: {statistics.median(times) * 1e3:.1f} ms plain, {rec_s * 1e3:.1f} ms "
        f"recorded (x{rec_s / statistics.median(times):.2f})"
    )


if __name__ == "__main__":
    main()
