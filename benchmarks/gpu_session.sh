#!/bin/bash
# One GPU call of a session: GPU tests and the predicted-vs-measured pairs. Tables to stdout;
# CSV, logs and the pairs' observations under $OUT.
# Usage (in the device command): FUSEWISE_COMMIT=<sha> TESTS="tests/a.py ..." \
#   bash benchmarks/gpu_session.sh [serial] [tests] [replay] [capture] [demo] [host] [pairs]
#   [norms] [sweep] [ab] [rotary_sweep] [rotary] [gated] [ab_src] [e2e] [order] [iso] [host_ab]
#   [ab_fwd] [ab_align] [peers_align] [inductor] [peers_wide] [peers_walk] [issue14] [sweep_part]
#   [coop]
#   (.whl carried: Liger and CCE for tests; serial: SERIAL_TESTS without xdist, for tests that
#   time a launch-bound step and fail when other processes share the GPU, and BIG_TESTS;
#   norms: bench_norms against torch and Liger, kernels only, one process per op so a timeout loses one op, then the
#   shipped settings' sweep in bf16 and fp32; sweep: the split and fused backward's settings;
#   rotary_sweep: the rotary kernel's chunks and warps; rotary: bench_rotary against its peers;
#   e2e: bench_e2e's Llama step, eager, compile, Liger, fusewise, one process each; gated:
#   bench_gated eager and kernels only; ab_src: the src tree in $AB_OLD (e.g. old/src, untracked)
#   against src on bench_rotary and bench_gated (kernels only), one process per variant,
#   alternated; Liger's rows, which neither tree touches, are the control; order: order_probe.py;
#   iso: bench_rotary and bench_gated with one process per provider; host_ab: the norms' host
#   cost and small kernels, $AB_OLD against src, alternated; issue14: bench_norms' whole table
#   against torch and Liger, and torch.compile's forward+backward at three widths)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# tests of 4 GiB tensors each: out of memory under 5-6 xdist workers on an 80 GB card, so the
# tests part leaves them to the serial part
BIG_TESTS="tests/test_rotary.py::test_past_2_31_elements_uses_64_bit_offsets
  tests/test_rotary_chunks.py::test_heads_past_2_31_elements_apart"
SERIAL_TESTS=${SERIAL_TESTS:-tests/test_replay.py tests/test_capture_profiled.py tests/test_timeline.py $BIG_TESTS}
DESELECT_BIG=$(for t in $BIG_TESTS; do printf -- "--deselect %s " "$t"; done)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site PYTHONUNBUFFERED=1
for what in "$@"; do
  case $what in
    tests)
      timeout ${TESTS_S:-300} python -m pytest -q -p no:cacheprovider ${XDIST:-} ${TESTS} $DESELECT_BIG 2>&1 \
        | grep -v USDT > "$OUT/gpu_tests.txt"
      grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | head -20; tail -1 "$OUT/gpu_tests.txt" ;;
    serial)
      timeout 120 python -m pytest -q -p no:cacheprovider ${SERIAL_TESTS} 2>&1 | grep -v USDT \
        > "$OUT/gpu_tests_serial.txt"
      grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_serial.txt" | head; tail -1 "$OUT/gpu_tests_serial.txt" ;;
    replay)
      timeout 100 python benchmarks/replay_check.py 2>&1 | grep -v USDT > "$OUT/replay_check.txt"
      grep -E "^---|^rule" "$OUT/replay_check.txt" ;;
    capture)
      timeout 170 python benchmarks/capture_overhead.py ${CAPTURE_ARGS:-} 2>&1 | grep -v USDT | tail -12 ;;
    demo)
      timeout 240 python -m fusewise demo 2>&1 | grep -v USDT > "$OUT/demo.txt"
      tail -4 "$OUT/demo.txt" ;;
    host)
      timeout 120 python benchmarks/host_overhead.py --csv "$OUT/host_overhead.csv" 2>&1 \
        | grep -v USDT | tee "$OUT/host_overhead.txt"
      for elements in 32768 134217728; do
        timeout 150 python benchmarks/bench_norms.py --ops layer_norm,rms_norm --dtypes bf16 \
          --widths 4096,16384 --elements $elements --providers fusewise,torch,liger \
          --timings eager,graph --csv "$OUT/bench_norms_modes.csv" 2>&1 | grep -v USDT \
          > "$OUT/bench_norms_modes_$elements.txt"
        sed -n '/# summary/,$p' "$OUT/bench_norms_modes_$elements.txt"
      done ;;
    norms)
      for op in layer_norm rms_norm add_rms_norm; do
        timeout ${NORMS_S:-100} python benchmarks/bench_norms.py --ops $op --dtypes bf16 \
          --providers fusewise,torch,liger --timings graph --csv "$OUT/bench_norms.csv" 2>&1 \
          | grep -v USDT > "$OUT/bench_norms_$op.txt"
        sed -n "/# summary/,\$p" "$OUT/bench_norms_$op.txt"
      done
      timeout ${SWEEP_S:-120} python benchmarks/sweep_norm_configs.py --parts fwd,bwd --dtypes bf16,fp32 \
        --ops layer_norm,rms_norm,add_rms_norm \
        --csv "$OUT/sweep_norms.csv" 2>&1 | grep -v USDT | tee "$OUT/sweep_norms.txt" ;;
    ab)
      # the kernels' bf16 rounding, integer bits (before) against the GPU's cast (shipped), one
      # process per variant and benchmark, alternated over AB_ROUNDS rounds; Liger's rows, which the
      # variant does not touch, are the control
      W=benchmarks/with_rounding.py; C="$OUT/ab_rounding.csv"
      for r in $(seq ${AB_ROUNDS:-2}); do for v in bits native; do
        timeout 90 python $W $v benchmarks/sweep_norm_configs.py --parts fwd,bwd \
          --elements 134217728 --csv $C > "$OUT/ab_norms_${v}_$r.txt" 2>&1
        timeout 60 python $W $v benchmarks/bench_rotary.py --dtypes bf16 --providers fusewise,liger \
          --modes fwd@graph,fwd_bwd@graph --csv $C > "$OUT/ab_rotary_${v}_$r.txt" 2>&1
        timeout 90 python $W $v benchmarks/bench_gated.py --shapes 16384x5632:bf16,16384x14336:bf16 \
          --providers fusewise,liger --csv $C > "$OUT/ab_gated_${v}_$r.txt" 2>&1
      done; done
      python benchmarks/ab_summary.py $C | tee "$OUT/ab_summary.txt" ;;
    sweep_part)
      # one part of sweep_norm_configs at 2**27 elements: SWEEP_PART, SWEEP_OPS, SWEEP_DTYPES,
      # SWEEP_WIDTHS (default: the part's)
      timeout ${SWEEP_S:-240} python benchmarks/sweep_norm_configs.py --parts $SWEEP_PART \
        --ops ${SWEEP_OPS:-layer_norm} --dtypes ${SWEEP_DTYPES:-bf16} --elements 134217728 \
        ${SWEEP_WIDTHS:+--widths $SWEEP_WIDTHS} --csv "$OUT/sweep_$SWEEP_PART.csv" 2>&1 \
        | grep -v USDT | tee "$OUT/sweep_$SWEEP_PART.txt" ;;
    sweep)
      S=benchmarks/sweep_norm_configs.py
      (timeout 80 python $S --parts split --csv "$OUT/sweep_norms.csv"
       timeout 100 python $S --parts fused --ops layer_norm --dtypes fp32 \
         --csv "$OUT/sweep_norms.csv") 2>&1 | grep -v USDT | tee -a "$OUT/sweep_norms.txt" ;;
    rotary_sweep)
      timeout ${ROTARY_SWEEP_S:-150} python benchmarks/sweep_rotary_tiles.py --dtypes bf16,fp32 \
        --csv "$OUT/rotary_chunks.csv" 2>&1 | grep -v USDT ;;
    rotary)
      timeout ${ROTARY_S:-150} python benchmarks/bench_rotary.py --dtypes bf16,fp32 \
        --csv "$OUT/rotary.csv" 2>&1 | grep -v USDT > "$OUT/rotary.txt"
      sed -n '/# summary/,$p' "$OUT/rotary.txt" ;;
    gated)
      timeout ${GATED_S:-240} python benchmarks/bench_gated.py ${GATED_SHAPES:+--shapes $GATED_SHAPES} \
        --modes ${GATED_MODES:-fwd,fwd_bwd,fwd@graph,fwd_bwd@graph} --csv "$OUT/gated.csv" 2>&1 \
        | grep -v USDT > "$OUT/gated.txt"
      sed -n '/# summary/,$p' "$OUT/gated.txt" ;;
    ab_src)
      C="$OUT/ab_src.csv"
      for r in $(seq ${AB_ROUNDS:-2}); do for v in old new; do
        P=$PWD/src; [ $v = old ] && P=$PWD/$AB_OLD
        PYTHONPATH=$P:$PWD/benchmarks:/tmp/site timeout ${AB_S:-90} python benchmarks/with_tag.py $v \
          benchmarks/bench_rotary.py --dtypes bf16 --providers fusewise,liger --csv $C \
          > "/tmp/ab_rotary_${v}_$r.txt" 2>&1
        PYTHONPATH=$P:$PWD/benchmarks:/tmp/site timeout ${AB_S:-90} python benchmarks/with_tag.py $v \
          benchmarks/bench_gated.py --shapes 16384x5632:bf16,16384x14336:bf16 \
          --modes fwd@graph,fwd_bwd@graph --providers fusewise,liger --csv $C \
          > "/tmp/ab_gated_${v}_$r.txt" 2>&1
      done; done
      python benchmarks/ab_summary.py $C --a old --b new | tee "$OUT/ab_src_summary.txt" ;;
    e2e)
      E=${E2E_S:-130}
      timeout $E python benchmarks/bench_e2e.py --variants eager,compile,liger,fusewise \
        --steps 12 --warmup 3 --compile-warmup 5 --timeout 60 --budget $((E - 15)) \
        --csv "$OUT/e2e.csv" > "$OUT/e2e.txt" 2>&1
      grep -E "^variant|^(eager|compile|liger|fusewise) |largest|target|met" "$OUT/e2e.txt" ;;
    order)
      # why a kernel runs faster after torch.compile in the same process (order_probe.py)
      for o in pre,none,post pre,ptxas,post ptxas,post pre,compile_other,post compile_other,post \
               pre,compile_rotary,post compile_rotary,post; do
        timeout 90 python benchmarks/order_probe.py --order $o --csv "$OUT/order_probe.csv" 2>&1 \
          | grep -v USDT | tee -a "$OUT/order_probe.txt" | grep -v "^# after none"
      done ;;
    iso)
      # each provider in its own process (--isolate): no provider timed after another's state
      timeout ${ISO_ROTARY_S:-150} python benchmarks/bench_rotary.py --isolate --dtypes bf16 \
        --modes fwd@graph,fwd_bwd@graph --csv "$OUT/rotary_iso.csv" > "$OUT/rotary_iso.txt" 2>&1
      tail -5 "$OUT/rotary_iso.txt"
      timeout ${ISO_GATED_S:-200} python benchmarks/bench_gated.py --isolate \
        --modes fwd@graph,fwd_bwd@graph --csv "$OUT/gated_iso.csv" > "$OUT/gated_iso.txt" 2>&1
      tail -9 "$OUT/gated_iso.txt" ;;
    host_ab)
      # the norms' eager host cost (host_overhead.py) and their kernels at 32,768 elements, eager
      # and replayed (bench_norms), for the src tree in $AB_OLD against src: one process per
      # variant, alternated; torch's rows, which neither tree touches, are the control
      C="$OUT/host_ab.csv"
      for r in $(seq ${AB_ROUNDS:-2}); do for v in old new; do
        P=$PWD/src; [ $v = old ] && P=$PWD/$AB_OLD
        PYTHONPATH=$P:$PWD/benchmarks:/tmp/site timeout ${AB_S:-90} python benchmarks/with_tag.py $v \
          benchmarks/host_overhead.py --csv $C > "/tmp/host_${v}_$r.txt" 2>&1
        PYTHONPATH=$P:$PWD/benchmarks:/tmp/site timeout 120 python benchmarks/with_tag.py $v \
          benchmarks/bench_norms.py --dtypes bf16 --widths 256,4096,16384 \
          --elements 32768 --providers fusewise,torch --timings eager,graph --csv $C \
          > "/tmp/host_bench_${v}_$r.txt" 2>&1
      done; done
      cat /tmp/host_new_1.txt
      python benchmarks/ab_summary.py $C --a old --b new | tee "$OUT/host_ab_summary.txt" ;;
    coop)
      # the cooperative forward (kernels_coop.py): its GPU tests, then its sweep against the
      # shipped forward before and after (COOP_ARGS: sweep_norm_coop.py's arguments)
      timeout ${COOP_TESTS_S:-90} python -m pytest -q -p no:cacheprovider -x tests/test_norm_coop.py \
        2>&1 | grep -v USDT > "$OUT/gpu_tests_coop.txt"
      grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_coop.txt" | head; tail -1 "$OUT/gpu_tests_coop.txt"
      timeout ${COOP_S:-150} python benchmarks/sweep_norm_coop.py ${COOP_ARGS:-} \
        --csv "$OUT/sweep_coop.csv" 2>&1 | grep -v USDT | tee "$OUT/sweep_coop.txt" ;;
    ab_fwd)
      # the src tree in $AB_OLD against src (or $AB_NEW) on the norms' forward (bench_norms, kernels only;
      # AB_OPS, AB_DTYPES, AB_WIDTHS and AB_MODES, by default every op, bf16, 256-32,768, fwd) and, unless
      # AB_ROTARY=0, the rotary embedding (with Liger as the control), one process per variant,
      # alternated
      C="$OUT/ab_fwd.csv"
      for r in $(seq ${AB_ROUNDS:-2}); do for v in old new; do
        P=$PWD/${AB_NEW:-src}; [ $v = old ] && P=$PWD/$AB_OLD
        PYTHONPATH=$P:$PWD/benchmarks:/tmp/site timeout ${AB_S:-90} python benchmarks/with_tag.py $v \
          benchmarks/bench_norms.py --modes ${AB_MODES:-fwd} --timings graph --dtypes ${AB_DTYPES:-bf16} \
          --ops ${AB_OPS:-layer_norm,rms_norm,add_rms_norm} \
          --widths ${AB_WIDTHS:-256,1024,4096,8192,16384,32768} --providers fusewise --csv $C \
          > "/tmp/ab_norms_${v}_$r.txt" 2>&1
        [ "${AB_ROTARY:-1}" = 0 ] || PYTHONPATH=$P:$PWD/benchmarks:/tmp/site timeout 90 python \
          benchmarks/with_tag.py $v benchmarks/bench_rotary.py --dtypes bf16 \
          --providers fusewise,liger --modes fwd@graph,fwd_bwd@graph --csv $C \
          > "/tmp/ab_rotary_${v}_$r.txt" 2>&1
      done; done
      python benchmarks/ab_summary.py $C --a old --b new | tee "$OUT/ab_fwd_summary.txt" ;;
    ab_align)
      # the src tree in $AB_OLD against src on the norms at widths 16 does not divide (4,104 and
      # 65,528: the block and walked forwards, the fused and split backwards; every op, forward
      # and forward+backward) and LayerNorm's forward at 8,192-65,536 (the walks' shift), kernels
      # only, one process per variant, alternated (peers_align: torch and Liger at the ragged
      # widths, one process per provider)
      C="$OUT/ab_align.csv"
      for r in $(seq ${AB_ROUNDS:-2}); do for v in old new; do
        P=$PWD/src; [ $v = old ] && P=$PWD/$AB_OLD
        PYTHONPATH=$P:$PWD/benchmarks:/tmp/site timeout 100 python benchmarks/with_tag.py $v \
          benchmarks/bench_norms.py --modes fwd --timings graph --dtypes bf16,fp32 \
          --ops layer_norm --widths 8192,12288,32768,65536 --providers fusewise --csv $C \
          > "/tmp/ab_shift_${v}_$r.txt" 2>&1
        PYTHONPATH=$P:$PWD/benchmarks:/tmp/site timeout 120 python benchmarks/with_tag.py $v \
          benchmarks/bench_norms.py --modes fwd,fwd_bwd --timings graph --dtypes bf16,fp32 \
          --widths ${ALIGN_WIDTHS:-4104,65528} --providers fusewise --csv $C \
          > "/tmp/ab_align_${v}_$r.txt" 2>&1
      done; done
      python benchmarks/ab_summary.py $C --a old --b new | tee "$OUT/ab_align_summary.txt" ;;
    peers_align)
      # PEERS_DTYPES, ALIGN_WIDTHS and PEERS_PROVIDERS (fusewise too, for a table of one run)
      timeout ${PEERS_S:-150} python benchmarks/bench_norms.py --isolate --modes fwd,fwd_bwd \
        --dtypes ${PEERS_DTYPES:-bf16,fp32} --widths ${ALIGN_WIDTHS:-4104,65528} \
        --providers ${PEERS_PROVIDERS:-torch,liger} \
        --timings graph --csv "$OUT/peers_align.csv" > "$OUT/peers_align.txt" 2>&1
      case ${PEERS_PROVIDERS:-} in
        *fusewise*) sed -n '/# summary/,$p' "$OUT/peers_align.txt" | sort -u | tail -60 ;;
        *) grep -E "torch|liger" "$OUT/peers_align.txt" | grep -v "^#" | sort -u | tail -48 ;;
      esac ;;
    peers_wide)
      # the forward's unmasked cells (LayerNorm and add+RMSNorm fp32 at 16,384-32,768) and the
      # widest rows against torch.compile, one process per provider, kernels only; the host cost
      timeout ${PEERS_S:-200} python benchmarks/bench_norms.py --isolate --ops layer_norm,add_rms_norm \
        --dtypes fp32 --widths 16384,32768 --providers fusewise,torch,compile,liger \
        --timings graph --csv "$OUT/peers_wide.csv" > "$OUT/peers_fp32.txt" 2>&1
      tail -20 "$OUT/peers_fp32.txt"
      timeout ${WIDE_S:-200} python benchmarks/bench_norms.py --isolate --ops layer_norm,rms_norm \
        --dtypes bf16 --widths 65536,262144 --providers fusewise,compile \
        --timings graph --csv "$OUT/peers_wide.csv" > "$OUT/peers_wide.txt" 2>&1
      tail -10 "$OUT/peers_wide.txt"
      timeout 100 python benchmarks/host_overhead.py --csv "$OUT/host_overhead.csv" 2>&1 \
        | grep -v USDT | tee "$OUT/host_overhead.txt" ;;
    issue14)
      # issue #14's table: every op, width, mode (forward; forward+backward) against torch and
      # Liger, kernels only, one process per dtype (a timeout loses one dtype); then
      # torch.compile's forward+backward at three widths, one process per provider
      for dt in bf16 fp32; do
        timeout ${ISSUE14_S:-200} python benchmarks/bench_norms.py --dtypes $dt \
          --providers fusewise,torch,liger --timings graph --csv "$OUT/issue14.csv" \
          > "$OUT/issue14_$dt.txt" 2>&1
        sed -n '/# summary/,$p' "$OUT/issue14_$dt.txt" | grep fwd_bwd
      done
      timeout ${COMPILE_S:-200} python benchmarks/bench_norms.py --isolate --modes fwd_bwd \
        --dtypes bf16 --ops layer_norm,rms_norm --widths 4096,16384,65536 \
        --providers fusewise,compile --timings graph --csv "$OUT/issue14_compile.csv" \
        > "$OUT/issue14_compile.txt" 2>&1
      sed -n '/# summary/,$p' "$OUT/issue14_compile.txt" | sort -u ;;
    peers_walk)
      # the walking forward's widths against torch.compile and Liger, one process per provider,
      # kernels only; then the shipped forward at every width (the sweep's fwd part)
      timeout ${WALK_S:-240} python benchmarks/bench_norms.py --isolate --modes fwd --dtypes bf16 \
        --widths 8192,12288,16384,32768,65536 --providers fusewise,compile,liger \
        --timings graph --csv "$OUT/peers_walk.csv" > "$OUT/peers_walk.txt" 2>&1
      sed -n '/# summary/,$p' "$OUT/peers_walk.txt" | sort -u
      timeout ${WALK_FP32_S:-100} python benchmarks/bench_norms.py --isolate --modes fwd \
        --ops layer_norm,rms_norm --dtypes fp32 --widths 16384,32768 --providers fusewise,compile \
        --timings graph --csv "$OUT/peers_walk.csv" > "$OUT/peers_walk_fp32.txt" 2>&1
      sed -n '/# summary/,$p' "$OUT/peers_walk_fp32.txt" | sort -u
      timeout ${SWEEP_S:-120} python benchmarks/sweep_norm_configs.py --parts fwd --dtypes bf16,fp32 \
        --ops layer_norm,rms_norm,add_rms_norm --elements 134217728 \
        --csv "$OUT/sweep_fwd.csv" 2>&1 | grep -v USDT | tee "$OUT/sweep_fwd.txt" ;;
    inductor)
      timeout 150 python benchmarks/inductor_code.py --out "$OUT/inductor" 2>&1 | grep -v USDT ;;
    pairs)
      (cd benchmarks && timeout ${PAIRS_S:-300} python predict_pairs.py --configs demo \
        --rounds ${ROUNDS:-8} --dump-obs "$OUT/pairs_obs.pkl.gz" 2>&1 | grep -v USDT | tail -13)
      rm -f "$OUT"/pair_*.json ;;
  esac
done
