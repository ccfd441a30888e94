"""A small GPT training loop with the classic problems (fusewise.examples.gpt, naive variant).

python examples/train_gpt.py --steps 50
fusewise diagnose examples/train_gpt.py --steps 3 -- --steps 50
"""

import argparse

import torch

from fusewise.examples.gpt import GPTConfig, make_step

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--variant", default="naive", choices=["naive", "clean", "fusewise"])
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    step, model, opt = make_step(GPTConfig(), variant=a.variant, device="cuda" if cuda else "cpu")
    for i in range(a.steps):
        loss = step()
        if i % 10 == 0:
            print(f"step {i}: loss {loss.item():.3f}")  # a host sync, on purpose: users print
