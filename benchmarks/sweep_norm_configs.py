"""Tuning sweep for the norm launch heuristics (ops/norms/launch.py module constants).

Times the fusewise rms_norm / layer_norm kernels alone (2**26 elements by default), replayed
from a CUDA graph so host overhead stays out, under each setting of the launch constants; % of
the copy ceiling by the byte model (forward 2·M·N·s, backward 3·M·N·s; add_rms_norm 4 and 4).
Ops: layer_norm, rms_norm, add_rms_norm. GPU only.

Each setting's line ends with its largest error against float32 torch (y or dx, relative to
the largest output), so a kernel that races shows. Parts (--parts):
  fwd       the forward with the shipped settings, every width
  bwd       the backward with the shipped settings, every width
  fwdblock  the forward's block path: elements per tile, elements per thread, most warps
  fwdwide   the forward's wide path: chunk and warps
  fwdunmasked  the block forward without masks wherever tiles are whole, against masked
  fwdwalk   the forward walking each row in unrolled chunks (settings.FWD_WALK, torch.compile's
            structure at 16,384-32,768): chunk and warps at every width, against the shipped
  fwdwelford  LayerNorm's walk with mean and variance in one walk (Walk.welford)
  fwdhold   the walk holding a row's first elements in registers, walking the rest (Walk.hold)
  fwdloop   every width on the wide path (two passes over a row, the second mostly from L2, as
            Inductor's forward) against the shipped block path
  fused     the fused backward: elements per tile, warps, programs per SM (one setting for all
            widths up to 8192)
  fused16k  the fused backward at 16384 (warps, x and dy read again or held) against the
            split kernels, two alternated rounds
  lean      A/B of the fused backward's `lean` (launch.Bwd), shipped settings otherwise
  fwdcache  the walked and wide forwards with y stored streaming, and the wide kernel's loads
            with eviction policies (launch.FWD_CACHE), against the shipped, alternated
  sliced    the backward with a row's columns shared out among programs (Bwd.slice): slice,
            chunk, warps, programs a multiprocessor, at 12,288-65,536, against the shipped
  biasapart LayerNorm's bias gradient by its own column sums (Bwd.bias_apart), 8,193-16,384
  pieces    the fused backward on rows of 8,193-16,384 held as two blocks (Bwd.head)
  split     the split backward (rows past the fused kernel's reach): tile rows, columns, warps,
            waves; the row sums' warps and unrolled loads

    python benchmarks/sweep_norm_configs.py --csv out.csv --parts fwd,bwd
"""

from __future__ import annotations

import argparse
import itertools
import sys

import _rows  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
import torch
import torch.nn.functional as F
import triton

from fusewise import hardware
from fusewise.ops.norms import launch as L

BLOCK_WIDTHS = [256, 512, 1024, 2048, 4096, 8192]
WIDE_WIDTHS = [16384, 32768, 65536, 262144]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Inputs:
    """One set of tensors per (op, width, dtype), reused by every setting."""

    def __init__(self, elements: int):
        self.elements, self.cache = elements, {}

    def get(self, op: str, n: int, dtype):
        """(x, residual or None, w, b, dy, dh or None, h-or-x, mean, rstd)."""
        if (op, n, dtype) not in self.cache:
            self.cache.clear()
            torch.cuda.empty_cache()
            m = self.elements // n
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            r = torch.randn_like(x) if op == "add_rms_norm" else None
            w = torch.randn(n, device="cuda", dtype=dtype)
            b = None if op != "layer_norm" else torch.randn_like(w)
            _, h, mean, rstd = L.norm_forward(x, r, w, b, 1e-6, op != "layer_norm")
            dh = torch.randn_like(x) if r is not None else None
            xn = h if r is not None else x
            self.cache[(op, n, dtype)] = (x, r, w, b, torch.randn_like(x), dh, xn, mean, rstd)
        return self.cache[(op, n, dtype)]


def measure(inputs, op, mode, n, dtype):
    """(ms, bytes by the byte model) of one forward or backward, kernels only. add_rms_norm's
    residual adds a read and a write (forward: h) or a read (backward: dh)."""
    x, r, w, b, dy, dh, xn, mean, rstd = inputs.get(op, n, dtype)
    is_rms, extra = op != "layer_norm", (2 if r is not None else 0)
    if mode == "fwd":
        run, passes = (lambda: L.norm_forward(x, r, w, b, 1e-6, is_rms)), 2 + extra
    else:
        run = lambda: L.norm_backward(dy, dh, xn, w, b, mean, rstd, is_rms)  # noqa: E731
        passes = 3 + extra // 2
    ms = triton.testing.do_bench(_rows.graph_replay(run), warmup=10, rep=40, return_mode="median")
    return ms, passes * x.numel() * x.element_size()


def relative_error(inputs, op, mode, n, dtype) -> float:
    """max |fusewise - float32 torch| / max |torch| of y (forward; and h for add_rms_norm) or of
    dx, dweight and dbias (backward), on the sweep's own inputs: a candidate that computes a
    wrong value (a race, a mask, a gradient summed wrong) shows here and not only in its time.
    NaN if any output is NaN."""
    x, r, w, b, dy, dh, xn, mean, rstd = inputs.get(op, n, dtype)
    is_rms, bwd = op != "layer_norm", mode == "bwd"
    # add_rms_norm normalizes h = x + r (the backward's xn, rounded to dtype as the forward
    # stores it); its dx is the gradient through the norm plus the incoming dh.
    src = xn if bwd else (x.float() + r.float() if r is not None else x)
    xf = src.float().requires_grad_(bwd)
    wf = w.float().requires_grad_(bwd)
    bf = None if b is None else b.float().requires_grad_(bwd)
    if is_rms:
        ref = F.rms_norm(xf, (n,), wf, 1e-6)
    else:
        ref = F.layer_norm(xf, (n,), wf, bf, 1e-6)
    if mode == "fwd":
        y, h, _, _ = L.norm_forward(x, r, w, b, 1e-6, is_rms)
        pairs = [(y, ref)] + ([(h, xf)] if r is not None else [])
    else:
        leaves = [xf, wf] + ([bf] if bf is not None else [])
        want = list(torch.autograd.grad(ref, leaves, dy.float()))
        if dh is not None:
            want[0] = want[0] + dh.float()
        got = L.norm_backward(dy, dh, xn, w, b, mean, rstd, is_rms)
        pairs = list(zip(got, want))
    errors = [((got.float() - want).abs().max() / want.abs().max()).item() for got, want in pairs]
    return max(errors, key=lambda e: (e != e, e))


def _worst(errors: list) -> str:
    """The largest of a setting's errors over its widths (relative_error), NaN if any is."""
    if not errors:
        return "err not checked"
    return f"err {max(errors, key=lambda e: (e != e, e)):.1e}"


def _with_16384(op: str, setting):
    """BWD_CONFIGS with op's rows of 16384 (bf16 and fp32) on `setting`, or on the split
    kernels if None."""
    configs = dict(L.BWD_CONFIGS)
    for size in (2, 4):
        narrower = tuple(c for c in L.BWD_CONFIGS[op, size] if c.widest < 16384)
        configs[op, size] = narrower + ((setting,) if setting else ())
    return configs


def settings(part: str, op: str):
    """(label, {constant: value}) for each setting of a part; shipped values are restored after."""
    if part == "fused":
        for tile, warps, pps in itertools.product([2048, 4096, 8192], [4, 8, 16], [1, 2]):
            one = (L.Bwd(1 << 40, tile, warps, pps),)
            configs = {**L.BWD_CONFIGS, (op, 2): one, (op, 4): one}
            yield f"tile={tile} warps={warps} pps={pps}", {"BWD_CONFIGS": configs}
    elif part == "fused16k":
        # rows of 16384 in the fused kernel (one row a tile, loads at each tile's turn) against
        # the split kernels, alternated over two rounds
        for r in (1, 2):
            yield f"split kernels #{r}", {"BWD_CONFIGS": _with_16384(op, None)}
            for warps, reload in [(32, False), (32, True), (16, True)]:
                setting = L.Bwd(16384, 16384, warps, 1, prefetch=False, lean=True, reload=reload)
                label = f"warps={warps} lean{' reload' if reload else ''} #{r}"
                yield label, {"BWD_CONFIGS": _with_16384(op, setting)}
    elif part == "lean":
        # A/B of the fused backward's `lean` at every width, alternated twice
        for label in ["before#1", "lean#1", "before#2", "lean#2"]:
            lean = label.startswith("lean")
            configs = {k: tuple(c._replace(lean=lean) for c in v) for k, v in L.BWD_CONFIGS.items()}
            yield label, {"BWD_CONFIGS": configs}
    elif part == "sliced":
        # the backward with a row's columns shared out among programs (Bwd.slice), every width
        # of the part on one setting, against the shipped before and after
        yield "shipped#1", {}
        for sl, chunk, warps, pps, unroll in SLICED:
            one = (L.Bwd(1 << 40, chunk, warps, pps, slice=sl, unroll=unroll),)
            label = f"slice={sl} chunk={chunk} warps={warps} pps={pps}{' unrolled' * unroll}"
            yield label, {"BWD_CONFIGS": {**L.BWD_CONFIGS, (op, 2): one, (op, 4): one}}
        yield "shipped#2", {}
    elif part == "biasapart":
        # LayerNorm's bias gradient by its own column sums over dy (Bwd.bias_apart), the fused
        # kernel (or the sliced one) without its accumulators; against the shipped before and
        # after, and against the setting before the bias went apart (bf16: split kernels to
        # 12,288, then fused with the bias accumulated). Labels: bf16's setting / fp32's
        if op != "layer_norm":
            return  # only LayerNorm has a bias
        yield "shipped#1", {}
        reload = L.Bwd(16384, 16384, 32, 1, False, True, True, bias_apart=True)
        before = reload._replace(bias_apart=False, fused_from=12289)
        lean = reload._replace(reload=False)
        sliced = L.Bwd(16384, 4096, 16, 1, slice=8192, fused_from=12288)
        for label, bf16, fp32, colsum in [
            ("before / sliced, bias accumulated", before, sliced, (8, 1024, 8)),
            ("reload / reload", reload, reload, (8, 1024, 8)),
            ("lean / lean", lean, lean, (8, 1024, 8)),
            ("reload / sliced", reload, sliced._replace(bias_apart=True), (8, 1024, 8)),
            ("reload / reload, sums 4x2048 w8", reload, reload, (4, 2048, 8)),
        ]:
            configs = {
                **L.BWD_CONFIGS,
                ("layer_norm", 2): L.BWD_CONFIGS["layer_norm", 2][:-1] + (bf16,),
                ("layer_norm", 4): L.BWD_CONFIGS["layer_norm", 4][:-1] + (fp32,),
            }
            sums = dict(zip(("COLSUM_M", "COLSUM_N", "COLSUM_WARPS"), colsum))
            yield f"apart {label}", {"BWD_CONFIGS": configs, **sums}
        yield "shipped#2", {}
    elif part == "pieces":
        # rows of 8,193-16,384 held as a head block of 8,192 and a tail block (Bwd.head,
        # kernels_bwd_pieces) on 8, 16 or 32 warps, with and without the next row's loads in
        # flight, LayerNorm's bias gradient in the kernel or apart; against the shipped
        yield "shipped#1", {}
        for warps, prefetch, apart in itertools.product((8, 16, 32), (True, False), (False, True)):
            if (warps == 32 and prefetch) or (warps == 8 and not prefetch):
                continue  # 32 warps: 64 registers a thread, no room for a second row; 8
                # warps: the next row's loads are what keep them busy
            if apart and op != "layer_norm":
                continue
            head = L.Bwd(16384, 16384, warps, 1, prefetch=prefetch, bias_apart=apart, head=8192)
            configs = {**L.BWD_CONFIGS}
            for size in (2, 4):
                configs[op, size] = configs[op, size][:-1] + (head,)
            label = f"head 8192 w{warps}{' prefetch' * prefetch}{' bias apart' * apart}"
            yield label, {"BWD_CONFIGS": configs}
        yield "shipped#2", {}
    elif part == "fwdcache":
        # launch.FWD_CACHE 0 (shipped), 1 (y streamed), 2 (and the wide kernel's loads with
        # eviction policies), alternated over two rounds
        for r, cache in itertools.product((1, 2), (0, 1, 2)):
            yield f"FWD_CACHE={cache} #{r}", {"FWD_CACHE": cache}
    elif part == "split":
        for tm, tn, tw, waves, sw, unroll in [
            (4, 1024, 4, 4, 4, 4),
            (8, 512, 4, 8, 4, 4),
            (4, 1024, 4, 4, 8, 2),
            (4, 1024, 4, 4, 4, 8),
            (4, 1024, 4, 4, 8, 4),
        ]:
            yield (
                f"m={tm} n={tn} warps={tw} waves={waves} sums_warps={sw} unroll={unroll}",
                dict(
                    TILES_M=tm,
                    TILES_N=tn,
                    TILES_WARPS=tw,
                    TILES_WAVES=waves,
                    SUMS_WARPS=sw,
                    SUMS_UNROLL=unroll,
                ),
            )
    elif part == "fwdblock":
        for tile, ept, maxw in itertools.product([2048, 4096, 8192], [8, 16, 32], [16, 32]):
            yield (
                f"tile={tile} ept={ept} max_warps={maxw}",
                dict(TILE_ELEMENTS_FWD=tile, FWD_ELEMENTS_PER_THREAD=ept, MAX_WARPS_FWD=maxw),
            )
    elif part == "fwdwide":
        for chunk, warps in [(16384, 16), (32768, 16), (32768, 32), (65536, 32)]:
            yield f"chunk={chunk} warps={warps}", {"WIDE_CHUNK_FWD": chunk, "WIDE_WARPS": warps}
    elif part == "fwdloop":
        # every width on the wide (looped, two-pass) kernel, as Inductor's forward does below
        # 16384, against the shipped block path before and after
        yield "shipped#1", {}
        for chunk, warps in [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16)]:
            yield (
                f"loop chunk={chunk} warps={warps}",
                {"MAX_BLOCK_N_FWD": 128, "WIDE_CHUNK_FWD": chunk, "WIDE_WARPS": warps},
            )
        yield "shipped#2", {}
    elif part == "fwdwalk":
        ops = ("layer_norm", "rms_norm", "add_rms_norm")
        yield "shipped#1", {}
        for (chunk, warps), unroll in itertools.product(WALKS, WALK_UNROLL):
            walk = (L.Walk(1, 1 << 40, chunk, warps, unroll),)
            every = {(op, size): walk for op in ops for size in (2, 4)}
            label = f"walk chunk={chunk} warps={warps}{' unrolled' if unroll else ''}"
            yield label, {"FWD_WALK": every}
        yield "shipped#2", {}
    elif part == "fwdwelford":
        # LayerNorm's walk with mean and variance in one walk (two walks, not three)
        yield "shipped#1", {}
        for chunk, warps in WALKS:
            walk = (L.Walk(1, 1 << 40, chunk, warps, welford=True),)
            yield (
                f"walk chunk={chunk} warps={warps} welford",
                {"FWD_WALK": {(op, 2): walk, (op, 4): walk}},
            )
        yield "shipped#2", {}
    elif part == "fwdhold":
        # the walk holding a row's first elements in registers (Walk.hold), against the shipped
        # before and after; every op and size on one setting
        ops = ("layer_norm", "rms_norm", "add_rms_norm")
        yield "shipped#1", {}
        for hold, chunk, warps, unroll in HOLDS:
            walk = (L.Walk(1, 1 << 40, chunk, warps, unroll, hold=hold),)
            every = {(op, size): walk for op in ops for size in (2, 4)}
            label = f"hold={hold} chunk={chunk} warps={warps}{' unrolled' if unroll else ''}"
            yield label, {"FWD_WALK": every}
        yield "shipped#2", {}
    elif part == "fwdunmasked":
        # the block forward without masks on whole tiles (FWD_UNMASKED) against masked, alternated
        widths = tuple(1 << k for k in range(8, 16))  # 256-32,768: every block width
        ops = ("layer_norm", "rms_norm", "add_rms_norm")
        every = {(op, size): widths for op in ops for size in (2, 4)}
        for r in (1, 2):
            yield f"masked#{r}", {"FWD_UNMASKED": {}}
            yield f"unmasked#{r}", {"FWD_UNMASKED": every}
    else:
        yield "shipped", {}


# (slice, chunk, warps, programs a multiprocessor, unrolled): ptxas for sm_90a gives LayerNorm
# bf16 at 16,384 112 / 116 / 115 / 127 registers a thread, so 2 / 4 / 1 / 2 programs a
# multiprocessor (benchmarks/norm_registers.py --sliced)
SLICED = [
    (4096, 2048, 8, 2, False),
    (2048, 2048, 4, 4, False),
    (8192, 4096, 16, 1, False),
    (4096, 4096, 8, 2, True),
]
# (hold, chunk, warps, unrolled): ptxas for sm_90a at 65,536 gives 44-64 registers a thread and
# no spill for most ops (LayerNorm bf16 16-28 B at hold 32768 with chunks of 4096-8192, add+RMSNorm
# fp32 16 B at 8192); unrolled, 0-136 B
HOLDS = [
    (16384, 8192, 32, False),
    (16384, 16384, 32, False),
    (32768, 4096, 32, False),
    (32768, 8192, 32, False),
    (32768, 16384, 32, False),
    (32768, 8192, 32, True),
]
WALKS = [(2048, 16), (4096, 16), (8192, 16), (8192, 32), (16384, 32), (32768, 32)]
# rolled (results/h200_sweep_walk_rolled_7ab4d9a); unrolled at 2213a72 (h200_sweep_walk_2213a72)
WALK_UNROLL = [False]
WIDTHS = {
    "fwdwalk": [8192, 12288, 16384, 32768, 65536, 262144],
    "fwdwelford": [8192, 12288, 16384, 32768, 65536, 262144],
    "fwdcache": [16384, 32768, 65536, 131072, 262144],
    "fwdhold": [65536, 131072],
    "fwd": BLOCK_WIDTHS + WIDE_WIDTHS,
    "bwd": BLOCK_WIDTHS + WIDE_WIDTHS,
    "fwdblock": [1024, 4096, 8192, 16384, 32768],
    "fwdwide": WIDE_WIDTHS[1:],
    "fwdloop": [1024, 4096, 8192, 16384],
    "fwdunmasked": [1024, 4096, 8192, 16384, 32768],
    "fused": BLOCK_WIDTHS,
    "fused16k": [16384],
    "lean": BLOCK_WIDTHS,
    "split": WIDE_WIDTHS,
    "sliced": [12288, 16384, 32768, 65536],
    "biasapart": [8704, 9216, 10240, 12288, 14848, 16384],
    "pieces": [8704, 9216, 10240, 12288, 14848],
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="layer_norm,rms_norm")
    p.add_argument("--parts", default="fwd,bwd")
    p.add_argument("--dtypes", default="bf16")
    p.add_argument("--elements", type=int, default=1 << 26)
    p.add_argument("--widths", help="widths to sweep, comma-separated (default: the part's)")
    p.add_argument("--csv", default=None)
    args = p.parse_args()
    ceiling = hardware.measure_bandwidth(torch.device("cuda"))
    print(f"# copy ceiling {ceiling:.0f} GB/s; % of it by the byte model; commit {_rows.commit()}")
    inputs = Inputs(args.elements)
    for part, op in itertools.product(args.parts.split(","), args.ops.split(",")):
        mode = "fwd" if part.startswith("fwd") else "bwd"
        widths = [int(w) for w in args.widths.split(",")] if args.widths else WIDTHS[part]
        dtypes = args.dtypes.split(",")
        for dname, (label, values) in itertools.product(dtypes, list(settings(part, op))):
            if label == next(settings(part, op))[0]:
                print(f"# {part} {op} {mode} {dname}, widths {widths}", flush=True)
            saved = {k: getattr(L, k) for k in values}
            cells, rows, errors = [], [], []
            try:
                for k, v in values.items():
                    setattr(L, k, v)
                for n in widths:
                    walk = values.get("FWD_WALK", {}).get((op, 2))
                    if walk and walk[0].unroll and n > 32 * walk[0].chunk:  # slow to compile
                        cells.append(float("nan"))
                        continue
                    try:
                        ms, nbytes = measure(inputs, op, mode, n, DTYPES[dname])
                        errors.append(relative_error(inputs, op, mode, n, DTYPES[dname]))
                    except Exception as e:  # a setting that does not compile or fit: say so
                        print(f"#   {label} n={n}: {type(e).__name__}: {str(e)[:120]}")
                        cells.append(float("nan"))
                        continue
                    gbps = nbytes / ms / 1e6
                    cells.append(100 * gbps / ceiling)
                    shape = f"{args.elements // n}x{n}"
                    provider = f"fusewise[{part}: {label}]"
                    rows.append(_rows.row(op, provider, mode, shape, dname, ms, gbps, cells[-1]))
            finally:
                for k, v in saved.items():
                    setattr(L, k, v)
            if args.csv:
                _rows.append_csv(args.csv, rows)
            line = " ".join(f"{c:5.1f}" for c in cells)
            print(f"{label:>40}: {line}  {_worst(errors)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
