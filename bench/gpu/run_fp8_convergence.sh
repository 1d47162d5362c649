#!/usr/bin/env bash
# Issue 24 (FP8 linear layers), one device call: the convergence check of the FP8 arm against
# the bf16 arm, and Qwen3-8B's forward + backward in both.
#  1. Rows of real text the device has (bench/gpu/make_text_rows.py: the Python sources and
#     docs of transformers and torch, code and prose), 2 × 8,192 tokens a step for STEPS steps.
#  2. Qwen3-1.7B from the same random init, the same rows and schedule, bf16 then fp8;
#     `loom check convergence` of fp8 against bf16 with correlation ≥ 0.999 and the final
#     loss within 0.5%.
#  3. Qwen3-8B (optimizer offloaded, bench/gpu/qwen3-8b-offload-full.yaml) at 4 micro-batches
#     of 2 × 8,192 tokens a step, with the op profile: the forward and backward ops' GPU time of
#     step 2 in each precision.
#   STEPS=300 bash bench/gpu/run_fp8_convergence.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
steps=${STEPS:-300}
site=/opt/torch/.venv/lib/python3.12/site-packages
python3 bench/gpu/make_text_rows.py /tmp/text-rows.jsonl $((2 * steps)) 8192 $site/transformers $site/torch 2>&1 | tail -1
for precision in ${ARMS:-bf16 fp8}; do
  TRACE=$out/convergence-$precision-power.csv bash bench/gpu/power_trace.sh timeout 420 .devbin/loom train \
    bench/gpu/qwen3-1.7b-2x8k.yaml --set train.data.path=/tmp/text-rows.jsonl --set train.steps=$steps \
    --set train.optimizer.lr=3.0e-4 --set train.optimizer.min_lr=3.0e-5 --set train.optimizer.warmup_fraction=0.05 \
    --set workload.precision=$precision --set "result.window=[3, $steps]" \
    --set train.output_dir=/tmp/conv-$precision > "$out/convergence-$precision.log" 2>&1
  echo "1.7B $steps steps $precision rc=$?"; tail -2 "$out/convergence-$precision.log"
  cp /tmp/conv-$precision/metrics.jsonl "$out/convergence-$precision-metrics.jsonl"
done
.devbin/loom check convergence --candidate /tmp/conv-fp8 --reference /tmp/conv-bf16 --min-correlation 0.999 \
  --final-loss-tolerance 0.005 --json > "$out/convergence-check.json"
echo "loom check convergence rc=$?"; python3 -c "
import json; r = json.load(open('$out/convergence-check.json')); print({k: r[k] for k in r if k in ('result', 'passed', 'correlation', 'final_loss_difference', 'pointwise_failures')})"
if [ -z "${SKIP_8B:-}" ]; then
  python3 bench/gpu/make_rows.py /tmp/loom-bench-rows-8.jsonl 8 8192 151643 0
  for precision in bf16 fp8; do
    LOOM_OP_PROFILE=1 timeout 300 .devbin/loom train bench/gpu/qwen3-8b-offload-full.yaml \
      --set train.data.path=/tmp/loom-bench-rows-8.jsonl --set workload.global_batch=8 --set train.steps=2 \
      --set workload.precision=$precision --set train.output_dir=/tmp/8b-$precision > "$out/8b-$precision.log" 2>&1
    echo "8B $precision rc=$?"; grep -E "ms in all|linear|fp8" "$out/8b-$precision.log" | grep -v "^loom: GEMM" | head -8
  done
fi
pack_logs "$out"
