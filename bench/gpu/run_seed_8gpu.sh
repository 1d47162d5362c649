#!/usr/bin/env bash
# Issue 11 on nvidia-h200-x8 (8 GPUs of one host; not lent so far: each arm's layout is
# checked on CPU with loom plan, the engine on ranks sharing one GPU: run_parallel_check.sh).
# One device call: the rows, the seed recipe's layout with loom (candidate), the reference
# arm on the same rows, the convergence check between them, the optimizer component test,
# and the layout search. Binaries from bench/gpu/pack.sh (.devbin/); logs in $OUT/logs.tgz.
#   CONV_BYTES  conversations to generate (default 2e8: ~50M tokens, more than the 20 steps ×
#               128 rows × 8,192 tokens = 21M the run reads)
#   STEPS       steps of each arm (default 20, the seed's)
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
seed=recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml
rows=/tmp/seed-rows
python3 bench/data/make_conversations.py --bytes "${CONV_BYTES:-2e8}" --seed 1 --out /tmp/seed-conv.jsonl
.devbin/loom data build --input /tmp/seed-conv.jsonl --tokenizer tests/data/qwen3-tokenizer --row-tokens 8192 \
  --seed 1234 --loss-mask qwen3 --out "$rows" > "$out/data-build.log" 2>&1; echo "data build rc=$?"
cp "$rows/manifest.json" "$out/rows-manifest.json"
# The seed recipe has no train block: it comes from the command line (random init from the
# real Qwen3-32B config, the rows above, the seed's 20 steps; each arm's output_dir below).
# Checked on CPU (loom plan, this commit): the candidate fits at 131.18 of 139.94 GiB and is
# predicted at 2,309 tokens/s/GPU (MFU 0.448; the seed measured 2,200, the goal is 2,750);
# the reference arm fits at 29.42 GiB, predicted 1,627.
S=(--set train.device=cuda --set train.seed=1234 --set 'train.init={random: {config: ../config.json}}'
   --set "train.data={path: $rows}" --set "train.steps=${STEPS:-20}" --set train.output_dir=/tmp/seed-plan)
# The reference arm: slime's scripts/run-qwen3-32B.sh layout (the recipe's correctness block).
REF=(--set layout.tp=8 --set layout.pp=1 --set layout.sequence_parallel=true --set layout.max_tokens_per_gpu=20480
     --set 'layout.recompute={granularity: full, method: uniform, num_layers: 1}'
     --set 'layout.offload={optimizer_fraction: 1.0, overlap: true}')
for arm in candidate reference; do
  extra=(); [ $arm = reference ] && extra=("${REF[@]}")
  .devbin/loom plan "$seed" "${S[@]}" "${extra[@]}" > "$out/plan-$arm.txt" 2>&1
  timeout 3000 .devbin/loom train "$seed" "${S[@]}" "${extra[@]}" --set train.output_dir=/tmp/seed-$arm --nproc 8 \
    > "$out/train-$arm.log" 2>&1
  echo "$arm rc=$?"; tail -3 "$out/train-$arm.log"
  cp /tmp/seed-$arm/metrics.jsonl "$out/metrics-$arm.jsonl"; cp /tmp/seed-$arm/result.yaml "$out/result-$arm.yaml"
done
.devbin/loom check convergence --candidate /tmp/seed-candidate --reference /tmp/seed-reference --json \
  > "$out/convergence.json"; echo "convergence rc=$?"; cat "$out/convergence.json" | head -20
.devbin/loom check optimizer --device cuda --size large --json > "$out/optimizer-check.json"; echo "optimizer check rc=$?"
.devbin/loom plan "$seed" "${S[@]}" --search --gpus 8 --top 8 > "$out/plan-search.txt" 2>&1; head -30 "$out/plan-search.txt"
pack_logs "$out"
