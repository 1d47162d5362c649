#!/usr/bin/env bash
# Issue 24 (FP8 linear layers), one device call: the FP8 op tests and the GPU tests the change
# touches, then bf16 against fp8 with the same binary on the same machine start, under a power
# trace: Qwen3-1.7B and 4B steps at 2 × 8,192 tokens (bench/gpu/run_ab.sh, rounds alternating
# which arm goes first), then one step's op profile of each arm at 1.7B and on one Qwen3-32B
# decoder layer (the linear layers' GEMM rates, the casts' GB/s).
#   bash bench/gpu/run_fp8_check.sh   (TESTS, MODELS, ROUNDS, PROFILE_MODELS, SKIP_TESTS, SKIP_PROFILES narrow it)
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
if [ -z "${SKIP_TESTS:-}" ]; then
  for t in ${TESTS:-test_cuda_fp8 test_cuda_ops test_golden test_parallel_cuda_train}; do
    [ -x .devbin/$t ] || { echo "$t: not packed"; continue; }
    (cd tests && timeout 240 ../.devbin/$t > "$out/$t.log" 2>&1; echo "$t rc=$?: $(grep -E '^\[  (PASSED|FAILED|  SKIPPED)' "$out/$t.log" | tr '\n' ' ')")
    grep -E "^\[  FAILED|Failure|error " "$out/$t.log" | head -8
  done
fi
python3 bench/gpu/make_rows.py /tmp/loom-bench-rows.jsonl 8 8192 151643 0
TRACE=$out/ab-power.csv bash bench/gpu/power_trace.sh env STEPS=${STEPS:-10} MODELS="${MODELS:-1.7b 4b}" \
  ROUNDS=${ROUNDS:-2} ALTERNATE=1 BASE_LOOM=.devbin/loom B_SET="--set workload.precision=fp8" OUT=$out \
  SKIP_PACK=1 bash bench/gpu/run_ab.sh
python3 - "$out/ab-power.csv" <<'PY'
import sys, statistics
rows = [l.split(", ") for l in open(sys.argv[1]) if l.strip()]
busy = [(float(r[3].split()[0]), int(r[1].split()[0])) for r in rows
        if r[3].split()[0].replace('.', '').isdigit() and float(r[3].split()[0]) > 400]
print(f"power trace: {len(rows)} samples, {len(busy)} above 400 W: board power median "
      f"{statistics.median(p for p, _ in busy) if busy else 0:.0f} W, SM clock median "
      f"{statistics.median(c for _, c in busy) if busy else 0} MHz there")
PY
if [ -z "${SKIP_PROFILES:-}" ]; then
  for model in ${PROFILE_MODELS:-1.7b 32b-1layer}; do
    config=recipes/qwen3-$model/config.json; [ -f bench/gpu/qwen3-$model.json ] && config=bench/gpu/qwen3-$model.json
    for precision in bf16 fp8; do
      LOOM_OP_PROFILE=1 timeout 200 .devbin/loom train bench/gpu/qwen3-1.7b-2x8k.yaml \
        --set train.init.random.config=../../$config --set model=Qwen3-${model^^} --set train.steps=3 \
        --set "result.window=[2, 3]" \
        --set workload.precision=$precision --set train.output_dir=/tmp/prof-$model-$precision \
        > "$out/profile-$model-$precision.log" 2>&1
      echo "op profile $model $precision rc=$?"
      grep -A30 "loom op profile" "$out/profile-$model-$precision.log" | head -24
    done
  done
fi
pack_logs "$out"
