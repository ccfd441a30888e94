"""The demo's naive and fusewise steps side by side from the same weights: their losses step by
step (the demo's verify reported "losses NOT equal" on the H200; this shows where they part).

python benchmarks/demo_losses.py [steps] [lr ...]
"""

import sys
import warnings

import torch

from fusewise.examples.gpt import GPTConfig, make_step


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    lrs = [float(v) for v in sys.argv[2:]] or [1e-3]
    cfg = GPTConfig(vocab=32768, seq=1024, d_model=1024, heads=16, layers=4, batch=8)
    for lr in lrs:
        print(f"lr {lr:g}")
        for variant in ("naive", "clean", "fusewise"):
            step, _, opt = make_step(cfg, variant=variant, device="cuda", dtype=torch.bfloat16)
            for group in opt.param_groups:
                group["lr"] = lr
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                values = [float(step()) for _ in range(steps)]
            print(f"  {variant:9s}", " ".join(f"{v:7.4f}" for v in values))
            del step
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
