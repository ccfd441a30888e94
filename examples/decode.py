"""Greedy decoding with a static KV cache, eager or replayed from a CUDA graph
(fusewise.examples.decode; the graph: fusewise.graphs.capture).

python examples/decode.py --mode eager --tokens 200 --batch 1
python examples/decode.py --mode graph --tokens 200 --batch 1
fusewise diagnose examples/decode.py -- --mode eager --tokens 400   # each decode step is a step

Prints tokens/s (batch x new tokens / wall time, prompt included in the time). Eager and graph
produce the same tokens (tests/test_graphs.py checks it on a GPU).
"""

import argparse
import time

import torch

import fusewise
from fusewise.examples.decode import DecodeConfig, generate, make_decoder


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["eager", "graph"], default="eager")
    ap.add_argument("--tokens", type=int, default=200, help="new tokens per sequence")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=8, help="prompt length")
    ap.add_argument("--layers", type=int, default=DecodeConfig.layers)
    ap.add_argument("--d-model", type=int, default=DecodeConfig.d_model)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    c = DecodeConfig(layers=a.layers, d_model=a.d_model, max_len=a.prompt + a.tokens)
    dtype = getattr(torch, a.dtype)
    model, cache, step = make_decoder(c, a.batch, device=a.device, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, c.vocab, (a.batch, a.prompt), generator=g).to(a.device)
    if a.mode == "graph":
        # capture raises (never falls back to eager) on a CPU device, with the reason
        step = fusewise.graphs.capture(step, prompt[:, 0].clone())
    generate(step, cache, prompt, min(a.tokens, 4))  # warm-up (graph: the first replays)
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = generate(step, cache, prompt, a.tokens, on_step=fusewise.step)
    last = out[:, -8:].tolist()  # reads the tokens back (a sync) once decoding is done
    seconds = time.perf_counter() - t0
    print(
        f"{a.mode}: {a.batch * a.tokens / seconds:,.0f} tokens/s ({a.batch} x {a.tokens} tokens "
        f"in {seconds * 1e3:.1f} ms, {a.device}, {a.dtype}); last tokens {last[0]}"
    )
    return out


if __name__ == "__main__":
    main()
