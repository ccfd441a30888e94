"""The fused norm backward's settings by op and element size (launch.py picks among them): tile,
warps, programs per multiprocessor and the kernel's variants, each from a sweep on an H200 whose
rows are in benchmarks/results/. Module-level so that tests and sweeps can replace them: launch.py
reads them through its own names (`launch.BWD_CONFIGS`)."""

from __future__ import annotations

from typing import NamedTuple

from .._launch import cdiv, next_power_of_2


class Bwd(NamedTuple):
    """A fused-backward setting, for rows up to `widest` elements (a power of two)."""

    widest: int
    tile: int  # elements per tile: rows of a tile = tile // the row's block
    warps: int
    per_sm: int  # programs per multiprocessor
    prefetch: bool = True  # the next tile's loads in flight during this one; without it the
    # weight is also loaded at each tile (from L1), not held: rows too wide to hold two tiles
    lean: bool = False  # the weight-gradient sums before dx, the weight held in its storage
    # dtype: fewer registers live across the row sums (kernels_bwd.norm_bwd_block_kernel)
    reload: bool = False  # x and dy read again (from L1/L2) for dx after the row sums, not held
    # across them; the weight-gradient sums first, as lean (kernels_bwd._dx_reloaded)
    fused_from: int = 0  # rows narrower than this that fall to this setting take the split
    # kernels instead (a block of `widest` with many lanes masked off loses to them)
    slice: int = 0  # columns a program takes (a power of two): a row's columns shared out among
    # programs that each walk the whole row for the row sums and hold the weight-gradient
    # accumulators of their slice only (kernels_bwd_sliced); `tile` is then the walk's chunk.
    # 0: whole rows a program (norm_bwd_block_kernel)
    unroll: bool = False  # sliced: the row sums' walk unrolled whole, else a loop of chunks
    bias_apart: bool = False  # LayerNorm: the bias gradient summed over dy by its own kernel
    # (kernels_bias.column_sums_kernel), not accumulated in the fused kernel's registers beside
    # the weight gradient's: dy is read once more, and the fused kernel has 16 registers a thread
    # more for the rest at 16,384 elements a row on 32 warps
    head: int = 0  # rows wider than this (a power of two) held as two blocks, its head and a
    # tail of the next power of two over the rest (kernels_bwd_pieces): no registers for lanes
    # a single block of the next power of two over the row would mask off; 0: one block
    tail: int = 0  # with head: the widest tail block (a power of two); rows past head + tail
    # go on to the next setting


# Backward, fused kernel, by (op, bytes per element), from the sweeps at 32288f2 (bf16) and
# 6b14187 (LayerNorm in fp32) on an H200 (2**26 elements, kernels only,
# results/h200_sweep_norms_*.txt), widths 256-8192. LayerNorm holds two more tiles (mean, the
# bias gradient) than RMSNorm and prefers smaller tiles at 512-2048 in bf16, and in fp32 (where
# the bf16 setting made 57% at 256, 90%). RMSNorm bf16 at 2048: with the kernels' bf16 rounding
# done by the GPU's cast (292b72c) the 8192-element tiles fell from 89% to 70-75% there, alone of
# all widths (the A/B at ad6e6a1 and the sweep at 7174099); 4096-element tiles on 8 warps, 2 per
# multiprocessor, made 84.8%.
# `lean` from the A/B at c823e60 (2**27 elements, two alternated rounds, backward alone, % of the
# copy ceiling, before -> lean): LayerNorm bf16 256-1024 88.1/86.0/77.8 -> 90.5/86.9/80.5 but
# 4096 85.1 -> 74.7; RMSNorm fp32 256-1024 90.3/84.4/93.9 -> 97.0/98.0/98.5 but 4096 101.3 ->
# 98.6; RMSNorm bf16 256 94.0 -> 89.1, 4096 93.1 -> 93.7; LayerNorm fp32 level (within 0.7).
# RMSNorm bf16 at 4096-8192 is not lean: add+RMSNorm's forward+backward at 8192 measured 77.2%
# lean (fee147f) against 85.2% (7eca3e9) before; RMSNorm's +0.6 at 4096 does not pay for it.
# RMSNorm bf16 at 16384, one row a tile on 32 warps, loads at each tile's turn, lean: 90.4%
# against 56.8% for the split kernels in the same sweep (74.2% with the weight held in registers,
# 54.7% with prefetch: SASS sm_90 shows 0 / 12 / 31 spilled registers).
# Rows of 16384 elsewhere, from the sweep at cb17ec1 (2**26 elements, backward alone, two
# alternated rounds, results/h200_sweep_norms_16k_cb17ec1.txt, split kernels -> fused):
# LayerNorm bf16 43.1 -> 48.8 with x and dy read again for dx (`reload`; 8.2 holding them: x, dy
# and the weight and bias gradients' accumulators at 16 registers each spill out of the 64 a
# thread has on 32 warps); RMSNorm fp32 55.0 -> 75.8 and add+RMSNorm fp32 62.1 -> 90.0, as
# RMSNorm bf16 (reload: 73.9 and 85.1). LayerNorm fp32 stays on the split kernels: 54.5 against
# 38.4 at best fused. Narrower rows on the same block (results/h200_sweep_norms_widths_d9dcb17,
# split -> fused at 8448/10240/12288/14336): LayerNorm bf16 with reload 38.5/40.7/41.9/42.9 ->
# 34.0/37.9/41.7/46.3, so it was fused from 12289 on (`fused_from`) until its bias gradient went
# apart (below); RMSNorm and add+RMSNorm win at every width in both dtypes (bf16 48.8-53.2 ->
# 64.5-79.6, fp32 53.8-61.8 -> 71.4-89.7).
# add+RMSNorm (the kernel with HAS_DH: dh read and added to dx) takes its own, from the A/B at
# 90e3d88 (add+RMSNorm's backward alone, before -> lean): bf16 256 96.0 -> 84.0, 512 94.8 ->
# 95.1, 1024 81.0 -> 91.9, 2048-4096 level, 8192 95.9 -> 81.5; fp32 256-8192 81.1/74.0/78.7/
# 93.4/95.3/81.8 -> 98.7/87.4/98.0/99.8/98.8/91.7.
# LayerNorm fp32 at 12,288-16,384 shares each row's columns out among programs of 8,192 (Bwd.slice;
# the sliced sweep at 3411063 on an H100, results/h100_sweep_sliced_3411063.txt, shipped split
# kernels -> sliced): 12,288 57.4 -> 58.8, 16,384 58.5 -> 66.6. It lost everywhere in bf16
# (16,384: 60.7 -> 54.6 at best) and at 32,768. Not measured at 8,193-12,287, where the last
# slice is narrow but its program still walks the whole row: two blocks take them (below).
# LayerNorm bf16 at 12,289-16,384 sums its bias gradient apart (Bwd.bias_apart: the column sums
# over dy, the fused kernel without the bias accumulators, 80 -> 8 B spilled a thread; ptxas,
# sm_90a): the sweep at a876437 on an H100 (results/h100_sweep_biasapart_a876437.txt, backward
# alone) gave 57.4/58.3/61.0 -> 63.0/63.5/65.1 at 14,336/14,848/16,384, and the A/B at 274b591
# (results/h100_ab_biasapart_274b591.csv, forward+backward) x1.073 at 16,384 in bf16, x1.085 in
# fp16 (which takes bf16's). In fp32 it lost everywhere (16,384 sliced 67.4 -> 54.6, fused 45.1).
# Narrower rows take two blocks (below), with the bias accumulated in the kernel.
# Rows of 8,193-12,288 held as a head block of 8,192 and a tail block (Bwd.head, Bwd.tail), from
# the sweep on an H100 (results/h100_sweep_pieces_3126e87.txt, 2**27 elements, backward alone,
# % of the copy ceiling, the shipped before and after within 0.8), shipped -> two blocks at
# 8,704 / 9,216 / 10,240 / 12,288:
# LayerNorm bf16 51.8/53.6/56.7/61.2 -> 81.0/75.0 (8 warps, the next row's loads in flight, the
#   bias gradient in the kernel) and 63.5/65.9 (16 warps, loads at their turn);
# LayerNorm fp32 (split kernels to 12,287, then sliced) 55.1/55.3/57.0/58.8 -> 89.6/89.8/81.7/79.2
#   (16 warps);
# RMSNorm bf16 84.1/85.0 -> 95.8/96.1 (8 warps, next row in flight; level at 10,240, 93.1 ->
#   87.2 at best at 12,288); RMSNorm fp32 91.9/92.0/95.0 -> 96.2/96.5/98.0 (16 warps; 95.9 ->
#   94.1 at 12,288); add+RMSNorm fp32 94.2/94.3 -> 97.0/97.8 (16 warps; +1.2 at 10,240 on 32).
# add+RMSNorm bf16 keeps one block: +2.7 at 8,704, slower from 9,216. Every op lost at 14,848
# (a tail of 8,192: the one block's lanes, on fewer warps).
# The last entry's widest block is the fused kernel's reach (capped by MAX_BLOCK_N); wider rows
# take the split kernels. Keys: (op, bytes per element), fp16 taking bf16's.
_RMS_16384 = Bwd(16384, 16384, 32, 1, prefetch=False, lean=True)


def _two_blocks(warps: int, tail: int, prefetch: bool) -> Bwd:
    """Rows of 8,193 to 8,192 + tail as a head block of 8,192 and a tail block."""
    return Bwd(16384, 16384, warps, 1, prefetch=prefetch, head=8192, tail=tail)


BWD_CONFIGS = {
    ("layer_norm", 2): (
        Bwd(256, 8192, 16, 1, lean=True),
        Bwd(2048, 4096, 4, 2, lean=True),
        Bwd(8192, 8192, 8, 1),
        _two_blocks(8, 1024, prefetch=True),
        _two_blocks(16, 4096, prefetch=False),
        Bwd(16384, 16384, 32, 1, prefetch=False, lean=True, reload=True, bias_apart=True),
    ),
    ("layer_norm", 4): (
        Bwd(2048, 2048, 16, 2),
        Bwd(8192, 2048, 8, 1),
        _two_blocks(16, 4096, prefetch=False),
        Bwd(16384, 4096, 16, 1, slice=8192, fused_from=12288),
    ),
    ("rms_norm", 2): (
        Bwd(1024, 8192, 16, 1),
        Bwd(2048, 4096, 8, 2),
        Bwd(8192, 8192, 16, 1),
        _two_blocks(8, 1024, prefetch=True),
        _RMS_16384,
    ),
    ("rms_norm", 4): (
        Bwd(1024, 8192, 16, 1, lean=True),
        Bwd(8192, 8192, 16, 1),
        _two_blocks(16, 2048, prefetch=False),
        _RMS_16384,
    ),
    ("add_rms_norm", 2): (
        Bwd(512, 8192, 16, 1),
        Bwd(1024, 8192, 16, 1, lean=True),
        Bwd(2048, 4096, 8, 2),
        Bwd(8192, 8192, 16, 1),
        _RMS_16384,
    ),
    ("add_rms_norm", 4): (
        Bwd(1024, 8192, 16, 1, lean=True),
        Bwd(8192, 8192, 16, 1, lean=True),
        _two_blocks(16, 1024, prefetch=False),
        _RMS_16384,
    ),
}


class Walk(NamedTuple):
    """A forward that walks each row in chunks (kernels_walk.norm_fwd_walk_kernel), for rows of
    `narrowest` to `widest` elements."""

    narrowest: int
    widest: int
    chunk: int  # elements a walk's step loads (a power of two; capped at the row's block)
    warps: int
    unroll: bool = False  # each walk unrolled whole (its loads all in flight at once; more
    # registers), or a loop of one chunk a step
    welford: bool = False  # LayerNorm: mean and variance in one walk (each lane's running mean
    # and M2, merged at the end), so two walks over the row instead of three
    hold: int = 0  # the row's first `hold` elements (a power of two below `narrowest`) held in
    # registers from the first walk, the walks going over the rest: less of a row read again

    def chunks_of(self, n: int) -> tuple[int, int, bool]:
        """(chunk, chunks, even) of the walked part of a row of n: the chunk capped at that
        part's block; even when the chunks cover it exactly (no masks)."""
        if self.hold and (self.welford or self.hold >= n or self.hold & (self.hold - 1)):
            raise ValueError(
                f"{self} holds {self.hold} elements of rows of {n}: it must hold a power of "
                "two fewer than the row's, and not walk as welford"
            )
        rest = n - self.hold
        chunk = min(self.chunk, next_power_of_2(rest))
        chunks = cdiv(rest, chunk)
        return chunk, chunks, rest == chunk * chunks


class Coop(NamedTuple):
    """A forward that cuts each row into pieces of `piece` elements, one program each, which wait
    for each other's statistics (kernels_coop.norm_fwd_coop_kernel), for rows of `narrowest` to
    `widest` elements."""

    narrowest: int
    widest: int
    piece: int  # elements a program holds in registers (a power of two)
    warps: int
    # 16-bit inputs held in registers as they are, converted to fp32 at each use: twice the
    # elements in the same registers (fp32 inputs ignore it)
    narrow: bool = False
    # a cap on a thread's registers (Triton's maxnreg; 0: the compiler's choice): two programs
    # of 32 warps share a multiprocessor at 32 or fewer, one loading while the other computes
    registers: int = 0


# The cooperative forward by (op, bytes per element); it takes precedence over FWD_WALK. From
# the sweep on an H100 (results/h100_sweep_coop_417ea24.txt, benchmarks/sweep_norm_coop.py,
# 2**27 elements, kernels only, the shipped before and after within 0.8), shipped ->
# cooperative at 65,536 / 262,144: add+RMSNorm bf16 99.4/70.2 -> 94.7/94.2 (32,768 on 32 warps;
# 65,536 keeps its walk), add+RMSNorm fp32 84.7/69.0 -> 97.5/98.3 (32,768, 32 warps), RMSNorm
# fp32 95.0/70.3 -> 92.7/90.0 (32,768, 32 warps; 65,536 keeps its walk), LayerNorm fp32
# 89.2/68.9 -> 87.3/85.0 (likewise), RMSNorm bf16 100.2/71.6 -> 81.4/78.0 (16,384 on 16 warps).
# LayerNorm bf16: 70.4 -> 70.8 at best, not shipped. bf16 pieces of 64 KB (the most 32 warps
# hold in fp32) fall short of fp32's 128 KB: a program's fixed cost (its ticket, the wait, the
# merge) weighs twice as much. Hence `narrow`: 65,536 bf16 elements held as bf16, 128 KB. Its A/B
# against the settings before (results/h100_ab_narrow_3dde8ed.txt, an H100, kernels only, % of
# the copy ceiling, 131,072 / 200,000 / 262,144; 200,000 with pieces then shared out evenly):
# RMSNorm bf16 77.7/75.8/75.4 -> 83.3/76.5/81.3; LayerNorm bf16 (the wide kernel before)
# 76.5/65.9/68.8 -> 74.5/64.7/74.1. LayerNorm stays on the wide kernel: it lost at 131,072 and
# 200,000, and its narrow piece holds in registers only by the compiler's grace (ptxas for
# sm_90a: 32 bytes spilled under Triton 3.6, 220 under 3.9, more than held in fp32), where
# RMSNorm's, with one use of x before the wait, spills 0 and 4. Then `registers`: a program of
# 32 warps capped at 32 registers a thread leaves room for a second on its multiprocessor, one
# loading while the other waits or merges. From the sweep on an H100 (results/
# h100_ab_narrow_d308537.txt, 2**27 elements, kernels only, the shipped before and after within
# 0.8), at 98,304 / 131,072 / 200,000 / 262,144: RMSNorm bf16 65,536 narrow 79.9/82.6/76.8/81.3
# -> 32,768 narrow, capped at 32 (0 bytes spilled, Triton 3.6 and 3.9) 88.0/88.2/86.3/87.4;
# RMSNorm fp32 32,768 90.1/89.9/88.6/88.0 -> 16,384 capped 91.7/91.6/91.0/89.8 (0 spilled);
# LayerNorm fp32 85.5/84.8/83.5/83.8 -> 85.2/83.0/83.4/82.3 (16,384 on 32 warps capped at 32).
# The next sweep (results/h100_coop_capped_30e020e.txt, H100, within 0.7), at 73,728 / 98,304
# / 131,072 / 200,000 / 262,144: LayerNorm fp32 81.8/85.0/85.0/83.4/84.2 -> 16,384 on 16 warps
# capped at 64 (two programs; 8 bytes spilled, Triton 3.6 and 3.9) 86.9/86.3/85.7/85.7/85.3;
# add+RMSNorm fp32 95.9/95.7/95.8/96.5/95.6 -> 16,384 on 32 warps capped at 32 (0 spilled)
# 97.2/97.1/97.0/96.5/96.7.
# fp16 skips narrow settings (launch._forward_plan): never measured, and its narrow piece of
# 65,536 spills 28 bytes under Triton 3.9; it keeps pieces of 16,384. Widths past 262,144 were
# not measured and keep the wide kernel.
_PAST_65536 = 65537, 262144
FWD_COOP: dict = {
    ("add_rms_norm", 2): (Coop(*_PAST_65536, 32768, 32),),
    ("add_rms_norm", 4): (Coop(65536, 262144, 16384, 32, registers=32),),
    ("rms_norm", 2): (
        Coop(*_PAST_65536, 32768, 32, narrow=True, registers=32),
        Coop(*_PAST_65536, 16384, 16),
    ),
    ("rms_norm", 4): (Coop(*_PAST_65536, 16384, 32, registers=32),),
    ("layer_norm", 4): (Coop(*_PAST_65536, 16384, 16, registers=64),),
}


# The walking forward by (op, bytes per element); rows outside every setting's widths take the
# block path (up to MAX_BLOCK_N_FWD) or the wide path. From the sweeps on an H200 (2**27
# elements, kernels only, % of the copy ceiling; results/h200_sweep_walk_rolled_7ab4d9a.txt,
# rolled walks with the shipped kernels before and after in the same run, and
# h200_sweep_walk_2213a72.txt, unrolled): the walk reads the row again from L1/L2 instead of
# holding it, so a program needs 31-40 registers a thread where the block kernel needs 64-128,
# and 2-4 programs share a multiprocessor where one did (torch.compile's forward at these
# widths has the same shape). shipped -> walked:
# LayerNorm bf16 12,288/16,384/32,768: 76.0/89.0/74.8 -> 97.5/95.5/90.1 (8,192: 95.0 -> 92.6 at
#   best, 65,536: 69.5 -> 70.2, 262,144: 60.8 -> 47.8: not walked);
# LayerNorm fp32 8,192/12,288/16,384/32,768: 95.9/75.9/96.5/79.0 -> 99.9/98.5/99.3 (unrolled,
#   the other run)/90.9;
# RMSNorm bf16 8,192-65,536: 93.5/85.6/91.9/88.5/79.6 -> 98.4/97.6/98.0/97.6/91.5 (65,536
#   unrolled, the other run; 87.7 rolled);
# RMSNorm fp32 8,192-65,536: 96.2/96.6/96.1/90.4/77.3 -> 100.2/100.4/100.2/99.5/84.0 (unrolled);
# add+RMSNorm bf16 8,192-65,536: 95.9/96.5/96.7/96.7/72.9 -> 101.5/100.5/100.4/100.1/77.7;
# add+RMSNorm fp32 8,192 and 16,384: 96.4/98.4 -> 101.5/102.0 (12,288: 96.8 -> 97.3 and 32,768:
#   97.5 -> 85.4 at best: not walked).
# 262,144 was level or slower everywhere (a 512 KB row no longer stays in L2 between walks).
# Rows past 32,768 hold their first 32,768 elements in registers (Walk.hold) where it won, from
# the sweep on an H100 (results/h100_sweep_fwdhold_3a4db8d.txt, 2**27 elements, kernels only, the
# shipped before and after in the same run, within 0.3), shipped -> held at 49,152 / 65,536:
# LayerNorm fp32 93.3/83.1 -> 94.9/89.2 (chunks of 8,192), RMSNorm fp32 94.9/88.3 -> 97.7/93.0
# (4,096), add+RMSNorm bf16 95.3/83.5 -> 98.3/97.6 (8,192 unrolled), add+RMSNorm fp32 77.9/75.3
# (the wide kernel) -> 94.8/83.0 (4,096). LayerNorm bf16 (92.0 at best against 92.0 welford) and
# RMSNorm bf16 (96.8 against 98.3) keep theirs; at 131,072 holding lost or gained at most 4.5
# points in one round (not shipped: the widths between were not measured).
# RMSNorm bf16 at 16,385-32,768 walks chunks of 8,192 on 32 warps, not one chunk of 32,768 (44%
# of it masked at 18,432): the sweep on an H100 at 99eaec9 (results/h100_sweep_rms_walk_99eaec9,
# 2**27 elements, the shipped before and after within 0.2), shipped -> 8,192 at 18,432 / 20,480 /
# 24,576 / 32,768: 82.6/87.4/95.4/98.5 -> 98.9/98.8/98.6/98.4.
# LayerNorm's mean and variance in one walk (welford; results/h200_sweep_welford_bb46f68.txt,
# the shipped before and after in the same run): bf16 65,536 71.5 -> 79.2 (16,384 on 32 warps);
# everywhere else slower or level (bf16 32,768 93.0 -> 89.5 at best, fp32 65,536 76.5 -> 77.8).
FWD_WALK = {
    ("layer_norm", 2): (
        Walk(8193, 16384, 4096, 16),
        Walk(16385, 32768, 8192, 32),
        Walk(32769, 65536, 16384, 32, welford=True),
    ),
    ("layer_norm", 4): (
        Walk(8192, 8192, 8192, 16),
        Walk(8193, 12288, 4096, 16),
        Walk(12289, 16384, 8192, 16, unroll=True),
        Walk(16385, 32768, 32768, 32),
        Walk(32769, 65536, 8192, 32, hold=32768),
    ),
    ("rms_norm", 2): (
        Walk(8192, 16384, 8192, 16),
        Walk(16385, 32768, 8192, 32),
        Walk(32769, 65536, 32768, 32, unroll=True),
    ),
    ("rms_norm", 4): (
        Walk(8192, 8192, 8192, 16),
        Walk(8193, 32768, 32768, 32, unroll=True),
        Walk(32769, 65536, 4096, 32, hold=32768),
    ),
    ("add_rms_norm", 2): (
        Walk(8192, 16384, 16384, 32),
        Walk(16385, 32768, 32768, 32),
        Walk(32769, 65536, 8192, 32, unroll=True, hold=32768),
    ),
    ("add_rms_norm", 4): (
        Walk(8192, 8192, 16384, 32),
        Walk(12289, 16384, 32768, 32),
        Walk(32769, 65536, 4096, 32, hold=32768),
    ),
}

# The forward's block kernel without masks, by (op, bytes per element): the widths (powers of
# two, the kernel's block) whose tiles it loads and stores unmasked when the rows fill whole
# tiles. From the A/B at bce165d on an H200 (2**27 elements, kernels only, two alternated rounds,
# results/h200_sweep_unmasked_bce165d.txt, % of the copy ceiling, masked -> unmasked): LayerNorm
# fp32 16,384 85.6 -> 96.6 (ptxas for sm_90a: 89 registers a thread -> 64, two programs of 16
# warps a multiprocessor instead of one); add+RMSNorm fp32 16,384 96.7 -> 98.3 and 32,768 92.2 ->
# 97.3. Everywhere else it was level (within 0.6 at 1,024-8,192) or slower: LayerNorm bf16 16,384
# 89.1 -> 58.1 (64 registers -> 82: one program a multiprocessor), LayerNorm fp32 32,768 80 -> 72,
# RMSNorm fp32 32,768 90.9 -> 85.3. Of the three, LayerNorm and add+RMSNorm fp32 at 16,384 now
# walk (FWD_WALK, which takes precedence).
FWD_UNMASKED = {("add_rms_norm", 4): (32768,)}
