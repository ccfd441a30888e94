#!/bin/bash
# One GPU call: the cooperative forward's capped pieces (Coop.registers; two or four programs a
# multiprocessor) against the shipped settings, kernels only, for every op and dtype the
# cooperative forward serves or could serve past 65,536, 73,728 (a ragged last piece) to
# 262,144. Candidates from the offline register fits (sm_90a, Triton 3.6 / 3.9 spilled bytes):
# RMSNorm bf16 32768x32nr32 0/0, 16384x32r32 4/0, 16384x16nr32 4/4; LayerNorm bf16 32768x32n
# (52/64 registers, one program) 0/0, 16384x32r32 12/20, 16384x16r64 8/0; fp32 RMSNorm
# 16384x32r32 0/0, LayerNorm 16384x16r64 8/8, 16384x32r32 28/0; add+RMSNorm fp32 16384x32r32
# 0/0. Logs and CSV under $OUT (set FUSEWISE_COMMIT: the machine has no .git of this tree).
#   run: FUSEWISE_COMMIT=<sha> bash benchmarks/gpu_sweep_capped.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/benchmarks PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
date -u
W=73728,98304,131072,200000,262144
S="timeout 100 python benchmarks/sweep_norm_coop.py --widths $W --csv $OUT/sweep_capped.csv"
{
$S --ops rms_norm --dtypes bf16 --pieces 32768x32nr32,16384x32r32,16384x16nr32
$S --ops layer_norm --dtypes bf16 --pieces 32768x32n,16384x32r32,16384x16r64,32768x32nr32
$S --ops rms_norm --dtypes fp16 --pieces 16384x32r32,16384x16
$S --ops rms_norm,add_rms_norm --dtypes fp32 --pieces 16384x32r32
$S --ops layer_norm --dtypes fp32 --pieces 16384x16r64,16384x32r32
$S --ops add_rms_norm --dtypes bf16 --pieces 32768x32nr32,16384x32r32
} 2>&1 | grep -v USDT | tee "$OUT/sweep_capped.txt"
date -u
