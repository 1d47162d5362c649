#!/usr/bin/env bash
# One device call after a round of changes: every GPU test binary of .devbin/ (bench/gpu/pack.sh),
# the GPU golden runs, then Qwen3-0.6B TP2 + SP as two ranks sharing the GPU (LOOM_TEST_STAGED_DEVICE_COMM=1)
# for its peak memory against loom plan. Logs in $OUT/logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh; out=$OUT; cd tests
for t in test_parallel_cuda_train test_cuda_adamw test_offload_engine test_resume test_optimizer_check_cuda test_recompute test_cuda_ops; do timeout 240 ../.devbin/$t > $out/$t.log 2>&1; echo "$t rc=$?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]|vs fp32" $out/$t.log | head -40; done
timeout 100 ../.devbin/test_golden --gtest_filter='*Gpu*' > $out/golden.log 2>&1; echo "golden rc=$?"; grep -E "^\[  (PASSED|FAILED)|correlation" $out/golden.log
cd ..; python3 bench/gpu/make_rows.py /tmp/loom-bench-rows.jsonl 8 8192
R=(--set train.init.random.config=../../recipes/qwen3-0.6b/config.json --set model=Qwen3-0.6B --set train.steps=3 --set 'result.window=[2, 3]' --set workload.global_batch=4)
LOOM_TEST_STAGED_DEVICE_COMM=1 timeout 200 .devbin/loom train bench/gpu/qwen3-1.7b-2x8k.yaml "${R[@]}" --set train.output_dir=/tmp/real-tp2sp --nproc 2 --set layout.tp=2 --set layout.sequence_parallel=true > $out/real-tp2sp.log 2>&1; echo "0.6B tp2sp rc=$?"; tail -2 $out/real-tp2sp.log; cp /tmp/real-tp2sp/metrics.jsonl $out/real-tp2sp-metrics.jsonl
pack_logs $out
