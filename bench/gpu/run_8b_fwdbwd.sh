#!/usr/bin/env bash
# 8B-class forward + backward on one H200, several arms in one call (issues 24 and 27):
# each ARM is MODEL:PRECISION (MODEL a recipes/ folder: qwen3-8b, llama3.1-8b), trained two
# steps of 4 micro-batches of 2 × 8,192 tokens through bench/gpu/qwen3-8b-offload-full.yaml
# (the whole optimizer offloaded to the host, no recompute) with the op profile on. The
# profile covers step 2 alone; with the optimizer on the host its GPU time is the forward and
# backward (plus the grads' zeroing), so
#   forward + backward tokens/s = step tokens / profiled GPU time,
#   its MFU                     = step MFU × step time / profiled GPU time (6·N·tokens / 989e12).
# The same rows feed every arm (ids below Llama 3's 128,000 regular tokens).
#   ARMS="qwen3-8b:bf16 qwen3-8b:fp8 llama3.1-8b:bf16" bash bench/gpu/run_8b_fwdbwd.sh
# SET: more --set arguments for every arm. On an H100 (80 GB) the arms fit a row a
# micro-batch under full recompute (loom plan: 57.9 GiB bf16, 71.6 fp8), so the profiled time
# holds a recomputed forward too:
#   SET="--set layout.max_tokens_per_gpu=8192 --set 'layout.recompute={granularity: full}'"
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
python3 bench/gpu/make_rows.py /tmp/loom-bench-rows-8.jsonl 8 8192 128000 0
SET_ARGS=()
[ -n "${SET:-}" ] && eval "SET_ARGS=($SET)"
declare -A names=([qwen3-8b]=Qwen3-8B [llama3.1-8b]=Llama-3.1-8B)
for arm in ${ARMS:-qwen3-8b:bf16 qwen3-8b:fp8 llama3.1-8b:bf16}; do
  dir=${arm%%:*}; precision=${arm#*:}; run=8b-$dir-$precision
  LOOM_OP_PROFILE=1 timeout "${RUN_TIMEOUT:-240}" .devbin/loom train bench/gpu/qwen3-8b-offload-full.yaml \
    --set model=${names[$dir]} --set train.init.random.config=../../recipes/$dir/config.json \
    --set train.data.path=/tmp/loom-bench-rows-8.jsonl --set workload.global_batch=8 --set train.steps=2 \
    --set workload.precision=$precision --set train.output_dir=/tmp/$run ${SET:+"${SET_ARGS[@]}"} > "$out/$run.log" 2>&1
  echo "$run rc=$?"
  cp /tmp/$run/metrics.jsonl "$out/$run-metrics.jsonl" 2>/dev/null
  rm -rf /tmp/$run  # its final checkpoint: a few runs of them fill the device's disk
  python3 - "$out/$run.log" "$out/$run-metrics.jsonl" "$run" <<'PY' | tee -a "$out/fwdbwd.jsonl"
import json, re, sys
log, metrics, run = sys.argv[1:]
try:
    gpu_ms = float(re.search(r"loom op profile \(.*?, ([0-9.]+) ms in all", open(log).read()).group(1))
    step = [m for m in map(json.loads, open(metrics)) if m.get("step") == 2 and "mfu" in m][0]
except (AttributeError, IndexError, FileNotFoundError):
    print(json.dumps({"run": run, "error": "no profile or no step 2"})); sys.exit()
print(json.dumps({"run": run, "step_time_s": step["step_time_s"], "step_mfu": step["mfu"],
                  "fwdbwd_gpu_ms": gpu_ms, "fwdbwd_tokens_per_s": step["tokens"] / (gpu_ms / 1e3),
                  "fwdbwd_mfu": step["mfu"] * step["step_time_s"] / (gpu_ms / 1e3),
                  "peak_mem_gib": step["max_mem_gib"]}))
PY
  grep -A14 "loom op profile (" "$out/$run.log" | head -15
done
pack_logs "$out"
