#!/usr/bin/env bash
# One device call for issue 23 (one engine for every device and layout): the GPU tests of the
# new engine, then the same step under two binaries (BASE_LOOM: the four engines; .devbin/loom:
# the one engine) on the same machine start: Qwen3-1.7B and 4B on one GPU (bench/gpu/run_ab.sh)
# and Qwen3-0.6B as two DP ranks sharing the GPU (LOOM_TEST_STAGED_DEVICE_COMM=1), with the op
# profile, where the single GPU's deferred grad scale and side-stream zeroing now run too.
# Binaries from bench/gpu/pack.sh (.devbin/, the base one in .devbin/base/).
#   BASE_LOOM=.devbin/base/loom bash bench/gpu/run_one_engine_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
base=${BASE_LOOM:?BASE_LOOM: the A binary}
for t in test_cuda_ops test_parallel_cuda_train test_offload_engine test_resume test_recompute test_golden \
         test_overlapped_tp_collectives test_cuda_adamw; do
  [ -x .devbin/$t ] || { echo "$t: not packed"; continue; }
  (cd tests && timeout 300 ../.devbin/$t > "$out/$t.log" 2>&1; echo "$t rc=$?: $(grep -E '^\[  (PASSED|FAILED|  SKIPPED)' "$out/$t.log" | tr '\n' ' ')")
  grep -E "^\[  FAILED" "$out/$t.log" | head -5
done
python3 bench/gpu/make_rows.py /tmp/loom-bench-rows.jsonl 8 8192 151643 0
for arm in A B; do
  bin=.devbin/loom; [ $arm = A ] && bin=$base
  LOOM_TEST_STAGED_DEVICE_COMM=1 LOOM_OP_PROFILE=1 timeout 240 $bin train bench/gpu/qwen3-1.7b-2x8k.yaml \
    --set train.init.random.config=../../recipes/qwen3-0.6b/config.json --set model=Qwen3-0.6B \
    --set layout.dp=2 --set workload.global_batch=4 --set layout.max_tokens_per_gpu=8192 --set train.steps=8 \
    --set train.output_dir=/tmp/dp2-$arm --nproc 2 --force > "$out/dp2-$arm.log" 2>&1
  echo "0.6B DP2 (staged, op profile) $arm rc=$?"; grep -iE "between|scale|memset|fill" "$out/dp2-$arm.log" | head -6
  python3 - /tmp/dp2-$arm <<'PY'
import json, statistics, sys
m = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
print(f"  median step (3..) {statistics.median(x['step_time_s'] for x in m if x['step'] >= 3) * 1000:.1f} ms, "
      f"peak {max(x['max_mem_gib'] for x in m):.2f} GiB, losses {[round(x['loss'], 5) for x in m]}")
PY
done
STEPS=10 MODELS='1.7b 4b' ROUNDS=1 BASE_LOOM=$base OUT=$out bash bench/gpu/run_ab.sh
