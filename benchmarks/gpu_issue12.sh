#!/bin/bash
# Issue #12's GPU run: the diagnosis/capture/graphs tests, then predicted-vs-measured pairs, the
# matmul-precision check, the decode benchmark and the capture overhead. Tables to stdout;
# CSV and JSON under $OUT. Usage: FUSEWISE_COMMIT=<sha> bash benchmarks/gpu_issue12.sh [tests|bench|all]
set -u
export PYTHONPATH=$PWD/src:$PWD/benchmarks
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=${1:-all}
if [ "$what" != bench ]; then
  timeout 420 python -m pytest -q -p no:cacheprovider tests/test_graphs.py tests/test_timeline.py \
    tests/test_matmul_findings.py tests/test_hardware_cost.py tests/test_diagnose.py \
    tests/test_predicted_saving.py tests/test_syncs.py tests/test_capture_profiled.py \
    tests/test_capture_phases.py tests/test_capture_times.py tests/test_cli.py tests/test_schedule.py \
    tests/test_verify.py ${EXTRA_TESTS:-} 2>&1 | grep -v USDT | tail -8
fi
if [ "$what" != tests ]; then
  (cd benchmarks && timeout 300 python predict_pairs.py --rounds ${ROUNDS:-8} 2>&1 | grep -v USDT | tail -18)
  timeout 120 python benchmarks/matmul_precision_check.py 2>&1 | grep -v USDT | tail -14
  timeout 120 python benchmarks/bench_decode.py 2>&1 | grep -v USDT | tail -10
  timeout 200 python benchmarks/capture_overhead.py 2>&1 | grep -v USDT | tail -10
fi
