import time, threading, torch, triton, triton.language as tl, fusewise
from fusewise.ops import _norm_launch as L
xs = torch.randn(8, 256, device="cuda", requires_grad=True); ws = torch.randn(256, device="cuda", requires_grad=True); dys = torch.randn(8, 256, device="cuda")
def host_us(f, n=300):
    for _ in range(20): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): f()
    torch.cuda.synchronize(); return (time.perf_counter()-t)/n*1e6
@triton.jit
def k(X, N: tl.constexpr):
    tl.store(X + tl.arange(0, N), tl.load(X + tl.arange(0, N)) * 2)
class Trivial(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x): return x * 2
    @staticmethod
    def backward(ctx, g): return g * 2
class WithTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x): return x * 2
    @staticmethod
    def backward(ctx, g):
        g = g.clone(); k[(1,)](g, 256); return g
_, _, mean, rstd = L.norm_forward(xs.detach(), None, ws.detach(), None, 1e-6, True)
class WithNormBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x): return x * 2
    @staticmethod
    def backward(ctx, g):
        dx, dw, db = L.norm_backward(g, None, xs.detach(), ws.detach(), None, mean, rstd, True); return dx
for name, f in [("trivial fn", lambda: torch.autograd.grad(Trivial.apply(xs), [xs], dys)),
                ("triton-in-bwd fn", lambda: torch.autograd.grad(WithTriton.apply(xs), [xs], dys)),
                ("normbwd-in-bwd fn", lambda: torch.autograd.grad(WithNormBwd.apply(xs), [xs], dys)),
                ("ops fwd+bwd", lambda: torch.autograd.grad(fusewise.ops.rms_norm(xs, ws), [xs, ws], dys))]:
    print(f"host {name}: {host_us(f):.0f} us/call", flush=True)
out = {}
def worker(): out["t"] = host_us(lambda: L.norm_backward(dys, None, xs.detach(), ws.detach(), None, mean, rstd, True))
th = threading.Thread(target=worker); th.start(); th.join(); print(f"launcher bwd on another thread: {out['t']:.0f} us")
print(f"launcher bwd main thread: {host_us(lambda: L.norm_backward(dys, None, xs.detach(), ws.detach(), None, mean, rstd, True)):.0f} us")
