#!/bin/bash
# One GPU call for the cooperative forward's narrow and capped pieces (Coop.narrow,
# Coop.registers), to be run at the commit that lands them. In order of what matters if the
# call is cut short: the norms' GPU tests, the demo, the A/B of RMSNorm bf16 (narrow pieces of
# 65,536) against main's src in $AB_OLD (default ab_prev/src: `git archive main src | tar -x -C
# ab_prev`), one process per variant, alternated (LayerNorm and fp32, unchanged, are the
# control), the peers (one process each; .whl carried: Liger), then the sweep of the capped
# settings (two programs a multiprocessor) against the shipped ones. CSV and logs under $OUT.
#   run: bash benchmarks/gpu_narrow.sh        carry: .whl ab_prev
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
date -u
X=$(python -c "import xdist" 2>/dev/null && echo "-n 6")
timeout 200 python -m pytest -q -p no:cacheprovider $X tests/test_norm_*.py \
  tests/test_patch_hf_norms.py 2>&1 | grep -v USDT > "$OUT/gpu_tests.txt"
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | head; tail -1 "$OUT/gpu_tests.txt"
timeout 80 python -m fusewise demo 2>&1 | grep -v USDT > "$OUT/demo.txt"; tail -2 "$OUT/demo.txt"
W=${W:-98304,131072,200000,262144}
C="$OUT/ab_fwd.csv"
for r in 1 2; do for v in old new; do
  P=$PWD/src; [ $v = old ] && P=$PWD/${AB_OLD:-ab_prev/src}
  PYTHONPATH=$P:$PWD/benchmarks:/tmp/site timeout 60 python benchmarks/with_tag.py $v \
    benchmarks/bench_norms.py --modes fwd --timings graph --dtypes bf16,fp32 \
    --ops layer_norm,rms_norm --widths 98304,131072,200000,262144 --providers fusewise --csv "$C" \
    > "$OUT/ab_${v}_$r.txt" 2>&1 || tail -3 "$OUT/ab_${v}_$r.txt"
done; done
python benchmarks/ab_summary.py "$C" --a old --b new | tee "$OUT/ab_fwd_summary.txt"
timeout 110 python benchmarks/bench_norms.py --isolate --modes fwd --ops layer_norm,rms_norm \
  --dtypes bf16 --widths "$W" --providers fusewise,torch,compile,liger --timings graph \
  --csv "$OUT/peers.csv" 2>&1 | grep -v USDT > "$OUT/peers.txt"
sed -n '/# summary/,$p' "$OUT/peers.txt"
timeout 80 python benchmarks/sweep_norm_coop.py --ops rms_norm --dtypes bf16 --widths "$W" \
  --pieces 16384x16,32768x32nr32,65536x32n --csv "$OUT/sweep_coop.csv" 2>&1 | grep -v USDT \
  | tee "$OUT/sweep_coop_bf16.txt"
timeout 80 python benchmarks/sweep_norm_coop.py --ops rms_norm,layer_norm --dtypes fp32 \
  --widths "$W" --pieces 32768x32,16384x32r32 --csv "$OUT/sweep_coop.csv" 2>&1 \
  | grep -v USDT | tee "$OUT/sweep_coop_fp32.txt"
date -u
