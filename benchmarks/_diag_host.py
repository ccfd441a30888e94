import time, torch, triton, fusewise, torch.nn.functional as F
from fusewise import hardware
xs = torch.randn(8, 256, device="cuda", requires_grad=True); ws = torch.randn(256, device="cuda", requires_grad=True); dys = torch.randn(8, 256, device="cuda")
for name, f in [("fwd", lambda: fusewise.ops.rms_norm(xs.detach(), ws.detach())), ("fwd+bwd", lambda: torch.autograd.grad(fusewise.ops.rms_norm(xs, ws), [xs, ws], dys)),
                ("torch fwd+bwd", lambda: torch.autograd.grad(F.rms_norm(xs, (256,), ws), [xs, ws], dys))]:
    for _ in range(20): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(200): f()
    torch.cuda.synchronize(); print(f"host {name}: {(time.perf_counter()-t)/200*1e6:.0f} us/call")
ceil = hardware.measure_bandwidth(torch.device("cuda"))
for n in [256, 4096, 16384]:
    m = (1 << 27) // n
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True); w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    for name, fn in [("fusewise", lambda: torch.autograd.grad(fusewise.ops.rms_norm(x, w), [x, w], dy)), ("torch", lambda: torch.autograd.grad(F.rms_norm(x, (n,), w), [x, w], dy))]:
        ms = triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
        print(f"rms fwd+bwd N={n} {name}: {5*x.numel()*2/ms/1e6/ceil*100:.1f}% of copy")
