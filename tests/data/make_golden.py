"""Regenerate the golden op graphs: python tests/data/make_golden.py (from the repo root).

They are one recorded step of each variant of fusewise.examples.gpt on the CPU (torch 2.13.0),
so the analyzer tests are exact and independent of the recorder and of timing. Regenerate when
the example or torch's op decompositions change, and check the diff of the test expectations.
"""

import pathlib
import warnings

from fusewise.capture.opgraph import Recorder
from fusewise.examples.gpt import make_step

HERE = pathlib.Path(__file__).parent

if __name__ == "__main__":
    warnings.simplefilter("ignore")  # the CPU reference-path notices of the fusewise variant
    for variant in ("naive", "clean"):
        step, _, _ = make_step(variant=variant)
        step()  # optimizer state exists, as in a steady-state step
        with Recorder() as rec:
            step()
        (HERE / f"gpt_{variant}_step.json").write_text(rec.graph.to_json())
        print(variant, len(rec.graph.ops), "ops")
