"""Registers, spills and barriers of the norm kernels' shipped settings, compiled for an H100/H200
(sm_90a) on any machine, without a GPU: Triton compiles to PTX, and the ptxas and cuobjdump that
ship with Triton give the rest. A setting that spills inside its row loop runs far below the copy
ceiling (LayerNorm's fused backward at 16384 in bf16: 126 spill stores a tile, 8% of the
ceiling; 16 with x and dy read again, 49%), so this answers before a GPU run which settings are
worth sweeping.

    python benchmarks/norm_registers.py              # every (op, dtype) at each setting's widest
    python benchmarks/norm_registers.py --widths 16384

Loop counts are of the longest backward branch in the SASS (the tile loop), or of the whole
kernel where it has none (the forward's block kernel). Inputs are assumed
16-byte aligned with widths and strides divisible by 16, as Triton specializes real launches.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas

from fusewise.ops.norms import kernels as K
from fusewise.ops.norms import kernels_bwd as KB
from fusewise.ops.norms import kernels_bwd_pieces as KBP
from fusewise.ops.norms import kernels_bwd_sliced as KBS
from fusewise.ops.norms import launch as L

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
# the ptxas Triton itself runs for sm_90: under Triton 3.9 bin/ptxas (CUDA 12.8) is too old for
# the PTX it writes (.version 9.4), and get_ptxas names the newer one
PTXAS = get_ptxas(90).path
TARGET = GPUTarget("cuda", 90, 32)
ALIGNED = {"N", "stride_x", "stride_dy", "stride_dh", "stride_r"}  # and every pointer
TYPES = {2: "bf16", 4: "fp32"}
OPS = ("layer_norm", "rms_norm", "add_rms_norm")


def _compile(fn, args: dict, constants: dict, warps: int):
    # every constexpr given, its default where the caller has none: Triton 3.9 compiles an
    # omitted one as None; and the signature in the kernel's order, which the attrs index
    defaults = {
        p.name: p.default
        for p in fn.params
        if p.is_constexpr and p.default is not inspect.Parameter.empty
    }
    constants = {**defaults, **constants}  # one with no default and not given: a KeyError below
    given = {**args, **dict.fromkeys(constants, "constexpr")}
    signature = {n: given[n] for n in fn.arg_names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(fn.arg_names)
        if n in ALIGNED or signature[n].startswith("*")
    }
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(src, target=TARGET, options={"num_warps": warps})


def _counts(compiled) -> dict:
    """ptxas's registers and spill bytes; STL/LDL/BAR in the SASS's longest loop."""
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        ptxas = subprocess.run(
            [PTXAS, "-arch=sm_90a", "-v", ptx, "-o", cubin],
            capture_output=True,
            text=True,
        )
        info = ptxas.stderr
        if ptxas.returncode != 0:
            raise RuntimeError(f"ptxas could not compile {compiled.name}: {info.strip()[:500]}")
        sass = subprocess.run(
            [os.path.join(BIN, "cuobjdump"), "-sass", cubin], capture_output=True, text=True
        ).stdout
    out = {
        "registers": int(re.search(r"Used (\d+) registers", info).group(1)),
        "spill_stores": int(re.search(r"(\d+) bytes spill stores", info).group(1)),
    }
    code = [
        (int(m.group(1), 16), line)
        for line in sass.splitlines()
        if (m := re.search(r"/\*([0-9a-f]{4,})\*/\s+\S", line))
    ]
    loops = [
        (at, int(m.group(1), 16))
        for at, line in code
        if (m := re.search(r"BRA (0x[0-9a-f]+)", line)) and int(m.group(1), 16) < at
    ]
    # the tile loop; a kernel without one (the forward's block kernel) counts whole
    end, start = max(loops, key=lambda b: b[0] - b[1]) if loops else (float("inf"), 0)
    body = [line for at, line in code if start <= at <= end]
    for op in ("STL", "LDL", "BAR"):
        out[f"loop_{op}"] = sum(1 for line in body if re.search(rf"\b{op}\b", line))
    return out


def backward(op: str, size: int, width: int) -> tuple[str, dict]:
    block_m, block_n, s = L.bwd_config(width, op, size)
    t = "*" + TYPES[size]
    args = dict(X=t, W=t, DY=t, DH=t, DX=t, Mean="*fp32", Rstd="*fp32", DW_part="*fp32")
    args |= dict(DB_part="*fp32", M="i32", N="i32", stride_x="i32", stride_dy="i32")
    args |= dict(stride_dh="i32")
    flags = dict(
        IS_RMS=op != "layer_norm",
        HAS_W=True,
        HAS_B=op == "layer_norm" and not s.bias_apart,  # the column sums take dbias
        HAS_DH=op == "add_rms_norm",
    )
    if s.slice:
        args |= dict(groups="i32", rows_per_program="i32")
        slices, chunk = -(-width // block_n), min(s.tile, block_n)
        constants = flags | dict(
            SLICES=slices, BLOCK_S=block_n, CHUNK=chunk, UNROLL=s.unroll, ALIGN=1
        )
        label = f"bwd sliced {slices}x{block_n} chunk={chunk} warps={s.warps} {s.unroll=}"
        label = label.replace("s.", "")
        return label, _counts(_compile(KBS.norm_bwd_sliced_kernel, args, constants, s.warps))
    args |= dict(n_programs="i32", tiles_per_program="i32")
    if width > block_n:  # a head block and a tail block (Bwd.head)
        tail = 1 << (width - block_n - 1).bit_length()
        constants = flags | dict(HEAD=block_n, TAIL=tail, PREFETCH=s.prefetch, ALIGN=1)
        label = f"bwd head {block_n} tail {tail} warps={s.warps} prefetch={s.prefetch}"
        return label, _counts(_compile(KBP.norm_bwd_pieces_kernel, args, constants, s.warps))
    constants = dict(
        **flags,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        PREFETCH=s.prefetch,
        LEAN=s.lean,
        RELOAD=s.reload,
        ALIGN=1,
    )
    label = f"bwd fused {block_m}x{block_n} warps={s.warps} {s.prefetch=} {s.lean=} {s.reload=}"
    return label.replace("s.", ""), _counts(
        _compile(KB.norm_bwd_block_kernel, args, constants, s.warps)
    )


def forward(op: str, size: int, width: int) -> tuple[str, dict]:
    block_m, block_n, warps = L.block_config(width)
    t = "*" + TYPES[size]
    args = dict(X=t, R=t, W=t, B=t, Y=t, H=t, Mean="*fp32", Rstd="*fp32", M="i32", N="i32")
    args |= dict(stride_x="i32", stride_r="i32", eps="fp32")
    constants = dict(
        IS_RMS=op != "layer_norm",
        HAS_W=True,
        HAS_B=op == "layer_norm",
        HAS_RES=op == "add_rms_norm",
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        ALIGN=1,
    )
    compiled = _compile(K.norm_fwd_block_kernel, args, constants, warps)
    return f"fwd block {block_m}x{block_n} warps={warps}", _counts(compiled)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", help="widths to compile (default: each setting's widest)")
    p.add_argument(
        "--sliced",
        help="the sliced backward, not the shipped settings: slice:chunk:warps[:unroll],...",
    )
    args = p.parse_args()
    if args.sliced:
        _sliced(args.sliced, [int(w) for w in (args.widths or "12288,16384,32768").split(",")])
        return
    print(
        f"{'op':<13}{'dtype':<6}{'width':>7}  {'regs':>4} {'spill B':>7}"
        f" {'loop STL/LDL/BAR':>17}  kernel"
    )
    for (op, size), settings in L.BWD_CONFIGS.items():
        widths = (
            [int(w) for w in args.widths.split(",")]
            if args.widths
            else [min(s.widest, L.MAX_BLOCK_N) for s in settings]
        )
        for width in widths:
            for stage in (forward, backward):
                if stage is backward and L.use_wide_path(width, True, op, size):
                    print(f"{op:<13}{TYPES[size]:<6}{width:>7}  backward on the split kernels")
                    continue
                _print(op, size, width, *stage(op, size, width))


def _sliced(candidates: str, widths: list[int]) -> None:
    """Each slice:chunk:warps setting of the sliced backward, every op and dtype, at widths."""
    for cand in candidates.split(","):
        sl, chunk, warps, unroll = (int(v) for v in (cand + ":0").split(":")[:4])
        setting = (L.Bwd(1 << 40, chunk, warps, 1, slice=sl, unroll=bool(unroll)),)
        saved = L.BWD_CONFIGS
        L.BWD_CONFIGS = dict.fromkeys(saved, setting)
        try:
            for (op, size), width in itertools.product(saved, widths):
                _print(op, size, width, *backward(op, size, width))
        finally:
            L.BWD_CONFIGS = saved


def _print(op: str, size: int, width: int, label: str, c: dict) -> None:
    loop = f"{c['loop_STL']}/{c['loop_LDL']}/{c['loop_BAR']}"
    print(
        f"{op:<13}{TYPES[size]:<6}{width:>7}  {c['registers']:>4} "
        f"{c['spill_stores']:>7} {loop:>17}  {label}"
    )


if __name__ == "__main__":
    main()
