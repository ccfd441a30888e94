"""Summarise py-spy's raw (collapsed-stack) output per thread: the frames with the most samples,
self and inclusive. python benchmarks/spy_summary.py spy.txt [main-thread filter substring]"""

import collections
import sys


def main():
    path = sys.argv[1]
    keep = sys.argv[2] if len(sys.argv) > 2 else None
    per_thread = collections.defaultdict(lambda: (collections.Counter(), collections.Counter()))
    totals = collections.Counter()
    lines = [line.rstrip().rpartition(" ") for line in open(path)]
    main_tid = next((s.split(":")[0] for s, _, _ in lines if "MainThread" in s.split(";")[0]), "")
    for stack, _, n in lines:
        frames = stack.split(";")
        tid = frames[0].split(":")[0]  # "thread (553)", named or not
        thread = "main" if tid == main_tid else tid
        if thread == "main" and keep and keep not in stack:
            continue
        n = int(n)
        totals[thread] += n
        own, incl = per_thread[thread]
        own[frames[-1]] += n
        for f in set(frames[1:]):
            incl[f] += n
    for thread, (own, incl) in per_thread.items():
        print(f"===== {thread}: {totals[thread]} samples")
        print("--- self")
        for f, n in own.most_common(40):
            print(f"{n:6d} {f[:150]}")
        print("--- inclusive")
        for f, n in incl.most_common(70):
            print(f"{n:6d} {f[:150]}")


if __name__ == "__main__":
    main()
