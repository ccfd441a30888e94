"""Run a benchmark script with the kernels' fp32 -> bf16 rounding done one way or the other, for an
A/B in one GPU session (one process per variant; alternate them).

  native  the GPU's cast (cvt.rn), what the kernels ship with (ops/_launch.round_to)
  bits    the integer rounding the kernels use under Triton's interpreter, forced on the GPU:
          the kernels as they were before round_to took the cast on the GPU

The variant is appended to every row's provider (`fusewise[fwd: shipped][bits]`), so both
variants can go to one CSV.

    python benchmarks/with_rounding.py bits benchmarks/sweep_norm_configs.py --parts fwd --csv a.csv
"""

from __future__ import annotations

import sys

import triton.language as tl
from with_tag import run_tagged

from fusewise.ops import _launch


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("bits", "native"):
        sys.exit(__doc__)
    variant, script = sys.argv[1], sys.argv[2]
    # round_to reads this global when a kernel is compiled: set it before the first launch.
    _launch.INTERPRETED = tl.constexpr(variant == "bits")
    run_tagged(variant, script, sys.argv[3:])


if __name__ == "__main__":
    main()
