#!/bin/bash
# One device call: linear-CE benchmark (+ precision) first, then the GPU test suite.
# Usage on the GPU machine: FUSEWISE_COMMIT=<hash> bash benchmarks/gpu_run_linear_ce.sh
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
if [ -d .whl ]; then pip install -q --no-index --no-deps --target .site .whl/*.whl; fi
export PYTHONPATH=src:.site
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv | tee "$OUT/gpu.txt"
timeout 360 python benchmarks/bench_linear_ce.py --csv "$OUT/linear_ce.csv" 2>&1 | tee "$OUT/bench_linear_ce.log" | grep -v Warning
timeout 200 python -m pytest -q -p no:cacheprovider tests 2>&1 | tail -25 | tee "$OUT/pytest_gpu.log"
