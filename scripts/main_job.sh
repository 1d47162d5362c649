#!/usr/bin/env bash
# The main job: loom end to end, small enough for a laptop. It sets up and builds the loom
# binary, then
#   1. packs the shipped chat conversations (recipes/chat/conversations.jsonl: system
#      prompts, multi-turn, reasoning in think blocks; made by make_conversations.py beside
#      it) into a row store with the Qwen3 tokenizer and the qwen3 loss mask (docs/data.md),
#      holding 5% of them out in a second store for the run's held-out evaluation;
#   2. trains a small Qwen3 from a random init on those rows (recipes/chat/qwen3-chat-small.yaml):
#      on the GPU in bf16 when there is one and this build has the CUDA backend, else on the
#      CPU in fp32. Extra arguments go to `loom train` (--set a.b=value ...);
#   3. renders the recipe's page from the run's result.yaml, with its charts (training and
#      eval loss together, step time), to HTML.
# Everything goes under runs/main-job/ (made afresh each time); the last line printed is the
# page's path. On a fresh clone on a 2-core machine without a GPU: 4 min 23 s, the build of
# loom included (7.1 CPU-minutes; load 0.3 at the start, 3.3 at the end; the 24 steps 110 s
# of it); 6 min 7 s in a checkout on the same machine with nvcc installed but no GPU (load
# 2 to 3); 18 minutes while other builds kept that machine at load 10. Those runs had no
# held-out evaluation; with it (7 forward passes over 11 rows), 7 min 37 s on that machine
# at load 8, the binary already built (each evaluation 14 to 19 s there, a step 10 to 14 s).
set -euo pipefail
cd "$(dirname "$0")/.."
# Without a GPU the CUDA backend would only cost build time (nvcc is slow on 2 cores): such
# a machine builds the CPU backend alone, in a folder of its own.
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU && command -v nvcc >/dev/null; then
  build=build
  device=(--set train.device=cuda --set workload.precision=bf16)
  LOOM_BUILD_TARGETS=loom scripts/setup.sh "$build"
  echo "main job: a GPU is present; training on it in bf16"
else
  build=build-cpu
  device=()
  LOOM_BUILD_TARGETS=loom scripts/setup.sh "$build" -DLOOM_ENABLE_CUDA=OFF
fi
loom=$build/src/cli/loom
out=runs/main-job
rm -rf "$out"
mkdir -p "$out"
"$loom" --version

# 1. Conversations to rows: 5% of them held out in a store of their own ($out/rows-eval),
# which the run evaluates on (the recipe's train.eval; docs/data.md, docs/recipes.md).
"$loom" data build --input recipes/chat/conversations.jsonl --tokenizer tests/data/qwen3-tokenizer \
  --row-tokens 256 --seed 1234 --loss-mask qwen3 --eval-fraction 0.05 --out "$out/rows"

# 2. The run.
"$loom" train recipes/chat/qwen3-chat-small.yaml "${device[@]}" "$@"

# 3. The page.
"$loom" recipe render "$out/train/result.yaml" --format html --run "$out/train" --out "$out/page.html"
echo "$PWD/$out/page.html"
