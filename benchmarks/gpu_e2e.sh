#!/bin/bash
# End-to-end Llama training step (benchmarks/bench_e2e.py) in about 5 minutes of one device call:
# eager, compile, liger, fusewise, fusewise+compile (and the last two with cuDNN attention off),
# one process each, rows in
# $OUT/e2e.csv (each as soon as its variant is measured), the log in $OUT/bench_e2e.log.
# Usage on the GPU machine: FUSEWISE_COMMIT=<hash> bash benchmarks/gpu_e2e.sh
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
if [ -d .whl ] && [ ! -d .site ]; then pip install -q --no-index --no-deps --target .site .whl/*.whl; fi
export PYTHONPATH=src:.site PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv \
  | tee "$OUT/gpu_e2e.txt"
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', \
triton.__version__, 'transformers', transformers.__version__)" 2>&1 | tee -a "$OUT/gpu_e2e.txt"
python -c "import importlib.metadata as m; print('liger-kernel', m.version('liger-kernel'))" \
  2>&1 | tee -a "$OUT/gpu_e2e.txt"
t0=$SECONDS
# --budget stops starting variants in time for the summary; compile variants take the longest
# the :no-cudnn pair: fusewise with and without torch.compile when SDPA takes flash attention
# (under torch.compile the cuDNN attention backward ran 2.7x slower than in eager)
VARIANTS=eager,compile,liger,fusewise,fusewise+compile,fusewise:no-cudnn,fusewise+compile:no-cudnn
timeout ${E2E_S:-290} python benchmarks/bench_e2e.py --variants "$VARIANTS" --steps 12 --warmup 3 \
  --compile-warmup 5 --timeout 120 --budget $(( ${E2E_S:-290} - 20 )) --csv "$OUT/e2e.csv" \
  > "$OUT/bench_e2e.log" 2>&1
echo "bench_e2e rc=$? ($((SECONDS - t0)) s)"
grep -E "^variant|^(eager|compile|liger|fusewise)|largest|process took|skipped|failed" \
  "$OUT/bench_e2e.log" | grep -v Warning | tail -30
