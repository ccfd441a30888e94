#!/bin/bash
# The device calls at the commit that lands, in two stages (each inside one call's 10 minutes):
#   tests: the GPU test suite, then the CLI on a GPU training script with --sizes (exit status)
#   bench: AdamW, the norms and linear + cross-entropy against the peers, rows as CSV
# Usage on the GPU machine: FUSEWISE_COMMIT=<hash> bash benchmarks/gpu_run.sh tests|bench
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
if [ -d .whl ] && [ ! -d .site ]; then pip install -q --no-index --no-deps --target .site .whl/*.whl; fi
export PYTHONPATH=src:.site PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv \
  | tee "$OUT/gpu_$1.txt"
if [ "$1" = tests ]; then
  t0=$SECONDS
  timeout ${PYTEST_S:-500} python -m pytest -q -p no:cacheprovider tests > "$OUT/pytest_gpu.log" 2>&1
  echo "pytest rc=$? ($((SECONDS - t0)) s)"; grep -E "FAILED|ERROR|Fatal" "$OUT/pytest_gpu.log" | head -20
  tail -2 "$OUT/pytest_gpu.log"
  t0=$SECONDS
  timeout 150 python -m fusewise diagnose examples/train_gpt.py --steps 3 --warmup 1 \
    --sizes seq=128,256 --json "$OUT/diagnose_train_gpt.json" -- --steps 40 \
    > "$OUT/diagnose_cli.log" 2>&1
  echo "fusewise diagnose --sizes rc=$? ($((SECONDS - t0)) s)"
fi
if [ "$1" = bench ]; then
  t0=$SECONDS
  timeout 120 python benchmarks/bench_adamw.py --csv "$OUT/adamw.csv" > "$OUT/bench_adamw.log" 2>&1
  echo "bench_adamw rc=$? ($((SECONDS - t0)) s)"; grep -v Warning "$OUT/bench_adamw.log" | tail -8
  t0=$SECONDS
  timeout 130 python benchmarks/bench_norms.py --widths 1024,4096,16384 --dtypes bf16 \
    --providers fusewise,torch,liger --csv "$OUT/norms.csv" > "$OUT/bench_norms.log" 2>&1
  echo "bench_norms rc=$? ($((SECONDS - t0)) s)"; grep -v Warning "$OUT/bench_norms.log" | tail -12
  t0=$SECONDS
  timeout 170 python benchmarks/bench_linear_ce.py --tokens 16384 --chunks 2048 \
    --csv "$OUT/linear_ce.csv" > "$OUT/bench_linear_ce.log" 2>&1
  echo "bench_linear_ce rc=$? ($((SECONDS - t0)) s)"; grep -v Warning "$OUT/bench_linear_ce.log" | tail -12
fi
