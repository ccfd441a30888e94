"""The norm kernels as the GPU's compiler sees them, on a machine without a GPU.

The CPU suite runs every kernel under Triton's interpreter, which accepts code the GPU compiler
refuses: at 2213a72 an eviction-policy default of "" in a helper passed every interpreted test
and kept every norm forward from compiling on the H200. This compiles each forward kernel's
variants, and the sliced backward's, for an H100/H200 (sm_90: Triton's own LLVM and ptxas, no
driver) in a process without the interpreter, as a real launch specializes them (16-byte-aligned
pointers and widths)."""

import os
import subprocess
import sys

from fusewise.ops.norms import launch as norm_launch

# the compile helper both scripts run: a kernel compiled as a real launch specializes it
PRELUDE = r"""
import itertools
import re
import triton
from triton.backends.compiler import GPUTarget
from fusewise.ops.norms import kernels as K
from fusewise.ops.norms import kernels_bias as KBIAS
from fusewise.ops.norms import kernels_bwd as KB
from fusewise.ops.norms import kernels_bwd_pieces as KBP
from fusewise.ops.norms import kernels_bwd_sliced as KBS
from fusewise.ops.norms import kernels_coop as KC
from fusewise.ops.norms import kernels_walk as KW

TARGET = GPUTarget("cuda", 90, 32)
ALIGNED = {"N", "stride_x", "stride_r", "stride_dy", "stride_dh"}
compiled = 0


def compile_for_gpu(fn, args, constants, warps, aligned=ALIGNED, registers=0):
    global compiled
    names = fn.arg_names  # the kernel's order: a pointer given as a constant None moves nothing
    given = {**args, **dict.fromkeys(constants, "constexpr")}
    signature = {n: given[n] for n in names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(names)
        if n in aligned or signature[n].startswith("*")
    }
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)
    options = {"num_warps": warps} | ({"maxnreg": registers} if registers else {})
    kernel = triton.compile(src, target=TARGET, options=options)
    compiled += 1
    return kernel.asm["ptx"]
"""

SCRIPT = (
    PRELUDE
    + r"""
for dtype, (is_rms, has_res) in itertools.product(
    ("bf16", "fp32"), [(False, False), (True, False), (True, True)]
):
    t = "*" + dtype
    tensors = dict(X=t, R=t, W=t, B=t, Y=t, H=t, Mean="*fp32", Rstd="*fp32")
    # every parameter given: Triton 3.9 compiles an omitted default as None
    ops = dict(IS_RMS=is_rms, HAS_W=True, HAS_B=not is_rms, HAS_RES=has_res, ALIGN=1)
    if is_rms:  # as launched: no bias, None (a kernel that touches it does not compile)
        del tensors["B"]
        ops["B"] = None
    tail = dict(stride_x="i32", stride_r="i32", eps="fp32")
    block = {**tensors, "M": "i32", "N": "i32", **tail}
    by_row = {**tensors, "N": "i32", **tail}  # the walk and wide kernels: a program a row
    for even in (False, True):
        meta = dict(ops, BLOCK_M=2, BLOCK_N=256, EVEN=even)
        compile_for_gpu(K.norm_fwd_block_kernel, block, meta, 4)
        for unroll, welford in itertools.product((1, 2), (False, True)):
            if welford and is_rms:  # LayerNorm's alone
                continue
            meta = dict(ops, CHUNK=256, CHUNKS=2, EVEN=even, UNROLL=unroll, WELFORD=welford)
            # every parameter given: Triton 3.9 compiles an omitted default as None
            meta |= dict(STREAM=False, HOLD=0)
            ptx = compile_for_gpu(KW.norm_fwd_walk_kernel, by_row, meta, 4)
            assert ".cs" not in ptx
        meta = dict(ops, CHUNK=256, CHUNKS=2, EVEN=even, UNROLL=1, WELFORD=False, STREAM=True)
        for hold in (0, 512):  # a held part: loaded evict-first, its y stored streaming too
            ptx = compile_for_gpu(KW.norm_fwd_walk_kernel, by_row, meta | dict(HOLD=hold), 4)
            assert "st.global.cs" in ptx and "evict_first" in ptx
    # the walk's other shapes as launched: one ragged chunk and no whole one; a held part with a
    # ragged rest, unrolled; no weight (and no bias), None
    walk = dict(ops, CHUNK=256, EVEN=False, WELFORD=False, STREAM=True, HOLD=0)
    compile_for_gpu(KW.norm_fwd_walk_kernel, by_row, walk | dict(CHUNKS=1, UNROLL=1), 4)
    held = walk | dict(CHUNKS=3, UNROLL=2, HOLD=512)
    compile_for_gpu(KW.norm_fwd_walk_kernel, by_row, held, 4)
    bare = {k: v for k, v in by_row.items() if k not in ("W", "B")}
    unweighted = walk | dict(CHUNKS=2, UNROLL=1, HAS_W=False, HAS_B=False, W=None, B=None)
    compile_for_gpu(KW.norm_fwd_walk_kernel, bare, unweighted, 4)
    for cache in (0, 1, 2):
        meta = dict(ops, BLOCK_N=256, CACHE=cache)
        ptx = compile_for_gpu(K.norm_fwd_wide_kernel, by_row, meta, 4)
        assert ("st.global.cs" in ptx) == (cache >= 1), cache
        assert ("evict_last" in ptx) == ("evict_first" in ptx) == (cache >= 2), cache
    # the cooperative forward: the ticket, the release and the acquiring wait in one launch
    # (PHASE 0) alone; the statistics read from L2, y stored streaming, in every phase
    coop = {**by_row, "Part": "*fp32", "Sync": "*i32"}
    for phase in (0, 1, 2):
        meta = dict(ops, PIECE=256, PIECES=3, PHASE=phase, NARROW=False)
        ptx = compile_for_gpu(KC.norm_fwd_coop_kernel, coop, meta, 4)
        if dtype == "bf16":  # x held as bf16: converted through volatile assembly in one launch
            narrow = compile_for_gpu(KC.norm_fwd_coop_kernel, coop, dict(meta, NARROW=True), 4)
            asm = [p.count("mov.b32 %r") for p in (ptx, narrow)]
            assert (asm[1] > asm[0]) == (phase == 0), (phase, asm)
        # the ticket and the row's release, acq_rel; the spin: an atomic add of 0, a load
        atoms = re.findall(r"atom\.global\.gpu\.(\w+)\.add", ptx)
        assert atoms == (["acq_rel"] * 2 if phase == 0 else []), (phase, atoms)
        assert ("ld.global.gpu.acquire" in ptx) == (phase == 0), phase
        if phase == 0:  # every thread past its stores before the release; none reads the
            # pieces' statistics before the acquire
            release = ptx.index("atom.global", ptx.index("atom.global") + 1)
            assert "bar.sync" in ptx[ptx.rindex("st.global.b32", 0, release) : release]
            spin = ptx.index("ld.global.gpu.acquire")
            assert "bar.sync" in ptx[spin : ptx.index("ld.global.cg", spin)]
        assert (phase == 1) != ("ld.global.cg" in ptx and "st.global.cs" in ptx), phase
    # widths and strides 16 does not divide, passed divided by ALIGN = 8 (launch.align_of):
    # loads and stores of 16 bytes (x and y of each kernel)
    unaligned = dict(ops, ALIGN=8)
    # (tiles of 16 elements a thread or more: 16 bytes or more of bf16 to each)
    block_meta = dict(unaligned, BLOCK_M=2, BLOCK_N=1024, EVEN=False)
    walk_meta = dict(unaligned, CHUNK=2048, CHUNKS=2, EVEN=False, UNROLL=1, WELFORD=False)
    walk_meta |= dict(STREAM=False, HOLD=0)
    for fn, args, meta in [
        (K.norm_fwd_block_kernel, block, block_meta),
        (KW.norm_fwd_walk_kernel, by_row, walk_meta),
        (K.norm_fwd_wide_kernel, by_row, dict(unaligned, BLOCK_N=2048, CACHE=0)),
    ]:
        ptx = compile_for_gpu(fn, args, meta, 4, aligned=set())
        assert re.search(r"ld\.global[.\w:]*\.v4\.b32", ptx), fn.__name__
        assert re.search(r"st\.global[.\w:]*\.v4\.b32", ptx), fn.__name__
        # and without ALIGN, an element (bf16) or 4 bytes a load: the test can fail
        ptx = compile_for_gpu(fn, args, dict(meta, ALIGN=1), 4, aligned=set())
        assert not re.search(r"st\.global[.\w:]*\.v4\.b32", ptx), fn.__name__
    # the sliced backward: dx stored streaming, the slice read again evict-first
    bwd = dict(X=t, W=t, DY=t, DH=t, DX=t, Mean="*fp32", Rstd="*fp32", DW_part="*fp32")
    bwd |= dict(DB_part="*fp32", M="i32", N="i32", stride_x="i32", stride_dy="i32")
    bwd |= dict(stride_dh="i32", groups="i32", rows_per_program="i32")
    flags = dict(IS_RMS=is_rms, HAS_W=True, HAS_B=not is_rms, HAS_DH=has_res)
    for unroll in (False, True):
        meta = dict(flags, SLICES=3, BLOCK_S=512, CHUNK=256, UNROLL=unroll, ALIGN=1)
        ptx = compile_for_gpu(KBS.norm_bwd_sliced_kernel, bwd, meta, 4)
        assert "st.global.cs" in ptx and "evict_first" in ptx
    # the backward kernels with ALIGN = 8, unaligned: dx stored 16 bytes at a time
    fused = {k: v for k, v in bwd.items() if k not in ("groups", "rows_per_program")}
    fused |= dict(n_programs="i32", tiles_per_program="i32")
    sums = dict(X=t, W=t, DY=t, Mean="*fp32", Rstd="*fp32", Sums="*fp32", M="i32", N="i32")
    sums |= dict(stride_x="i32", stride_dy="i32")
    tiles = {k: v for k, v in fused.items() if k not in ("n_programs", "tiles_per_program")}
    tiles = dict(list(tiles.items())[:7] + [("Sums", "*fp32")] + list(tiles.items())[7:])
    tiles |= dict(rows_per_group="i32")
    for fn, args, meta, stores in [
        (KB.norm_bwd_block_kernel, fused, dict(flags, BLOCK_M=2, BLOCK_N=1024, PREFETCH=False,
                                               LEAN=False, RELOAD=False), True),
        (KBS.norm_bwd_sliced_kernel, bwd, dict(flags, SLICES=2, BLOCK_S=2048, CHUNK=2048,
                                               UNROLL=False), True),
        (KB.norm_bwd_row_sums_kernel, sums, dict(IS_RMS=is_rms, HAS_W=True, BLOCK_M=1,
                                                 BLOCK_N=2048, UNROLL=2), False),
        (KB.norm_bwd_tiles_kernel, tiles, dict(flags, BLOCK_M=1, BLOCK_N=2048), True),
    ] + [  # LayerNorm's bias gradient apart (Bwd.bias_apart): into fp32 partials or, for one
        # group, into dbias itself in the activations' dtype
        (KBIAS.column_sums_kernel, column_sums, dict(BLOCK_M=8, BLOCK_N=1024), False)
        for part in dict.fromkeys(("*fp32", t))
        for column_sums in [dict(DY=t, Part=part, M="i32", N="i32", stride_dy="i32",
                                 rows_per_group="i32")]
        if not is_rms
    ]:
        ptx = compile_for_gpu(fn, args, dict(meta, ALIGN=8), 4, aligned=set())
        assert re.search(r"ld\.global[.\w:]*\.v4\.b32", ptx), fn.__name__
        assert not stores or re.search(r"st\.global[.\w:]*\.v4\.b32", ptx), fn.__name__
        ptx = compile_for_gpu(fn, args, dict(meta, ALIGN=1), 4, aligned=set())
        assert not re.search(r"ld\.global[.\w:]*\.v4\.b32", ptx), fn.__name__
# rows as a head block and a tail block (Bwd.head): LayerNorm bf16 with the next row's loads in
# flight, RMSNorm fp32 at its turn, as launched: one row a tile, N past the head
pieces = dict(fused)
for dtype, is_rms in (("*bf16", False), ("*fp32", True)):
    pieces |= dict.fromkeys(("X", "W", "DY", "DH", "DX"), dtype)
    meta = dict(IS_RMS=is_rms, HAS_W=True, HAS_B=not is_rms, HAS_DH=False, HEAD=8192, TAIL=512)
    meta |= dict(PREFETCH=not is_rms, ALIGN=1)
    compile_for_gpu(KBP.norm_bwd_pieces_kernel, pieces, meta, 8)
print("compiled", compiled)
"""
)


def test_kernels_compile_for_the_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # 2 dtypes x (3 ops x (2 block + 2 streaming walks + 2 holding walks + 3 wide: FWD_CACHE
    # 0-2 + 3 walks as launched: one ragged chunk, a held part's ragged rest, no weight + 2
    # sliced backwards + 3 forward and 4 backward kernels with ALIGN = 8 and 1, unaligned) +
    # walks: 8 LayerNorm, 4 for each RMS op + LayerNorm's column sums with ALIGN = 8 and 1,
    # into fp32 partials) + the column sums into bf16 (one group's dbias), ALIGN = 8 and 1 +
    # two of the two-block backward + 2 dtypes x 3 ops x 3 phases of the cooperative forward,
    # and in bf16 3 ops x 3 phases holding x as bf16 (NARROW)
    assert done.stdout.split() == ["compiled", "235"]


NARROW_SCRIPT = (
    PRELUDE
    + r"""
import os, subprocess, sys, tempfile
from fusewise.ops.norms import launch as L
from triton.backends.nvidia.compiler import get_ptxas

PTXAS = get_ptxas(90).path  # the ptxas Triton itself runs for sm_90 (3.9: not bin/ptxas)


def fit(dtype, op, piece, warps, pieces, narrow, registers):
    # (registers, spilled bytes) a thread of the one-launch cooperative forward takes (ptxas
    # for sm_90a)
    t = "*" + dtype
    args = dict(X=t, R=t, W=t, B=t, Y=t, H=t, Mean="*fp32", Rstd="*fp32", Part="*fp32",
                Sync="*i32", N="i32", stride_x="i32", stride_r="i32", eps="fp32")
    is_rms = op != "layer_norm"
    constants = dict(IS_RMS=is_rms, HAS_W=True, HAS_B=not is_rms, HAS_RES=op == "add_rms_norm",
                     PIECE=piece, PIECES=pieces, PHASE=0, ALIGN=1, NARROW=narrow)
    ptx = compile_for_gpu(KC.norm_fwd_coop_kernel, args, constants, warps, registers=registers)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.ptx"), "w") as f:
            f.write(ptx)
        info = subprocess.run([PTXAS, "-arch=sm_90a", "-v",
                               os.path.join(d, "k.ptx"), "-o", os.path.join(d, "k.cubin")],
                              capture_output=True, text=True).stderr
    used = int(re.search(r"Used (\d+) registers", info).group(1))
    return used, int(re.search(r"(\d+) bytes spill stores", info).group(1))


if sys.argv[1] == "narrow":  # 65,536 bf16 on 32 warps, held narrow or in fp32
    for op in ("layer_norm", "rms_norm"):
        for narrow in (True, False):
            print(op, narrow, fit("bf16", op, 65536, 32, 4, narrow, 0)[1])
elif sys.argv[1] == "capped":  # RMSNorm's pieces for two programs a multiprocessor
    for dtype, piece, narrow in (("bf16", 32768, True), ("fp32", 16384, False)):
        for cap in (0, 32):
            print(dtype, cap, *fit(dtype, "rms_norm", piece, 32, 8, narrow, cap))
else:  # every shipped setting at its widest, in each dtype it serves (fp16: not narrow ones)
    for (op, size), settings in sorted(L.FWD_COOP.items()):
        for c in settings:
            pieces = -(-c.widest // c.piece)
            for dtype in ["fp32"] if size == 4 else ["bf16"] if c.narrow else ["bf16", "fp16"]:
                used, spill = fit(dtype, op, c.piece, c.warps, pieces, c.narrow and size == 2,
                                  c.registers)
                print(op, dtype, c.piece, c.warps, c.registers, used, spill)
"""
)


def _run_fit(what: str) -> list[list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", NARROW_SCRIPT, what], env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return [line.split() for line in done.stdout.splitlines()]


def test_narrow_pieces_fit_in_registers():
    """Pieces of 65,536 bf16 elements on 32 warps (64 a thread, at most 64 registers): held as
    bf16, RMSNorm's fit in registers (ptxas for sm_90a: 0 bytes spilled under Triton 3.6, 4
    under 3.9; the kernel has no loop); held as fp32, both ops spill 128 bytes a thread or more,
    which is what the narrow hold (and its opaque step between the conversions) is for.
    LayerNorm's narrow piece is not held to it: 32 bytes under 3.6, 220 under 3.9, so it is
    not shipped (settings.FWD_COOP)."""
    spills = {(op == "rms_norm", n == "True"): int(s) for op, n, s in _run_fit("narrow")}
    assert spills[True, True] <= 8, spills
    assert min(spills[True, False], spills[False, False]) >= 128, spills


def test_a_register_cap_holds():
    """Coop.registers at 32 (two programs of 32 warps a multiprocessor) on RMSNorm's candidate
    pieces, 32,768 bf16 held narrow and 16,384 fp32: at most 32 registers a thread and no spill
    (ptxas for sm_90a, Triton 3.6 and 3.9); fp32's takes more than 32 uncapped, so the cap is
    what holds it there."""
    rows = {(d, int(cap)): (int(used), int(spill)) for d, cap, used, spill in _run_fit("capped")}
    assert rows["bf16", 32][0] <= 32 and rows["fp32", 32][0] <= 32, rows
    assert rows["bf16", 32][1] == 0 and rows["fp32", 32][1] == 0, rows
    assert rows["fp32", 0][0] > 32, rows


def test_shipped_coop_settings_fit_in_registers():
    """Every shipped FWD_COOP setting, compiled as launched at its widest width: within its
    register cap where it has one (two programs a multiprocessor rest on it), and spilling
    nothing (ptxas for sm_90a, Triton 3.6 and 3.9) but LayerNorm fp32's 8 bytes, measured with
    them (settings.FWD_COOP), in each dtype it serves (fp16 takes bf16's but the narrow ones: a
    narrow fp16 piece of 65,536 spills 28 bytes under 3.9)."""
    spilled = {("layer_norm", "fp32"): 8}
    rows = _run_fit("shipped")
    served = {4: ("fp32",), 2: ("bf16", "fp16")}
    assert {(op, d, int(p)) for op, d, p, *_ in rows} == {
        (op, d, c.piece)
        for (op, size), settings in norm_launch.FWD_COOP.items()
        for c in settings
        for d in served[size][: 1 if c.narrow else 2]
    }
    for op, dtype, piece, warps, cap, used, spill in rows:
        assert int(cap) == 0 or int(used) <= int(cap), (op, dtype, piece, warps, cap, used)
        assert int(spill) <= spilled.get((op, dtype), 0), (op, dtype, piece, warps, cap, spill)
