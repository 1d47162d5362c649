#!/usr/bin/env bash
# The main job: set up, build, and train the small Qwen3 recipe: on the GPU in bf16 when
# there is one and this build has the CUDA backend, else on the CPU in fp32.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
recipe=recipes/tiny/qwen3-tiny-cpu.yaml
device=()
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU && command -v nvcc >/dev/null; then
  device=(--set train.device=cuda --set workload.precision=bf16)
  echo "main job: a GPU is present; training on it in bf16"
fi
build/src/cli/loom train "$recipe" "${device[@]}" "$@"
