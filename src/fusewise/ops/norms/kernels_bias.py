"""LayerNorm's bias gradient summed over dy by its own kernel (launch.Bwd.bias_apart), so that the
fused or sliced backward (kernels_bwd, kernels_bwd_sliced) runs without the bias accumulators:
for bf16 rows of 8,193-16,384 those spilled (80 -> 8 B a thread on 32 warps, ptxas sm_90a), and
the column sums' extra read of dy costs less than the spills did (settings.py has the sweep)."""

import triton
import triton.language as tl

from .._launch import round_to as _round
from .kernels import _times


@triton.jit
def column_sums_kernel(
    DY,
    Part,
    M,
    N,
    stride_dy,
    rows_per_group,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ALIGN: tl.constexpr = 1,
):
    """The bias gradient's partials on their own (Bwd.bias_apart): grid (column blocks, row
    groups), row `group` of Part gets Σ dy over the group's rows for the program's columns, in
    fp32 and a fixed order; rounded to Part's dtype, so that a single group writes dbias itself.
    ALIGN: as the forward's (kernels.py)."""
    N, stride_dy = _times(N, ALIGN), _times(stride_dy, ALIGN)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    group = tl.program_id(1)
    col_ok = cols < N
    # whole tiles accumulated, reduced over rows once at the end (as kernels_bwd's fused kernel)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    row_end = tl.minimum(M, (group + 1) * rows_per_group)
    for start in range(group * rows_per_group, row_end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows < row_end)[:, None] & col_ok[None, :]
        ptrs = DY + rows.to(tl.int64)[:, None] * stride_dy + cols[None, :]
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    total = _round(tl.sum(acc, axis=0), Part.dtype.element_ty)
    tl.store(Part + group.to(tl.int64) * N + cols, total, mask=col_ok)
