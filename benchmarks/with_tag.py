"""Run a benchmark script with a tag appended to every row's provider (`fusewise[old]`), for an
A/B of two source trees in one GPU session: one process per variant (PYTHONPATH picks the tree),
alternated, every row in one CSV; benchmarks/ab_summary.py --a <tag> --b <tag> compares them.

    PYTHONPATH=old/src:benchmarks python benchmarks/with_tag.py old benchmarks/bench_rotary.py \
        --csv ab.csv
"""

from __future__ import annotations

import re
import runpy
import sys

import _rows


def main() -> None:
    if len(sys.argv) < 3 or not re.fullmatch(r"\w+", sys.argv[1]):
        sys.exit(__doc__)
    tag, script = sys.argv[1], sys.argv[2]
    row = _rows.row

    def tagged_row(op, provider, *args, **kwargs):
        return row(op, f"{provider}[{tag}]", *args, **kwargs)

    _rows.row = tagged_row
    sys.argv = [script, *sys.argv[3:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
