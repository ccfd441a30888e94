"""Where does norm forward+backward time go? Kernel alone vs autograd vs CUDA graph vs host cost."""
import time, torch, triton, torch.nn.functional as F
import fusewise
from fusewise.ops import _norm_launch as L
from fusewise import hardware
ceil = hardware.measure_bandwidth(torch.device("cuda"))
print(f"copy {ceil:.0f}")
def bench(f):
    return triton.testing.do_bench(f, warmup=10, rep=50, return_mode="median")
def graph_ms(f):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2): f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): f()
    return bench(g.replay)
for n in [256, 4096, 16384]:
    m = (1 << 27) // n
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16); w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    y, h, mean, rstd = L.norm_forward(x, None, w, None, 1e-6, True)
    u = x.numel() * 2 / ceil / 1e6  # ms for one pass over the tensor at the copy ceiling
    kf = bench(lambda: L.norm_forward(x, None, w, None, 1e-6, True))
    kb = bench(lambda: L.norm_backward(dy, None, x, w, None, mean, rstd, True))
    xr = x.clone().requires_grad_(); wr = w.clone().requires_grad_()
    full = bench(lambda: torch.autograd.grad(fusewise.ops.rms_norm(xr, wr), [xr, wr], dy))
    gfull = graph_ms(lambda: torch.autograd.grad(fusewise.ops.rms_norm(xr, wr), [xr, wr], dy))
    tor = bench(lambda: torch.autograd.grad(F.rms_norm(xr, (n,), wr), [xr, wr], dy))
    print(f"N={n}: passes-equivalent: fwd kernel {kf/u:.2f} (ideal 2), bwd kernel {kb/u:.2f} (ideal 3), "
          f"autograd fwd+bwd {full/u:.2f}, graphed {gfull/u:.2f} (ideal 5), torch {tor/u:.2f}; u={u*1e3:.0f}us")
    # host cost per call, small tensor
xs = torch.randn(8, 256, device="cuda", requires_grad=True); ws = torch.randn(256, device="cuda", requires_grad=True); dys = torch.randn(8, 256, device="cuda")
for name, f in [("fwd", lambda: fusewise.ops.rms_norm(xs.detach(), ws.detach())), ("fwd+bwd", lambda: torch.autograd.grad(fusewise.ops.rms_norm(xs, ws), [xs, ws], dys)),
                ("torch fwd+bwd", lambda: torch.autograd.grad(F.rms_norm(xs, (256,), ws), [xs, ws], dys))]:
    for _ in range(20): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(200): f()
    torch.cuda.synchronize(); print(f"host {name}: {(time.perf_counter()-t)/200*1e6:.0f} us/call")
for maxb in [32768, 65536]:
    L.MAX_BLOCK_N = maxb
    for n in [32768, 65536]:
        if n > maxb: continue
        m = (1 << 27) // n
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16); w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        u = x.numel() * 2 / ceil / 1e6
        for ept in [16, 32, 64]:
            L.FWD_ELEMENTS_PER_THREAD = ept
            kf = bench(lambda: L.norm_forward(x, None, w, None, 1e-6, True))
            print(f"block fwd N={n} ept={ept}: {2*u/kf*100:.1f}%")
