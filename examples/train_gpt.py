"""A small GPT training loop with the classic problems (fusewise.examples.gpt, naive variant).

python examples/train_gpt.py --steps 50
fusewise diagnose examples/train_gpt.py --steps 3 -- --steps 50
fusewise diagnose examples/train_gpt.py --sizes seq=128,256 -- --steps 50   # + memory scaling
"""

import argparse

import torch

from fusewise.examples.gpt import GPTConfig, make_step

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--variant", default="naive", choices=["naive", "clean", "fusewise"])
    ap.add_argument("--seq", type=int, default=GPTConfig.seq, help="tokens per sequence")
    ap.add_argument("--batch", type=int, default=GPTConfig.batch)
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    config = GPTConfig(seq=a.seq, batch=a.batch)
    step, model, opt = make_step(config, variant=a.variant, device="cuda" if cuda else "cpu")
    for i in range(a.steps):
        loss = step()
        if i % 10 == 0:
            print(f"step {i}: loss {loss.item():.3f}")  # a host sync, on purpose: users print
