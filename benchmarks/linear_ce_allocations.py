"""The tensors fusewise.ops.linear_cross_entropy allocates, in order, with the live total: its
eager path (_LinearCE) as the patched Hugging Face loss calls it (reduction="sum", then divided
by the count), forward and backward, counted by a dispatch mode that follows every new storage
until it is freed. Runs anywhere (the CPU in Triton's interpreter); on the CPU the fp32-output
GEMM is two fp32 copies of the operands, which the GPU does not make (launch._gemm).

Default shape N=4096, d=64, V=8192 bf16 with the chunk forced to 2048 tokens (what CHUNK_BYTES
gives at V=128256 in bf16): the sizes to scale are [N, d] fp32 (dhidden, kept until the
backward scales it into a new bf16 tensor), [V, d] bf16 (dweight) and [2048, V] bf16 (the logits
chunk buffer, the forward's largest transient).

    python benchmarks/linear_ce_allocations.py
"""

from __future__ import annotations

import argparse
import os
import sys
import weakref

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before fusewise's kernels are decorated

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from fusewise.ops import _dispatch  # noqa: E402
from fusewise.ops.linear_ce import launch, op  # noqa: E402
from fusewise.ops.linear_ce.args import check_args  # noqa: E402


class LiveBytes(TorchDispatchMode):
    """Adds each new storage an op returns (not a view or an out= argument), subtracts it when
    freed; prints those of at least `show` bytes."""

    def __init__(self, show: int):
        super().__init__()
        self.show, self.now, self.peak, self.seen = show, 0, 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = tree_flatten((args, kwargs))[0]
        given = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, n = storage.data_ptr(), storage.nbytes()
            if n == 0 or key in self.seen or key in given:  # a view, or an out= argument
                continue
            self.seen.add(key)
            self.now += n
            self.peak = max(self.peak, self.now)
            if n >= self.show:
                print(f"  + {n:>12,d} B  {func}  {tuple(t.shape)} {t.dtype}  live {self.now:,d}")
            weakref.finalize(storage, self._free, key, n)
        return out

    def _free(self, key, n):
        self.now -= n
        self.seen.discard(key)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--chunk", type=int, default=2048, help="tokens per chunk (0: CHUNK_BYTES)")
    a = ap.parse_args(argv)
    n, d, v = a.tokens, a.hidden, a.vocab
    if a.chunk:
        launch.CHUNK_BYTES = a.chunk * v * 2
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(n, d, device=dev, generator=g).bfloat16().requires_grad_()
    w = (torch.randn(v, d, device=dev, generator=g) / d**0.5).bfloat16().requires_grad_()
    t = torch.randint(0, v, (n,), device=dev, generator=g)
    opts, cfg = check_args(h, w, t, None, -100, "sum", 0.0, 0.0, None, False, None)
    path = _dispatch.choose_path("linear_cross_entropy", h, w)
    mode = LiveBytes(show=min(n * d * 2, v * d * 2))
    with mode:
        print("forward")
        loss = op._LinearCE.apply(h, w, t, None, "sum", opts, cfg, path) / n
        print("backward")
        loss.backward()
    print(f"peak live {mode.peak:,d} B (inputs excluded)")
    chunk = launch._chunks(n, v, 2)[0][1]
    sizes = {"[N,d] bf16": n * d * 2, "[N,d] fp32": n * d * 4, "[V,d] bf16": v * d * 2}
    sizes[f"[{chunk},V] bf16"] = chunk * v * 2
    print("  ".join(f"{k} {b:,d}" for k, b in sizes.items()))


if __name__ == "__main__":
    sys.exit(main())
