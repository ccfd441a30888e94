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


def run_tagged(tag: str, script: str, args: list[str]) -> None:
    """Runs script as __main__ with args, every row it makes tagged."""
    row = _rows.row

    def tagged_row(op, provider, *a, **kw):
        return row(op, f"{provider}[{tag}]", *a, **kw)

    _rows.row = tagged_row
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    if len(sys.argv) < 3 or not re.fullmatch(r"\w+", sys.argv[1]):
        sys.exit(__doc__)
    run_tagged(sys.argv[1], sys.argv[2], sys.argv[3:])


if __name__ == "__main__":
    main()
