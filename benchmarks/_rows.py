"""What every benchmark writes: the commit it measured and long-format CSV rows."""

import csv
import os
import subprocess


def commit() -> str:
    """FUSEWISE_COMMIT (set it where the tree has no .git, e.g. the GPU machine), else git's."""
    if os.environ.get("FUSEWISE_COMMIT"):
        return os.environ["FUSEWISE_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def append_csv(path: str, rows: list[dict]) -> None:
    if not rows:
        return
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)
