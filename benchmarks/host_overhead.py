"""Host time per eager call (small tensors, so the GPU is never the limit): fusewise against
torch and, when installed, Liger. This is the overhead an eager step pays per norm; at 2**27 bf16
elements it is comparable to the kernels' own time (benchmarks/results/README.md). GPU only."""

import time

import torch
import torch.nn.functional as F

import fusewise


def host_us(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main():
    x = torch.randn(8, 256, device="cuda", requires_grad=True)
    w = torch.randn(256, device="cuda", requires_grad=True)
    dy = torch.randn(8, 256, device="cuda")
    cases = {
        "fusewise rms_norm fwd": lambda: fusewise.ops.rms_norm(x.detach(), w.detach()),
        "fusewise rms_norm fwd+bwd": lambda: torch.autograd.grad(
            fusewise.ops.rms_norm(x, w), [x, w], dy
        ),
        "torch F.rms_norm fwd+bwd": lambda: torch.autograd.grad(
            F.rms_norm(x, (256,), w), [x, w], dy
        ),
    }
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        cases["liger rms_norm fwd+bwd"] = lambda: torch.autograd.grad(
            LigerRMSNormFunction.apply(x, w, 1e-6), [x, w], dy
        )
    except ImportError:
        print("# liger: not installed, skipped")
    for name, fn in cases.items():
        print(f"{name:28s} {host_us(fn):6.0f} us/call")


if __name__ == "__main__":
    main()
