#!/bin/bash
# End-to-end Llama training step (benchmarks/bench_e2e.py --all) in one device call of about 8
# minutes at most: eager, compile, liger, fusewise, fusewise+compile, one process each, rows in
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
timeout 490 python benchmarks/bench_e2e.py --all --steps 15 --warmup 3 --compile-warmup 6 \
  --timeout 200 --budget 450 --csv "$OUT/e2e.csv" > "$OUT/bench_e2e.log" 2>&1
echo "bench_e2e rc=$? ($((SECONDS - t0)) s)"
grep -E "^\[|^variant|^e2e|^(eager|compile|liger|fusewise)|largest" "$OUT/bench_e2e.log" \
  | grep -v Warning | tail -40
