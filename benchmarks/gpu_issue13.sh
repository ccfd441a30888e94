#!/bin/bash
# Issue #13's GPU run in one device call (~8 minutes for `all`): the gated-activation / rotary /
# patched-MLP tests, then bench_gated.py, the MLP block's peak memory (_mlp_block.py),
# bench_rotary.py when it exists, and the end-to-end step (bench_e2e.py: eager, compile, liger,
# fusewise). Each step under its own `timeout`; a step that fails or runs out of time is reported
# and the next one runs. Under $OUT: issue13.log (the header and every step's output) and one CSV
# per benchmark (gated.csv, mlp_block.csv, rotary.csv, rotary_tiles.csv, e2e.csv): 6 files, under
# the 8 that come back. The summary (each step's status and its table) is printed last.
# Usage on the GPU machine: FUSEWISE_COMMIT=<hash> bash benchmarks/gpu_issue13.sh [tests|bench|all]
# Time limits (seconds) can be changed: TESTS_S GATED_S MLP_S ROTARY_S TILES_S E2E_S. TINY=1 passes
# --tiny to the benchmarks (a smoke test of this script on a machine without a GPU).
set -u
what=${1:-all}
case "$what" in tests|bench|all) ;; *) echo "usage: $0 [tests|bench|all]"; exit 2 ;; esac
OUT=${OUT:-out}; mkdir -p "$OUT"
LOG="$OUT/issue13.log"; : > "$LOG"
TMPD=$(mktemp -d)
if [ -d .whl ] && [ ! -d .site ]; then pip install -q --no-index --no-deps --target .site .whl/*.whl; fi
export PYTHONPATH=src:.site PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv
  python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', \
triton.__version__, 'transformers', transformers.__version__)"
  python -c "import importlib.metadata as m; print('liger-kernel', m.version('liger-kernel'))"
  echo "commit ${FUSEWISE_COMMIT:-unknown}; $(date -u +%FT%TZ)"
} 2>&1 | tee -a "$LOG"

TINY_ARG=${TINY:+--tiny}
STATUS=()  # one line per step: name, rc, seconds
# step NAME LIMIT_S CMD...: runs CMD under `timeout`, its output into $TMPD/NAME.log and $LOG
step() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS rc
  echo "=== $name (limit ${limit} s): $*" | tee -a "$LOG"
  timeout -k 10 "$limit" "$@" > "$TMPD/$name.log" 2>&1
  rc=$?
  grep -v -E "Warning|warnings.warn|USDT" "$TMPD/$name.log" >> "$LOG"
  local note=""
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && note=" (time limit)"
  STATUS+=("$(printf '%-12s rc=%-3s %4d s%s' "$name" "$rc" $((SECONDS - t0)) "$note")")
  echo "=== $name rc=$rc$note ($((SECONDS - t0)) s)" | tee -a "$LOG"
}

if [ "$what" != bench ]; then
  TESTS=""
  # the op, patch and diagnosis tests of issue #13, and those of what the session also changed
  # (the capture's sessions, verify's groups)
  for t in tests/test_gated.py tests/test_gated_mlp.py tests/test_rotary.py \
      tests/test_patch_hf_mlp.py tests/test_patch_hf_rotary.py tests/test_chain_patterns.py \
      tests/test_schedule.py tests/test_capture_profiled.py tests/test_verify.py \
      tests/test_diagnose.py tests/test_cli.py; do
    if [ -f "$t" ]; then TESTS="$TESTS $t"; else echo "# $t: not in this tree, skipped" | tee -a "$LOG"; fi
  done
  # shellcheck disable=SC2086
  step tests "${TESTS_S:-200}" python -m pytest -q -p no:cacheprovider $TESTS
fi
if [ "$what" != tests ]; then
  step gated "${GATED_S:-150}" python benchmarks/bench_gated.py $TINY_ARG --csv "$OUT/gated.csv"
  step mlp_block "${MLP_S:-90}" python benchmarks/_mlp_block.py $TINY_ARG --timeout 60 \
    --csv "$OUT/mlp_block.csv"
  step rotary "${ROTARY_S:-80}" python benchmarks/bench_rotary.py $TINY_ARG --csv "$OUT/rotary.csv"
  if [ -z "${TINY:-}" ]; then
    step tiles "${TILES_S:-40}" python benchmarks/sweep_rotary_tiles.py --csv "$OUT/rotary_tiles.csv"
  fi
  e2e_s=${E2E_S:-110}
  step e2e "$e2e_s" python benchmarks/bench_e2e.py $TINY_ARG --variants eager,compile,liger,fusewise \
    --steps 12 --warmup 3 --compile-warmup 5 --timeout 60 --budget $((e2e_s - 15)) \
    --csv "$OUT/e2e.csv"
fi

# show NAME FROM: the step's table (its log from the first line matching FROM), else the end of
# its log (what it died of)
show() {
  local f="$TMPD/$1.log"
  [ -f "$f" ] || return 0
  echo "--- $1"
  if grep -q -E "$2" "$f"; then
    sed -n "/$2/,\$p" "$f" | grep -v -E "Warning|warnings.warn|USDT"
  else
    grep -v -E "Warning|warnings.warn|USDT" "$f" | tail -6
  fi
  grep -E "^# .*(failed|skipped)|^\[.*\] skipped|not in this tree" "$f" | head -12
}

# The summary: each step's status, then the table each one prints last.
{
  echo
  echo "################ issue #13 summary"
  printf '%s\n' "${STATUS[@]}"
  if [ -f "$TMPD/tests.log" ]; then
    echo "--- tests"; grep -E "FAILED|ERROR|Fatal" "$TMPD/tests.log" | head -15; tail -1 "$TMPD/tests.log"
  fi
  show gated "^# summary"
  show mlp_block "^# MLP block"
  show rotary "^# summary"
  show tiles "^# copy ceiling"
  show e2e "^variant "
} 2>&1 | tee -a "$LOG"
rm -rf "$TMPD"
