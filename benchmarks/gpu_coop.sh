#!/bin/bash
# One GPU call for the cooperative forward's settings (settings.FWD_COOP), run at the commit
# that lands them. In order of what matters if the call is cut short: the norms' GPU tests, the
# demo, the A/B against main's src in $AB_OLD (default ab_prev/src: `git archive main src | tar
# -x -C ab_prev`), one process per variant, alternated, LayerNorm and RMSNorm in bf16 and fp32
# (the ops left as they were are the control), the peers (one process each; .whl carried:
# Liger, which refuses rows past 65,536), then a sweep of candidates not shipped yet: capped
# pieces (Coop.registers) for LayerNorm bf16 and fp32, RMSNorm fp16, add+RMSNorm (offline
# ptxas for sm_90a, spilled bytes under Triton 3.6/3.9: LayerNorm bf16 32768x32n 0/0 at 52/64
# registers, 16384x32r32 12/20, 16384x16r64 8/0; fp32 16384x16r64 8/8; RMSNorm fp16
# 16384x32r32 4/0; add+RMSNorm fp32 16384x32r32 0/0). At most 8 files come back: logs and CSV
# under $OUT. AB_OPS, AB_DTYPES (the A/B's ops and dtypes), W (its widths) and QUICK=1 (the
# tests, the demo and the A/B alone) cut it short where device time is short; TESTS (the test
# files), DEMO=0, PEER_OPS (empty: none), PEER_MODES, PEER_W, PEER_S (seconds), SWEEP and
# SWEEP_W (the sweep's widths, default W) change what runs.
#   run: FUSEWISE_COMMIT=<sha> bash benchmarks/gpu_coop.sh   carry: .whl ab_prev
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site PYTHONUNBUFFERED=1
L="$OUT/log.txt"
{ nvidia-smi --query-gpu=name --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "commit ${FUSEWISE_COMMIT:-unknown}"; date -u; } | tee "$L"
X=$(python -c "import xdist" 2>/dev/null && echo "-n 6")
timeout 300 python -m pytest -q -p no:cacheprovider $X ${TESTS:-tests/test_norm_*.py \
  tests/test_patch_hf_norms.py} 2>&1 | grep -v USDT > "$OUT/gpu_tests.txt"
{ grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | head; tail -1 "$OUT/gpu_tests.txt"
  [ "${DEMO:-1}" = 1 ] && timeout 80 python -m fusewise demo 2>&1 | grep -v USDT | tail -4
} | tee -a "$L"
W=${W:-73728,98304,131072,200000,262144}
C="$OUT/ab_fwd.csv"
for r in 1 2; do for v in old new; do
  P=$PWD/src; [ $v = old ] && P=$PWD/${AB_OLD:-ab_prev/src}
  PYTHONPATH=$P:$PWD/benchmarks:/tmp/site timeout 60 python benchmarks/with_tag.py $v \
    benchmarks/bench_norms.py --modes fwd --timings graph --dtypes "${AB_DTYPES:-bf16,fp32}" \
    --ops "${AB_OPS:-layer_norm,rms_norm}" --widths "$W" --providers fusewise --csv "$C" \
    > /tmp/ab_${v}_$r.txt 2>&1 || tail -3 /tmp/ab_${v}_$r.txt | tee -a "$L"
done; done
python benchmarks/ab_summary.py "$C" --a old --b new 2>&1 | tee -a "$L"
[ -n "${QUICK:-}" ] && { date -u | tee -a "$L"; exit 0; }  # the landing call alone
if [ -n "${PEER_OPS-rms_norm}" ]; then  # PEER_OPS= (empty): no peers
  timeout ${PEER_S:-110} python benchmarks/bench_norms.py --isolate --modes "${PEER_MODES:-fwd}" \
    --ops "${PEER_OPS:-rms_norm}" --dtypes bf16,fp32 --widths "${PEER_W:-$W}" --timings graph \
    --providers fusewise,torch,compile,liger --csv "$OUT/peers.csv" 2>&1 | grep -v USDT \
    > /tmp/peers.txt
  sed -n '/# summary/,$p' /tmp/peers.txt | tail -12 | tee -a "$L"
fi
S="python benchmarks/sweep_norm_coop.py --widths ${SWEEP_W:-$W} --csv $OUT/sweep_coop.csv"
# SWEEP: "op/dtype/pieces[/seconds] ..." (sweep_norm_coop.py's pieces, comma-separated); -: none
[ "${SWEEP:-}" = - ] && SWEEP=
for s in ${SWEEP-layer_norm/bf16/32768x32n,16384x32r32,16384x16r64/60 rms_norm/fp16/16384x32r32 \
    layer_norm/fp32/16384x16r64 add_rms_norm/fp32/16384x32r32}; do
  IFS=/ read -r op dt pieces secs <<< "$s"
  timeout "${secs:-35}" $S --ops "$op" --dtypes "$dt" --pieces "$pieces"
done 2>&1 | grep -v USDT | tee -a "$L"
date -u | tee -a "$L"
