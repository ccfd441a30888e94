#!/bin/bash
# fusewise verify and the demo on the GPU machine (the issue's "verify on the demo and on a small
# HF Llama script"), logs and JSON under $OUT. Usage: bash benchmarks/gpu_verify.sh
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=src:.site PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
t0=$SECONDS
timeout 200 python -m fusewise verify examples/train_hf_llama.py --json "$OUT/verify_hf_llama.json" \
  -- --steps 40 > "$OUT/verify_hf_llama.log" 2>&1
echo "verify hf llama rc=$? ($((SECONDS - t0)) s)"
grep -E "saves|costs|no measurable|losses|swapped" "$OUT/verify_hf_llama.log" | head -8
t0=$SECONDS
timeout 200 python -m fusewise verify examples/train_gpt.py --json "$OUT/verify_train_gpt.json" \
  -- --steps 40 > "$OUT/verify_train_gpt.log" 2>&1
echo "verify train_gpt rc=$? ($((SECONDS - t0)) s)"
grep -E "saves|costs|no measurable|losses|swapped" "$OUT/verify_train_gpt.log" | head -8
t0=$SECONDS
timeout 150 python -m fusewise demo > "$OUT/demo.log" 2>&1
echo "demo rc=$? ($((SECONDS - t0)) s)"
grep -E "saves|costs|no measurable|losses|predicted" "$OUT/demo.log" | head -6
