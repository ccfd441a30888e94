import torch, fusewise as fw
from fusewise.ops import reference as R
torch.manual_seed(0)
import fusewise.ops._norm_launch as L
L.MAX_BLOCK_N = L.MAX_BLOCK_N_FWD = 512; L.WIDE_CHUNK=256  # small limits: exercise the wide path too
for N in [7, 760, 1823]:
  for kind in ['ln','rms','add']:
    x = torch.randn(5, N, requires_grad=True, device="cuda"); w = torch.randn(N, requires_grad=True, device="cuda"); b = torch.randn(N, requires_grad=True, device="cuda"); r=torch.randn(5,N,requires_grad=True, device="cuda")
    if kind=='ln': y = fw.ops.layer_norm(x, w, b); fn = lambda x,w,b,r: R.layer_norm(x,w,b); ins=(x,w,b)
    elif kind=='rms': y = fw.ops.rms_norm(x, w); fn = lambda x,w,b,r: R.rms_norm(x,w); ins=(x,w)
    else:
      y, h = fw.ops.add_rms_norm(x, r, w); fn = lambda x,w,b,r: R.add_rms_norm(x,r,w)[0]; ins=(x,w,r)
    xd, wd, bd, rd = [t.detach().double().requires_grad_() for t in (x,w,b,r)]
    yr = fn(xd,wd,bd,rd)
    print(N, kind, ((y.double()-yr).norm()/yr.norm()).item())
    dy = torch.randn_like(y); y.backward(dy)
    yr.backward(dy.double())
    m = {id(x):xd, id(w):wd, id(b):bd, id(r):rd}
    for t in ins: print('  g', ((t.grad.double()-m[id(t)].grad).norm()/m[id(t)].grad.norm()).item())
print(fw.ops.paths())
