#!/usr/bin/env bash
# One device call for issue 27 (model families), after bench/gpu/pack.sh of a CUDA build:
#  1. the GPU op tests (every op against its CPU twin; the new rows: RoPE without q/k norm,
#     llama3-scaled RoPE, head_dim 64, the q/k/v bias add and its gradient), the golden bf16
#     runs (tiny_llama and tiny_qwen2 beside the Qwen3 cases) and the GPU ranks' parallel test;
#  2. speed: Qwen3-8B and Llama-3.1-8B shapes through the same recipe in this one call
#     (bench/gpu/qwen3-8b-offload.yaml: 2 × 8,192 tokens a micro-batch, the optimizer
#     offloaded), their MFU side by side; then Llama-3.2-1B (head_dim 64, 2 × 8,192 tokens)
#     against the compiled PyTorch baseline adapted to Llama's block, in the same call.
# SKIP_TESTS=1 skips 1; SKIP_8B=1 skips the 8B pair.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  (cd tests && ../.devbin/test_cuda_ops 2>&1 | tee "$out/test_cuda_ops.log" | grep -E "^\[  (PASSED|FAILED)|Failure" | head -20)
  (cd tests && ../.devbin/test_golden --gtest_filter='*Gpu*' 2>&1 | tee "$out/test_golden_gpu.log" |
     grep -E "PASSED|FAILED|correlation|Failure" | head -20)
  [ -x .devbin/test_parallel_cuda_train ] && (cd tests && ../.devbin/test_parallel_cuda_train 2>&1 |
     tee "$out/test_parallel_cuda_train.log" | grep -E "^\[  (PASSED|FAILED)|Failure" | head -10)
fi

summary() {  # metrics of run $1: median step, tokens/s, MFU over steps >= 3
  python3 - "$1" <<'PY'
import json, statistics, sys
m = [json.loads(l) for l in open(f"/tmp/loom-{sys.argv[1]}/metrics.jsonl")]
w = [x for x in m if x["step"] >= 3] or m
print(f"  {sys.argv[1]}: median step {statistics.median(x['step_time_s'] for x in w):.4f} s, "
      f"{statistics.median(x['tokens_per_s_per_gpu'] for x in w):.0f} tok/s, "
      f"mfu {statistics.median(x['mfu'] for x in w):.4f}, peak {max(x['max_mem_gib'] for x in m):.2f} GiB")
PY
}

# Llama 3's vocabulary is 128,256: rows of ids below its 128,000 regular tokens.
python3 bench/gpu/make_rows.py /tmp/loom-bench-rows.jsonl 8 8192
python3 bench/gpu/make_rows.py /tmp/loom-bench-rows-llama.jsonl 8 8192 128000
if [ "${SKIP_8B:-0}" != 1 ]; then
  python3 bench/gpu/make_rows.py /tmp/loom-bench-rows-64.jsonl 64 8192 128000
  for pair in qwen3-8b:Qwen3-8B llama3.1-8b:Llama-3.1-8B; do
    dir=${pair%%:*}; model=${pair#*:}
    LOOM_OP_PROFILE=1 timeout "${RUN_TIMEOUT:-400}" .devbin/loom train bench/gpu/qwen3-8b-offload.yaml \
      --set model=$model --set train.init.random.config=../../recipes/$dir/config.json \
      --set train.output_dir=/tmp/loom-$dir > "$out/loom-$dir.log" 2>&1
    echo "loom $dir rc=$?"; summary "$dir"
    cp /tmp/loom-$dir/metrics.jsonl "$out/loom-$dir-metrics.jsonl" 2>/dev/null
  done
fi
LOOM_OP_PROFILE=1 .devbin/loom train bench/gpu/qwen3-1.7b-2x8k.yaml --set model=Llama-3.2-1B \
  --set train.init.random.config=../../recipes/llama3.2-1b/config.json \
  --set train.data.path=/tmp/loom-bench-rows-llama.jsonl --set train.output_dir=/tmp/loom-llama3.2-1b \
  > "$out/loom-llama3.2-1b.log" 2>&1
echo "loom llama3.2-1b rc=$?"; summary llama3.2-1b
sed -n '/loom op profile/,$p' "$out/loom-llama3.2-1b.log" | head -20
cp /tmp/loom-llama3.2-1b/metrics.jsonl "$out/loom-llama3.2-1b-metrics.jsonl" 2>/dev/null
OUT=$out timeout 400 python3 bench/baselines/torch_lean_baseline.py llama3.2-1b:2 2>&1 | tail -3
pack_logs "$out"
