"""Summarise an A/B of benchmarks/with_rounding.py: for each measured case, the median % of the
copy ceiling of each variant over its rounds (processes), and the speed of B over A as the
median of the per-round time ratios with their [min, max].

    python benchmarks/ab_summary.py ab.csv [--a bits --b native]
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import statistics


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--a", default="bits")
    p.add_argument("--b", default="native")
    args = p.parse_args()
    # (case, variant) -> [(ms, pct)] in the order the rounds wrote them
    runs = collections.defaultdict(list)
    for r in csv.DictReader(open(args.csv)):
        m = re.fullmatch(r"(.*)\[(\w+)\]", r["provider"])
        if not m or m.group(2) not in (args.a, args.b):
            continue
        case = (r["op"], m.group(1), r["mode"], r["shape"], r["dtype"])
        pct = float(r["pct_of_ceiling"]) if r["pct_of_ceiling"] else float("nan")
        runs[case, m.group(2)].append((float(r["ms"]), pct))
    cases = sorted({case for case, _ in runs})
    print(f"{'case':<62} {args.a:>7} {args.b:>7}  {args.b}/{args.a} speed [min, max]")
    for case in cases:
        a, b = runs.get((case, args.a), []), runs.get((case, args.b), [])
        if not a or not b:
            continue
        ratios = [ta / tb for (ta, _), (tb, _) in zip(a, b)]
        pa = statistics.median(p for _, p in a)
        pb = statistics.median(p for _, p in b)
        label = " ".join(case)
        print(
            f"{label:<62} {pa:7.1f} {pb:7.1f}  x{statistics.median(ratios):.3f} "
            f"[{min(ratios):.3f}, {max(ratios):.3f}] n={len(ratios)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
