"""Where an eager fusewise LayerNorm call's host time goes, piece by piece (issue #14): the same
8 x 4,096 bf16 case as host_overhead.py, timed per piece (microseconds per call, GPU only).

python benchmarks/host_breakdown.py
"""

import time

import torch
from host_overhead import M, N, inputs  # benchmarks/ is on sys.path when run as a script

import fusewise
from fusewise.ops import _launch
from fusewise.ops.norms import kernels as K
from fusewise.ops.norms import launch, op


def host_us(fn, n=2000, rounds=5):
    """Median over rounds of the mean host time per call (the GPU never limits at this size)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    per_round = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        per_round.append((time.perf_counter() - t) / n * 1e6)
    return sorted(per_round)[rounds // 2]


class _Identity(torch.autograd.Function):
    """The cheapest Python autograd.Function: what apply + the engine's Python backward cost."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


def pieces():
    x, w, b, dy = inputs()
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    y = torch.empty_like(xd)
    mean = torch.empty(M, device="cuda")
    rstd = torch.empty(M, device="cuda")
    block_m, block_n, warps = launch.block_config(N)
    grid = (triton_cdiv(M, block_m),)
    fwd_args = (xd, xd, wd, bd, y, y, mean, rstd, M, N, N, N, 1e-5)
    fwd_meta = dict(
        IS_RMS=False,
        HAS_W=True,
        HAS_B=True,
        HAS_RES=False,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=warps,
    )
    compiled = K.norm_fwd_block_kernel[grid](*fwd_args, **fwd_meta)
    consts = (False, True, True, False, block_m, block_n)
    stream = torch.cuda.current_stream().cuda_stream

    def direct():
        compiled.run(
            grid[0],
            1,
            1,
            stream,
            compiled.function,
            compiled.packed_metadata,
            None,
            None,
            None,
            *fwd_args,
            *consts,
        )

    _, _, mean_s, rstd_s = launch.norm_forward(xd, None, wd, bd, 1e-5, False)

    def ident():
        return torch.autograd.grad(_Identity.apply(x), (x,), dy)

    def fwd_bwd():
        return torch.autograd.grad(fusewise.ops.layer_norm(x, w, b), (x, w, b), dy)

    def single_thread():
        with torch.autograd.set_multithreading_enabled(False):
            return fwd_bwd()

    def timed_fwd_bwd():
        return _timed_pieces(fwd_bwd)

    extra = {
        "fwd+bwd, autograd multithreading off": single_thread,
        "fwd+bwd, time inside the launchers (below)": timed_fwd_bwd,
        "fwd+bwd, launch.norm_forward stubbed": _stubbed("forward", fwd_bwd),
        "fwd+bwd, launch.norm_backward stubbed": _stubbed("backward", fwd_bwd),
        "fwd+bwd, grad of x only": lambda: torch.autograd.grad(
            fusewise.ops.layer_norm(x, w, b), (x,), dy
        ),
    }
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction

        extra["liger layer_norm fwd+bwd"] = lambda: torch.autograd.grad(
            LigerLayerNormFunction.apply(x, w, b, 1e-5), (x, w, b), dy
        )
    except ImportError:
        pass
    return extra | {
        "torch.empty [8, 4096] bf16": lambda: torch.empty((M, N), dtype=x.dtype, device="cuda"),
        "fwd kernel launch, kernel[grid](...)": lambda: K.norm_fwd_block_kernel[grid](
            *fwd_args, **fwd_meta
        ),
        "fwd kernel launch, CompiledKernel.run": direct,
        "fwd kernel launch, fusewise _launch.launch": lambda: _launch.launch(
            K.norm_fwd_block_kernel, grid, *fwd_args, **fwd_meta
        ),
        "launch.norm_forward (alloc + launch)": lambda: launch.norm_forward(
            xd, None, wd, bd, 1e-5, False
        ),
        "launch.norm_backward (alloc + 2 launches)": lambda: launch.norm_backward(
            dy, None, xd, wd, bd, mean_s, rstd_s, False
        ),
        "fusewise.ops.layer_norm, no grad": lambda: fusewise.ops.layer_norm(xd, wd, bd),
        "fusewise.ops.layer_norm, grad, fwd only": lambda: fusewise.ops.layer_norm(x, w, b),
        "fusewise layer_norm fwd+bwd": lambda: torch.autograd.grad(
            fusewise.ops.layer_norm(x, w, b), (x, w, b), dy
        ),
        "identity autograd.Function fwd+bwd": ident,
        "native x * 1 fwd+bwd": lambda: torch.autograd.grad(x * 1, (x,), dy),
        "torch F.layer_norm fwd+bwd": lambda: torch.autograd.grad(
            torch.nn.functional.layer_norm(x, (N,), w, b), (x, w, b), dy
        ),
        "op.forward_impl": lambda: op.forward_impl(xd, None, wd, bd, 1e-5, False),
    }


_inside = {"norm_forward": [0.0, 0.0, 0], "norm_backward": [0.0, 0.0, 0]}


def _timing(name, fn):
    """Wall and thread CPU time inside fn: a wall time well above the CPU time is waiting."""

    def wrapped(*args):
        t, c = time.perf_counter(), time.thread_time()
        out = fn(*args)
        _inside[name][0] += time.perf_counter() - t
        _inside[name][1] += time.thread_time() - c
        _inside[name][2] += 1
        return out

    return wrapped


def _stubbed(which, fn):
    """fn with launch.norm_forward or norm_backward replaced by allocations of its outputs."""

    def fwd_stub(x, residual, weight, bias, eps, is_rms):
        m = x.shape[0]
        f32 = torch.float32
        return (
            torch.empty_like(x),
            x.new_empty(0),
            x.new_empty(m, dtype=f32),
            x.new_empty(m, dtype=f32),
        )

    def bwd_stub(dy, dh, x, weight, bias, mean, rstd, is_rms):
        return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)

    def run():
        saved = launch.norm_forward, launch.norm_backward
        if which == "forward":
            launch.norm_forward = fwd_stub
        else:
            launch.norm_backward = bwd_stub
        try:
            return fn()
        finally:
            launch.norm_forward, launch.norm_backward = saved

    return run


def _timed_pieces(fn):
    saved = launch.norm_forward, launch.norm_backward
    launch.norm_forward = _timing("norm_forward", saved[0])
    launch.norm_backward = _timing("norm_backward", saved[1])
    try:
        return fn()
    finally:
        launch.norm_forward, launch.norm_backward = saved


def triton_cdiv(a, b):
    return -(-a // b)


def main():
    print(f"host us per call, {M} x {N} bf16, {torch.cuda.get_device_name()}")
    for name, fn in pieces().items():
        try:
            print(f"{name:45s} {host_us(fn):8.1f}")
        except Exception as e:  # one piece failing (a Triton API change) must not hide the rest
            print(f"{name:45s} failed: {type(e).__name__}: {e}")
    for name, (wall, cpu, calls) in _inside.items():
        calls = max(calls, 1)
        print(
            f"  inside {name:38s} {wall / calls * 1e6:8.1f}  (thread CPU {cpu / calls * 1e6:.1f})"
        )


def loop(seconds: float):
    """fwd+bwd for `seconds`, for a sampling profiler (py-spy) to watch."""
    fn = pieces()["fusewise layer_norm fwd+bwd"]
    end = time.perf_counter() + seconds
    calls = 0
    while time.perf_counter() < end:
        fn()
        calls += 1
    torch.cuda.synchronize()
    print(f"loop: {seconds / calls * 1e6:.1f} us per fwd+bwd")


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--loop":
        loop(float(sys.argv[2]))
    else:
        main()
