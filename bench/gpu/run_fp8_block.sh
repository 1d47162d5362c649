#!/usr/bin/env bash
# Issue 24 item 3 (FP8 block scaling), one device call:
#  1. test_cuda_fp8: the block casts against the CPU twin's bits, the block-scaled GEMMs
#     (cuBLASLt VEC128 / BLK128x128 scales) within their quantization error (and the tensor
#     scaling tests beside them).
#  2. Qwen3-1.7B at 2 × 8,192 tokens a step, the same binary on the same machine start:
#     bf16, fp8 with tensor scaling and fp8 with block scaling (--set workload.fp8.scaling=block),
#     ROUNDS rounds with the arms' order rotated each round; each run's median step over steps
#     3..SPEED_STEPS, tokens/s and peak memory. Then one op profile of the block arm (the block
#     GEMMs' TFLOP/s, the block casts' GB/s).
#  3. With STEPS > 0: the convergence check of the block arm against the bf16 arm, Qwen3-1.7B
#     from the same random init on STEPS steps of real text (bench/gpu/make_text_rows.py), as
#     bench/gpu/run_fp8_convergence.sh does for tensor scaling: `loom check convergence` with
#     correlation ≥ 0.999 and the final loss within 0.5%.
# Needs .devbin/loom and .devbin/test_cuda_fp8 (bench/gpu/pack.sh build-cuda).
#   bash bench/gpu/run_fp8_block.sh                 (tests, speed and profile: ~8 min at ROUNDS=2, guessed)
#   STEPS=300 SKIP_SPEED=1 bash bench/gpu/run_fp8_block.sh   (tests and convergence, as run_fp8_convergence.sh)
#   ROUNDS, SPEED_STEPS, SKIP_TESTS, SKIP_SPEED, SKIP_PROFILE narrow it.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"

if [ -z "${SKIP_TESTS:-}" ]; then
  for t in ${TESTS:-test_cuda_fp8}; do
    [ -x .devbin/$t ] || { echo "$t: not packed"; continue; }
    (cd tests && timeout 240 ../.devbin/$t > "$out/$t.log" 2>&1; echo "$t rc=$?: $(grep -E '^\[  (PASSED|FAILED|  SKIPPED)' "$out/$t.log" | tr '\n' ' ')")
    grep -E "^\[  FAILED|Failure|error |Expected|actual" "$out/$t.log" | head -12
  done
fi

# The arms: name and their --set arguments.
declare -A arm_set=(
  [bf16]="--set workload.precision=bf16"
  [fp8-tensor]="--set workload.precision=fp8"
  [fp8-block]="--set workload.precision=fp8 --set workload.fp8.scaling=block"
)
summary() {  # name rc: the run's median step, tokens/s, peak memory and losses
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
name, rc = sys.argv[1:3]
try:
    m = [json.loads(l) for l in open(f"/tmp/fp8-block-{name}/metrics.jsonl")]
except OSError:
    print(f"{name}: rc={rc}, no metrics"); sys.exit()
w = [x for x in m if x["step"] >= 3]
if not w:
    print(f"{name}: rc={rc}, fewer than 3 steps"); sys.exit()
t = statistics.median(x["step_time_s"] for x in w)
print(f"{name}: rc={rc} median step {t * 1000:.1f} ms, {statistics.median(x['tokens_per_s_per_gpu'] for x in w):.0f} tok/s, "
      f"peak {max(x['max_mem_gib'] for x in m):.2f} GiB, losses {[round(x['loss'], 4) for x in m]}")
PY
}

if [ -z "${SKIP_SPEED:-}" ]; then
  python3 bench/gpu/make_rows.py /tmp/loom-bench-rows.jsonl 8 8192 151643 0
  arms=(bf16 fp8-tensor fp8-block)
  for round in $(seq "${ROUNDS:-2}"); do
    for i in 0 1 2; do
      arm=${arms[$(((i + round - 1) % 3))]}
      name=1.7b-$arm-$round
      timeout 240 .devbin/loom train bench/gpu/qwen3-1.7b-2x8k.yaml --set train.steps=${SPEED_STEPS:-10} \
        --set train.output_dir=/tmp/fp8-block-$name ${arm_set[$arm]} > "$out/speed-$name.log" 2>&1
      rc=$?
      summary "$name" "$rc"
      [ "$rc" = 0 ] || tail -3 "$out/speed-$name.log"
      cp /tmp/fp8-block-$name/metrics.jsonl "$out/speed-$name-metrics.jsonl" 2>/dev/null
      rm -rf /tmp/fp8-block-$name  # its final checkpoint: a few runs of them fill the device's disk
    done
  done
  if [ -z "${SKIP_PROFILE:-}" ]; then
    LOOM_OP_PROFILE=1 timeout 200 .devbin/loom train bench/gpu/qwen3-1.7b-2x8k.yaml --set train.steps=3 \
      --set "result.window=[2, 3]" --set train.output_dir=/tmp/fp8-block-profile ${arm_set[fp8-block]} \
      > "$out/profile-1.7b-fp8-block.log" 2>&1
    echo "op profile 1.7b fp8-block rc=$?"
    grep -E "^loom: GEMM.*fp8 blocks" "$out/profile-1.7b-fp8-block.log" | head -8
    grep -A30 "loom op profile" "$out/profile-1.7b-fp8-block.log" | head -24
  fi
fi

steps=${STEPS:-0}
if [ "$steps" -gt 0 ]; then
  site=/opt/torch/.venv/lib/python3.12/site-packages
  python3 bench/gpu/make_text_rows.py /tmp/text-rows.jsonl $((2 * steps)) 8192 $site/transformers $site/torch 2>&1 | tail -1
  for arm in ${ARMS:-bf16 fp8-block}; do
    timeout 420 .devbin/loom train bench/gpu/qwen3-1.7b-2x8k.yaml --set train.data.path=/tmp/text-rows.jsonl \
      --set train.steps=$steps --set train.optimizer.lr=3.0e-4 --set train.optimizer.min_lr=3.0e-5 \
      --set train.optimizer.warmup_fraction=0.05 --set "result.window=[3, $steps]" \
      --set train.output_dir=/tmp/conv-$arm ${arm_set[$arm]} > "$out/convergence-$arm.log" 2>&1
    echo "1.7B $steps steps $arm rc=$?"; tail -2 "$out/convergence-$arm.log"
    cp /tmp/conv-$arm/metrics.jsonl "$out/convergence-$arm-metrics.jsonl" 2>/dev/null
  done
  .devbin/loom check convergence --candidate /tmp/conv-fp8-block --reference /tmp/conv-bf16 \
    --min-correlation 0.999 --final-loss-tolerance 0.005 --json > "$out/convergence-check.json"
  echo "loom check convergence (fp8-block against bf16) rc=$?"
  python3 -c "
import json; r = json.load(open('$out/convergence-check.json')); print({k: r[k] for k in r if k in ('result', 'passed', 'correlation', 'final_loss_difference', 'pointwise_failures')})"
fi
pack_logs "$out"
