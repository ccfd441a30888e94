import time, cProfile, pstats, torch, triton, fusewise, torch.nn.functional as F
from fusewise import hardware
from fusewise.ops import _norm_launch as L
xs = torch.randn(8, 256, device="cuda", requires_grad=True); ws = torch.randn(256, device="cuda", requires_grad=True); dys = torch.randn(8, 256, device="cuda")
y, h, mean, rstd = L.norm_forward(xs.detach(), None, ws.detach(), None, 1e-6, True)
def host_us(f, n=300):
    for _ in range(20): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): f()
    torch.cuda.synchronize(); return (time.perf_counter()-t)/n*1e6
fb = lambda: torch.autograd.grad(fusewise.ops.rms_norm(xs, ws), [xs, ws], dys)
for name, f in [("launcher fwd", lambda: L.norm_forward(xs.detach(), None, ws.detach(), None, 1e-6, True)),
                ("launcher bwd", lambda: L.norm_backward(dys, None, xs.detach(), ws.detach(), None, mean, rstd, True)),
                ("empty+sum", lambda: torch.empty((3, 256), device="cuda").sum(0).to(torch.float32)),
                ("ops fwd", lambda: fusewise.ops.rms_norm(xs.detach(), ws.detach())), ("ops fwd+bwd", fb),
                ("torch fwd+bwd", lambda: torch.autograd.grad(F.rms_norm(xs, (256,), ws), [xs, ws], dys))]:
    print(f"host {name}: {host_us(f):.0f} us/call", flush=True)
pr = cProfile.Profile(); pr.enable()
for _ in range(200): fb()
torch.cuda.synchronize(); pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(12)
