import time, torch, triton, fusewise, torch.nn.functional as F, sys
from fusewise.ops import _norm_launch as L, _norm_op as O
from fusewise import hardware
sys.path.insert(0, ".site")
from liger_kernel.ops.rms_norm import LigerRMSNormFunction
xs = torch.randn(8, 256, device="cuda", requires_grad=True); ws = torch.randn(256, device="cuda", requires_grad=True); dys = torch.randn(8, 256, device="cuda")
def host_us(f, n=300):
    for _ in range(20): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): f()
    torch.cuda.synchronize(); return (time.perf_counter()-t)/n*1e6
acc = {}
orig = O.backward_impl
def timed(*a):
    t = time.perf_counter(); r = orig(*a); acc.setdefault("backward_impl", []).append(time.perf_counter() - t); return r
O.backward_impl = timed
origb = O._backward
def timedb(ctx, dy, dh, impl):
    t = time.perf_counter(); r = origb(ctx, dy, dh, impl); acc.setdefault("_backward", []).append(time.perf_counter() - t); return r
O._backward = timedb
for name, f in [("ops fwd", lambda: fusewise.ops.rms_norm(xs.detach(), ws.detach())),
                ("ops fwd+bwd", lambda: torch.autograd.grad(fusewise.ops.rms_norm(xs, ws), [xs, ws], dys)),
                ("liger fwd+bwd", lambda: torch.autograd.grad(LigerRMSNormFunction.apply(xs, ws, 1e-6), [xs, ws], dys)),
                ("torch fwd+bwd", lambda: torch.autograd.grad(F.rms_norm(xs, (256,), ws), [xs, ws], dys))]:
    print(f"host {name}: {host_us(f):.0f} us/call", flush=True)
for k, v in acc.items(): print(f"  inside backward: {k} {sorted(v)[len(v)//2]*1e6:.0f} us median")
ceil = hardware.measure_bandwidth(torch.device("cuda"))
for n in [256, 4096, 16384]:
    m = (1 << 27) // n
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True); w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    for name, fn in [("fusewise", lambda: torch.autograd.grad(fusewise.ops.rms_norm(x, w), [x, w], dy)), ("liger", lambda: torch.autograd.grad(LigerRMSNormFunction.apply(x, w, 1e-6), [x, w], dy))]:
        ms = triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
        print(f"rms fwd+bwd N={n} {name}: {5*x.numel()*2/ms/1e6/ceil*100:.1f}% of copy", flush=True)
