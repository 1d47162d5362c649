#!/usr/bin/env bash
# The main job: set up, build, and train the small Qwen3 recipe (on the GPU when there is
# one and the CUDA trainer is built, else on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
recipe=recipes/tiny/qwen3-tiny-cpu.yaml
build/src/cli/loom train "$recipe" "$@"
