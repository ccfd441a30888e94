"""Peak memory and time of one Llama MLP block's forward+backward: transformers' LlamaMLP (hidden
4096, intermediate 14336, SiLU) on x [16384, 4096] bf16, as eager, fusewise.patch(mlp), Liger's
LigerSwiGLUMLP and torch.compile(mlp), each variant in its own process (Liger's classes and
torch.compile's caches stay out of the others).

Step: y = mlp(x); y.backward(dy); gradients set to None (x's and the weights'), so every step
allocates its weight gradients as a training step does. Weights: the same seed in every variant
(Liger's module loads the eager one's state_dict). Peak: torch.cuda.max_memory_allocated over the
timed steps, reset after warm-up, minus what was allocated before them (weights, x, dy): the
activations autograd keeps, the gradients and the backward's temporaries. Time: the median of
the timed steps, each between two CUDA events. Checksums of y and of the gate_proj gradient show
that the variants compute the same thing.

Expected from the saved tensors (T tokens, H hidden, I intermediate, s bytes; B = T·I·s = 470 MB
here): eager keeps gate, silu(gate), up and the product (4B); Liger keeps gate, up and the product
(3B); fusewise.patch keeps gate and up only (2B): down_proj and the gated product are one autograd
node that recomputes the product in the backward (ops/gated/down.py). The backward's peak, with y
(T·H·s) and down_proj's weight gradient (H·I·s) alive: eager in the product's backward (gate,
silu(gate), up, dh and the two new gradients: 6B); Liger in down_proj's backward (gate, up, the
product, dh: 4B), since its gated backward writes dgate and dup over gate and up
(LigerSiLUMulFunction works in place); fusewise in its fused node (gate, up and the recomputed
product while down_proj's weight gradient is taken, then gate, up and dh after the product is
freed; dgate and dup are written over gate and up: 3B). Before the fused node fusewise kept the
product too and allocated dgate and dup (5B). expected_peaks() prints these.

    python benchmarks/_mlp_block.py --csv out.csv
    python benchmarks/_mlp_block.py --tiny           # CPU smoke test (peak memory n/a)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

if "--tiny" in sys.argv and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # fusewise's kernels in the interpreter

import _rows  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

VARIANTS = ("eager", "fusewise", "liger", "compile")
FULL = dict(hidden=4096, inter=14336, tokens=16384, steps=10, warmup=3)
TINY = dict(hidden=64, inter=160, tokens=96, steps=2, warmup=1)


class Skipped(Exception):
    """A variant that cannot run here (reason printed, no row)."""


def build(variant: str, cfg: dict, device: torch.device):
    """The MLP block of `variant` in bf16 on `device`, and what was done to it."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = LlamaConfig(
        hidden_size=cfg["hidden"], intermediate_size=cfg["inter"], hidden_act="silu"
    )
    torch.manual_seed(0)
    with torch.device(device):
        mlp = LlamaMLP(config).to(torch.bfloat16)
    if variant == "eager":
        return mlp, "transformers LlamaMLP as built"
    if variant == "compile":
        return torch.compile(mlp), "torch.compile(LlamaMLP)"
    if variant == "fusewise":
        import fusewise

        report = fusewise.patch(mlp)
        if not any(c.action == "swapped" for c in report):
            raise RuntimeError(f"fusewise.patch swapped nothing: {report}")
        return mlp, str(report).replace("\n", "; ")
    if device.type != "cuda":
        raise Skipped("liger-kernel's kernels need a CUDA GPU")
    try:
        from liger_kernel.transformers.swiglu import LigerSwiGLUMLP
    except ImportError as e:
        raise Skipped(f"liger-kernel not importable ({e})") from e
    with torch.device(device):
        liger = LigerSwiGLUMLP(config).to(torch.bfloat16)
    liger.load_state_dict(mlp.state_dict())
    return liger, "liger_kernel.transformers.swiglu.LigerSwiGLUMLP (LlamaMLP's weights)"


def run_variant(variant: str, tiny: bool) -> dict:
    cfg = TINY if tiny else FULL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        mlp, note = build(variant, cfg, device)
    except Skipped as e:
        return dict(variant=variant, skipped=str(e))
    print(f"[{variant}] {note}", flush=True)
    g = torch.Generator(device=device).manual_seed(1)
    shape = (cfg["tokens"], cfg["hidden"])
    x = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=g).requires_grad_()
    dy = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=g)
    params = list(mlp.parameters())

    def step():
        y = mlp(x)
        y.backward(dy)
        return y.detach()

    def clear():
        x.grad = None
        for p in params:
            p.grad = None

    for _ in range(cfg["warmup"]):
        y = step()
        checks = (y.float().norm().item(), params[0].grad.float().norm().item())  # gate_proj's
        del y
        clear()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    ms = []
    for _ in range(cfg["steps"]):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            clear()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            step()
            clear()
            ms.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated() - base if cuda else None
    return dict(
        variant=variant, note=note, ms=statistics.median(ms), peak_bytes=peak, checks=checks, **cfg
    )


def spawn(variant: str, tiny: bool, timeout: float) -> dict:
    """One variant in a fresh interpreter; its output goes straight to ours."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, os.path.abspath(__file__), "--variant", variant, "--result", path]
    cmd += ["--tiny"] if tiny else []
    try:
        rc = subprocess.run(cmd, timeout=timeout).returncode
        with open(path) as f:
            text = f.read()
        return json.loads(text) if rc == 0 and text else dict(variant=variant, failed=f"rc {rc}")
    except subprocess.TimeoutExpired:
        return dict(variant=variant, failed=f"killed after {timeout:.0f} s")
    finally:
        os.unlink(path)


def expected_peaks(cfg: dict) -> dict[str, float]:
    """Peak extra bytes by the saved-tensor count of the module docstring (bf16): [T, I]
    tensors alive at each variant's peak, plus y and down_proj's weight gradient."""
    s = 2
    big, y = cfg["tokens"] * cfg["inter"] * s, cfg["tokens"] * cfg["hidden"] * s
    dw = cfg["hidden"] * cfg["inter"] * s
    return {v: n * big + y + dw for v, n in (("eager", 6), ("fusewise", 3), ("liger", 4))}


def summary(results: list[dict]) -> str:
    lines = ["\n# MLP block forward+backward: ms, peak extra GB, checksums |y|, |dW_gate|"]
    for r in results:
        if "ms" not in r:
            lines.append(f"{r['variant']:9s} {r.get('skipped') or r.get('failed')}")
            continue
        peak = f"{r['peak_bytes'] / 1e9:7.3f}" if r["peak_bytes"] is not None else "    n/a"
        lines.append(
            f"{r['variant']:9s} {r['ms']:9.3f} ms  peak {peak} GB  "
            f"|y| {r['checks'][0]:.5g}  |dW_gate| {r['checks'][1]:.5g}"
        )
    cfg = next((r for r in results if "tokens" in r), None)
    if cfg:
        model = ", ".join(f"{v} {b / 1e9:.3f}" for v, b in expected_peaks(cfg).items())
        lines.append(f"expected peak extra GB by the saved-tensor count: {model}")
    by = {r["variant"]: r for r in results if r.get("peak_bytes") is not None}
    if "fusewise" not in by:
        lines.append("issue #13 memory target: not checked (no GPU peak of fusewise)")
        return "\n".join(lines)
    fw = by["fusewise"]["peak_bytes"]
    for peer, want, ok in (
        ("eager", "below", lambda p: fw < p),
        ("liger", "at or below", lambda p: fw <= p),
    ):
        if peer in by:
            verdict = "met" if ok(by[peer]["peak_bytes"]) else "NOT met"
            lines.append(
                f"issue #13: fusewise peak {fw / 1e9:.3f} GB {want} {peer}'s "
                f"{by[peer]['peak_bytes'] / 1e9:.3f} GB: {verdict}"
            )
        else:
            lines.append(f"issue #13: fusewise peak vs {peer}'s: not checked ({peer} did not run)")
    return "\n".join(lines)


def make_row(r: dict, commit: str) -> dict:
    shape = f"T{r['tokens']}xH{r['hidden']}xI{r['inter']}"
    peak = r["peak_bytes"] if r["peak_bytes"] is not None else ""
    # the value column: tokens per second (a memory benchmark first; no byte model for GEMMs)
    tokens_per_s = r["tokens"] / r["ms"] * 1e3
    args = ("llama_mlp_block", r["variant"], "fwd_bwd", shape, "bf16", r["ms"], tokens_per_s)
    return _rows.row(*args, peak=peak, commit_id=commit)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # child: one variant in this process
    ap.add_argument("--result", help=argparse.SUPPRESS)  # child -> parent JSON
    ap.add_argument("--tiny", action="store_true", help="small shapes; runs on the CPU too")
    ap.add_argument("--timeout", type=float, default=150, help="seconds per variant process")
    ap.add_argument("--csv", default=None)
    a = ap.parse_args(argv)
    if a.variant:
        result = run_variant(a.variant, a.tiny)
        with open(a.result, "w") as f:
            json.dump(result, f)
        return
    names = a.variants.split(",")
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if not torch.cuda.is_available():
        if not a.tiny:
            sys.exit("_mlp_block.py measures GPU memory; no CUDA device is present (--tiny runs)")
        print("# CPU smoke test: peak memory n/a (torch counts CUDA allocations only)")
    commit = _rows.commit()
    results = [spawn(v, a.tiny, a.timeout) for v in names]
    if a.csv:
        _rows.append_csv(a.csv, [make_row(r, commit) for r in results if "ms" in r])
    print(summary(results), flush=True)


if __name__ == "__main__":
    main()
