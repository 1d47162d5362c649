#!/usr/bin/env bash
# Issue 11 on nvidia-h200-x8 (8 GPUs of one host; not lent so far: each arm's layout is
# checked on CPU with loom plan, the engine on ranks sharing one GPU: run_parallel_check.sh).
# Binaries from bench/gpu/pack.sh (.devbin/); logs in $OUT/logs.tgz.
#
# The device allows 10 minutes a call and 30 a session, and the x8 kind's 235 GiB of disk
# cannot hold a 32B resume checkpoint (394 GB), so the seed's 20 steps an arm (the
# candidate ~57 s a step as planned, the reference ~80 s: 46 minutes) cannot run as
# specified. Each call runs one part from scratch, sized to fit:
#   ARM=candidate  (default) the rows, then the seed layout for STEPS (default 5) steps
#   ARM=reference  the rows, then the reference arm for STEPS (default 5) steps
# Both arms run the same number of steps: the learning-rate schedule (warmup and cosine
# decay) spans train.steps, so arms of different lengths would not share an lr at any step
# after the first and their losses could not be compared. A CPU run of this script's
# commands with a small config and 256-token rows (8 CPU ranks, 3 steps an arm) passed
# `loom check convergence`; with 4 and 3 steps the lr already differed at step 2
# (bench/results/2026-12-04-seed-script-cpu-dry-run.json).
#   ARM=checks     the optimizer component test and loom plan --search
# Each arm's metrics.jsonl and result.yaml come back in logs.tgz; `loom check convergence`
# between the two runs on the build machine, over their common steps.
#   CONV_BYTES  conversations to generate (default 6.5e6 bytes a step: 1e9 bytes packed into
#               41,850 rows of 8,192 tokens (bench/results/2026-12-02-data-build.json), so
#               about twice the 128 rows a step reads)
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
seed=recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml
arm=${ARM:-candidate}
steps=${STEPS:-5}
rows=/tmp/seed-rows
# The seed recipe has no train block: it comes from the command line (random init from the
# real Qwen3-32B config, the rows below, this call's steps; each arm's output_dir below).
# Checked on CPU (loom plan): the candidate fits at 131.18 of 139.94 GiB and is predicted at
# 2,434 tokens/s/GPU (MFU 0.472, counting the backward's TP overlap as hidden; the seed
# measured 2,200, the goal is 2,750); the reference arm fits at 29.42 GiB, predicted 1,755.
S=(--set train.device=cuda --set train.seed=1234 --set 'train.init={random: {config: ../config.json}}'
   --set "train.data={path: $rows}" --set "train.steps=$steps" --set "result.window=[3, $steps]"
   --set "result.window_tokens=$(((steps - 2) * 128 * 8192))"
   --set train.output_dir=/tmp/seed-plan)
# The reference arm: slime's scripts/run-qwen3-32B.sh layout (the recipe's correctness block).
REF=(--set layout.tp=8 --set layout.pp=1 --set layout.sequence_parallel=true --set layout.max_tokens_per_gpu=20480
     --set 'layout.recompute={granularity: full, method: uniform, num_layers: 1}'
     --set 'layout.offload={optimizer_fraction: 1.0, overlap: true}')
if [ "$arm" = checks ]; then
  .devbin/loom check optimizer --device cuda --size large --json > "$out/optimizer-check.json"
  echo "optimizer check rc=$?"
  .devbin/loom plan "$seed" "${S[@]}" --search --gpus 8 --top 8 > "$out/plan-search.txt" 2>&1
  head -30 "$out/plan-search.txt"
  pack_logs "$out"
  exit 0
fi
# Both arms build the same rows (same conversations, seed and settings: the manifests'
# checksums come back to compare).
python3 bench/data/make_conversations.py --bytes "${CONV_BYTES:-$((steps * 6500000))}" --seed 1 \
  --out /tmp/seed-conv.jsonl
.devbin/loom data build --input /tmp/seed-conv.jsonl --tokenizer tests/data/qwen3-tokenizer --row-tokens 8192 \
  --seed 1234 --loss-mask qwen3 --out "$rows" > "$out/data-build.log" 2>&1; echo "data build rc=$?"
cp "$rows/manifest.json" "$out/rows-manifest.json"
extra=(); [ "$arm" = reference ] && extra=("${REF[@]}")
.devbin/loom plan "$seed" "${S[@]}" "${extra[@]}" > "$out/plan-$arm.txt" 2>&1
timeout 540 .devbin/loom train "$seed" "${S[@]}" "${extra[@]}" --set train.output_dir=/tmp/seed-$arm --nproc 8 \
  > "$out/train-$arm.log" 2>&1
echo "$arm rc=$?"; tail -3 "$out/train-$arm.log"
cp /tmp/seed-$arm/metrics.jsonl "$out/metrics-$arm.jsonl"; cp /tmp/seed-$arm/result.yaml "$out/result-$arm.yaml"
pack_logs "$out"
