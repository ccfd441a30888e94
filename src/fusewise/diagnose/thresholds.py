"""Default thresholds of the analyzers, in one place, each with its reason (docs/findings.md)."""

# fusion-chain: report a chain only if a fused kernel would move at least this many fewer bytes...
CHAIN_MIN_AVOIDABLE_BYTES = 1 << 20  # 1 MiB: ~0.25 us at H200 bandwidth, a floor against noise
# ...and the chain as written moves at least this multiple of the fused minimum. 1.5 means a
# third of the traffic is avoidable; below that a fusion rarely pays for its complexity.
CHAIN_MIN_RATIO = 1.5
# A matmul joins a chain (attention scores, logits before a loss) only if the tensor between it
# and the chain is this many times larger than the matmul's other operands: true of [S, S]
# scores against two [S, D] heads once S >= 4·D, and of [N, V] logits against [N, d] and
# [V, d]. (A feed-forward block's [N, 4d] activation may join too; such a chain is then dropped
# as compute-bound.)
MATMUL_JOIN_RATIO = 2.0
# quadratic-memory: a tensor whose last two dims are equal and at least this long, produced by a
# matmul or a softmax, is an [.., S, S] attention intermediate.
QUADRATIC_MIN_SEQ = 128
QUADRATIC_MIN_BYTES = 1 << 20
# A chain that includes matmuls is reported only if its avoidable traffic takes at least this
# share of the matmuls' time at the matmul rate: attention scores and large-vocabulary logits pass
# easily on a GPU, a feed-forward block's activation (about a fifth of its matmul time on an H200
# in bf16) does not.
CHAIN_MIN_SHARE_OF_MATMUL = 0.25

# Predicted savings from measured times (diagnose/_measured.py). A fused kernel that replaces
# memory-bound ops moves its bytes at this share of the copy ceiling: on the H200 the best fused
# norms reach 63-95% forward and 37-53% forward+backward, fused AdamW 79-99% (PERF.md,
# benchmarks/results/h200_adamw.csv).
FUSED_KERNEL_EFFICIENCY = 0.6
# ... where the fix is a known kernel, its measured share (benchmarks/results/h200_adamw.csv:
# torch's fused AdamW 79%, fusewise's 93-99%: the lower of the two fixes a finding names)
FUSED_KERNEL_EFFICIENCY_BY_PATTERN = {"optimizer": 0.8}
# A fused attention kernel (flash, through scaled_dot_product_attention) computes the scores'
# matmuls itself, so written-out attention loses its matmuls too; the kernel does their FLOPs at
# this share of the matmul ceiling (FlashAttention-2 reports 50-73% of an A100's peak forward,
# 35-63% backward; counted on the written-out, unmasked FLOPs, a causal kernel's share is
# higher, and the estimate errs low).
ATTENTION_KERNEL_MATMUL_SHARE = 0.5
# The recorded step's op times are put on the profiled steps' clock by the ratio of their
# device-busy times; a ratio outside this range means the two steps did different work, and
# the recorded times are kept as measured.
TIME_SCALE_RANGE = (0.5, 1.5)
# On a CPU each op name's recorded host time is put on the profiled steps' self time of that
# name: the Python recorder's per-op overhead inflated small ops 2-5x. Beyond this range the
# two profiles put the time under different names, and the recorded times are kept.
NAME_SCALE_RANGE = (0.15, 1.5)

# Timeline gaps (diagnose/timeline.py). A gap between device intervals shorter than this is the
# GPU waiting for the next launch: eager PyTorch spends some 5-30 us of host time per op, so a
# run of small kernels leaves gaps of that order; longer gaps are host work of another kind.
LAUNCH_GAP_MAX_US = 100.0
# A host wait on the device (cudaStreamSynchronize, ...) that ends this close before a gap
# starts (or inside it) explains the gap: profiler host and device clocks agree to a few us.
SYNC_SLACK_US = 20.0
# Report a cause of idle time only if it costs at least this much per step and this share of the
# step: below that the gain is lost in run-to-run noise.
GAP_MIN_MS = 0.05
GAP_MIN_SHARE = 0.02
# An op shorter than this on the device is launch-bound on any current GPU (a launch costs
# several us of host time); the launch-overhead finding names the lines with most of them.
SHORT_OP_US = 10.0

# matmul-precision / matmul-shape (diagnose/matmul.py). Report a matmul finding only if its
# predicted saving is at least this much per step and this share of the step: the same floor
# as the timeline's gaps (below it the gain is lost in run-to-run noise).
MATMUL_MIN_SAVING_MS = 0.05
MATMUL_MIN_SHARE = 0.02
# Tensor cores read operands in 16-byte pieces: a dimension that is a multiple of 8 elements in
# 16-bit (4 in fp32) keeps every row aligned; cuBLAS documents these multiples for its tensor-core
# paths. A large dimension also fills whole tiles when it is a multiple of 64 (nanoGPT pads its
# 50257-token vocabulary to 50304 = 786·64 for this reason), so a dimension of at least
# MATMUL_BIG_DIM is asked to be a multiple of MATMUL_BIG_MULTIPLE.
MATMUL_ALIGN_ELEMENTS = {"bfloat16": 8, "float16": 8, "float32": 4}
MATMUL_BIG_DIM = 1024
MATMUL_BIG_MULTIPLE = 64
# The padded shape is timed for this many unaligned shapes at most (the ones with most recorded
# time): a few ms of measuring, not a benchmark of the whole step.
MATMUL_SHAPES_MEASURED = 4
# matmul-precision times this many fp32 shapes (most recorded time first) in fp32, TF32 and bf16
# on the GPU: the fraction of the ceiling a shape reaches differs between them (a 768-wide matmul
# reaches more of the fp32 rate than of the TF32 one), so the ratio is measured where it matters.
MATMUL_PRECISION_SHAPES_TIMED = 8
# Launch-bound matmuls: at least this many matmuls from one line in one step, each shorter on
# the device than SHORT_OP_US: a loop of tiny matmuls that one batched matmul (bmm) or a CUDA
# graph would launch once.
MATMUL_TINY_MIN_COUNT = 16
