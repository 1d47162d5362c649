#!/usr/bin/env bash
# Issue 38 (Step 16: FP8 as a tensor format owned by the linear layer) on the device, in two
# parts that each fit one call:
#   PART=ab     same-call A/B of this binary (.devbin/loom) against the one before the step
#               (.devbin/base/loom) on Qwen3-1.7B at 2 × 8,192 tokens, rounds alternating which
#               runs first, in FP8 tensor scaling, FP8 block scaling and bf16, under a power
#               trace; the losses of A and B must agree bit for bit (the step moves no
#               arithmetic); then test_cuda_fp8.
#   PART=tests  the op table on the GPU against the CPU twins (quantize and gemm among its
#               cases) and its perf mode, the golden models in bf16 and FP8 against
#               transformers' fp32, recompute bitwise.
#   bash bench/gpu/run_step16_check.sh   (PART, ARMS, STEPS, ROUNDS narrow it)
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
run_test() {  # binary, timeout in seconds, gtest filter
  (cd tests && timeout "$2" "../.devbin/$1" --gtest_filter="${3:-*}" > "$out/$1.log" 2>&1
   echo "$1 rc=$?: $(grep -E '^\[  (PASSED|FAILED|  SKIPPED)' "$out/$1.log" | tr '\n' ' ')")
  grep -E "^\[  FAILED|Failure|error " "$out/$1.log" | head -8
}
if [ "${PART:-ab}" = ab ]; then
  for arm in "fp8|--set workload.precision=fp8" \
             "fp8_block|--set workload.precision=fp8 --set workload.fp8.scaling=block" "bf16|"; do
    name=${arm%%|*} sets=${arm#*|}
    [[ " ${ARMS:-fp8 fp8_block bf16} " == *" $name "* ]] || continue
    echo "== $name"
    TRACE=$out/power-$name.csv bash bench/gpu/power_trace.sh env STEPS=${STEPS:-8} MODELS=1.7b \
      ROUNDS=${ROUNDS:-2} ALTERNATE=1 BASE_LOOM=.devbin/base/loom A_SET="$sets" B_SET="$sets" \
      OUT=$out/$name SKIP_PACK=1 bash bench/gpu/run_ab.sh
  done
  run_test test_cuda_fp8 120
else
  run_test test_cuda_ops 300 'Ops/OpTableCudaVsCpu.*:CudaOpsTest.*'
  .devbin/op_table_perf > "$out/op_table_perf.jsonl" 2> "$out/op_table_perf.err"
  echo "op_table_perf rc=$?: $(wc -l < "$out/op_table_perf.jsonl") cases"
  run_test test_golden 150 '*Gpu*'
  run_test test_recompute 60
fi
pack_logs "$out"
