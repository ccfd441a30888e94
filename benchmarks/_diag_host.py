import cProfile, pstats, torch, fusewise
xs = torch.randn(8, 256, device="cuda", requires_grad=True); ws = torch.randn(256, device="cuda", requires_grad=True); dys = torch.randn(8, 256, device="cuda")
f = lambda: torch.autograd.grad(fusewise.ops.rms_norm(xs, ws), [xs, ws], dys)
for _ in range(20): f()
torch.cuda.synchronize()
pr = cProfile.Profile(); pr.enable()
for _ in range(200): f()
torch.cuda.synchronize(); pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
