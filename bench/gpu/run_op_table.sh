#!/usr/bin/env bash
# Issue 38 (every op in the op table), one device call: the op table's cases on the GPU
# against their CPU twins (test_cuda_ops' OpTableCudaVsCpu), then its perf mode
# (op_table_perf): each case's TFLOP/s or GB/s, one JSON line a case, into
# $OUT/op_table_perf.jsonl. Binaries come from bench/gpu/pack.sh (.devbin/).
#   bash bench/gpu/run_op_table.sh   (FILTER: only the perf cases whose name contains it)
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
(cd tests && timeout 400 ../.devbin/test_cuda_ops --gtest_filter='Ops/OpTableCudaVsCpu.*' > "$out/test_cuda_ops.log" 2>&1
 echo "test_cuda_ops rc=$?: $(grep -E '^\[  (PASSED|FAILED|  SKIPPED)' "$out/test_cuda_ops.log" | tr '\n' ' ')")
grep -E "^\[  FAILED|Failure|error |Which is|tolerance" "$out/test_cuda_ops.log" | head -40
.devbin/op_table_perf "${FILTER:-}" > "$out/op_table_perf.jsonl" 2> "$out/op_table_perf.err"
echo "op_table_perf rc=$?: $(wc -l < "$out/op_table_perf.jsonl") cases"
cat "$out/op_table_perf.jsonl"
