"""Run a benchmark script with LayerNorm's backward taking its two row sums one way or the other,
for an A/B in one GPU session (one process per variant; alternate them).

  joint     one cross-thread reduction of the pair (kernels_bwd._row_means): what ships
  separate  two tl.sum calls, two shared-memory round trips: the kernels before it

The variant is appended to every row's provider (`fusewise[bwd: shipped][joint]`), so both
variants can go to one CSV.

    python benchmarks/with_row_sums.py separate benchmarks/sweep_norm_configs.py --parts bwd
"""

from __future__ import annotations

import runpy
import sys

import _rows
import triton
import triton.language as tl

from fusewise.ops.norms import kernels_bwd


@triton.jit
def _separate_row_means(xhat, wdy, N, IS_RMS: tl.constexpr):
    c1 = tl.sum(xhat * wdy, axis=1) / N
    c2 = c1 if IS_RMS else tl.sum(wdy, axis=1) / N
    return c1, c2


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("joint", "separate"):
        sys.exit(__doc__)
    variant, script = sys.argv[1], sys.argv[2]
    # the kernels find _row_means among their module's globals when they are compiled: replaced
    # before the first launch
    if variant == "separate":
        kernels_bwd._row_means = _separate_row_means
    row = _rows.row

    def tagged_row(op, provider, *args, **kwargs):
        return row(op, f"{provider}[{variant}]", *args, **kwargs)

    _rows.row = tagged_row
    sys.argv = [script, *sys.argv[3:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
