"""A plain Hugging Face training loop: a Llama-architecture model from config (random init, no
download), torch's AdamW, random token batches, the loss from `labels`.

python examples/train_hf_llama.py --steps 20
fusewise diagnose examples/train_hf_llama.py -- --steps 40
fusewise verify examples/train_hf_llama.py -- --steps 40     # unpatched against fusewise.patch
"""

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

if __name__ == "__main__":
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    # on a GPU a step that keeps it busy (~30 ms on an H200): a smaller one is bound by the host
    ap.add_argument("--hidden", type=int, default=2048 if cuda else 64)
    ap.add_argument("--layers", type=int, default=4 if cuda else 2)
    ap.add_argument("--vocab", type=int, default=32768 if cuda else 2048)
    ap.add_argument("--seq", type=int, default=1024 if cuda else 64)
    ap.add_argument("--batch", type=int, default=8 if cuda else 4)
    ap.add_argument("--dtype", default="bf16" if cuda else "fp32", choices=["bf16", "fp32"])
    a = ap.parse_args()
    device = "cuda" if cuda else "cpu"
    config = LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=4 * a.hidden,
        num_hidden_layers=a.layers,
        num_attention_heads=max(1, a.hidden // 64),
        num_key_value_heads=max(1, a.hidden // 256),
        max_position_embeddings=a.seq,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    g = torch.Generator(device="cpu").manual_seed(1)
    for i in range(a.steps):
        ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i % 10 == 0:
            print(f"step {i}: loss {loss.item():.4f}")
