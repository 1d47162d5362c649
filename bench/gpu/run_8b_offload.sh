#!/usr/bin/env bash
# One device call for issue 8: the offload GPU tests and `loom check optimizer --device cuda
# [--offload]` (bench/gpu/run_offload_check.sh), then Qwen3-8B full fine-tuning with the
# optimizer offloaded (RECIPE, default bench/gpu/qwen3-8b-offload.yaml; qwen3-8b-offload-full.yaml
# is fraction 1.0 without recompute) with the op profile.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
OUT=$out/offload SIZE=${SIZE:-large} timeout "${CHECK_TIMEOUT:-300}" bash bench/gpu/run_offload_check.sh .devbin \
  | grep -vE "^\[ RUN|^\[       OK|^\[----------\]$"
python3 bench/gpu/make_rows.py /tmp/loom-bench-rows-64.jsonl 64 8192
recipe=${RECIPE:-bench/gpu/qwen3-8b-offload.yaml}
.devbin/loom plan "$recipe" | tail -4
LOOM_OP_PROFILE=1 timeout "${RUN_TIMEOUT:-400}" .devbin/loom train "$recipe" --set train.output_dir=/tmp/loom-8b \
  > "$out/loom-8b.log" 2>&1 &
train=$!
# The host's memory while it runs: the pinned state and what else the process holds.
while kill -0 $train 2>/dev/null; do
  ps -o rss= -C loom >> "$out/loom-8b-rss-kib.txt"; sleep 5
done
wait $train
echo "loom 8b rc=$?"
grep -vE "^  (embedding|sum |fill)" "$out/loom-8b.log" | tail -22
cp /tmp/loom-8b/metrics.jsonl "$out/loom-8b-metrics.jsonl" 2>/dev/null
cp /tmp/loom-8b/result.yaml "$out/loom-8b-result.yaml" 2>/dev/null
ls -la /tmp/loom-8b/final
echo "peak host RSS $(sort -n "$out/loom-8b-rss-kib.txt" | tail -1) KiB"
free -g | head -2
