#!/usr/bin/env bash
# One device call: the recompute test on the GPU (bitwise equal to no recompute), then
# short loom runs at 2 rows of 8,192 tokens for the memory plan's validation table (model ×
# recompute; the true peak is metrics.jsonl's max_mem_gib) and their throughput.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
(cd tests && ../.devbin/test_recompute 2>&1 | tee "$out/test_recompute.log" | grep -E "OK|FAIL|Skipped|Failure" )
python3 bench/gpu/make_rows.py /tmp/loom-bench-rows.jsonl 8 8192
run() {  # name model recompute
  local name=$1 model=$2 recompute=$3
  timeout 240 .devbin/loom train bench/gpu/qwen3-1.7b-2x8k.yaml --set model=Qwen3-$model \
    --set train.init.random.config=../../recipes/qwen3-${model,,}/config.json --set "layout.recompute=$recompute" \
    --set train.steps=6 --set 'result.window=[3, 6]' --set train.output_dir=/tmp/mem-$name > "$out/$name.log" 2>&1
  echo "$name rc=$? $(tail -1 /tmp/mem-$name/metrics.jsonl 2>/dev/null)"
  cp /tmp/mem-$name/metrics.jsonl "$out/$name-metrics.jsonl" 2>/dev/null
}
run 0.6b-none 0.6B null
run 1.7b-none 1.7B null
run 1.7b-selective 1.7B '{granularity: selective}'
run 1.7b-full1 1.7B '{granularity: full, method: uniform, num_layers: 1}'
run 4b-none 4B null
run 4b-full1 4B '{granularity: full, method: uniform, num_layers: 1}'
run 4b-selective 4B '{granularity: selective}'
pack_logs "$out"
