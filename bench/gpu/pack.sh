#!/usr/bin/env bash
# Packs the binaries a device run needs into .devbin/ (ignored by git, carried by the
# device tool): loom and the GPU test binaries from BUILD_DIR, stripped, plus the shared
# libraries they need that the device image lacks; and .devpack/devbin.tgz, the same compressed
# (a device call carries at most 64 MiB, the repository's files included: carry .devpack and
# start the command with `tar xzf .devpack/devbin.tgz`).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-cuda}
# Parquet's Arrow libraries (64 MB, 20 MB compressed) do not fit a call's 64 MiB beside the
# repository: pack from a build configured without them (-DLOOM_ARROW_DIR=/nonexistent).
if ldd "$build/src/cli/loom" 2>/dev/null | grep -q libarrow; then
  echo "pack.sh: $build/src/cli/loom links Apache Arrow; pack a build configured with -DLOOM_ARROW_DIR=/nonexistent" >&2
  exit 2
fi
rm -rf .devbin && mkdir -p .devbin/lib
for bin in src/cli/loom tests/ops/test_cuda_ops tests/ops/op_table_perf tests/ops/test_cuda_fp8 tests/golden/test_golden tests/golden/test_isolated tests/golden/test_lora tests/train/test_recompute \
           tests/ops/test_grouped_gemm tests/ops/grouped_gemm_perf \
           tests/optim/test_cuda_adamw tests/check/test_optimizer_check_cuda tests/train/test_offload_engine tests/train/test_resume \
           bench/offload/bench_offload tests/parallel/test_nccl_comm tests/train/test_parallel_cuda_train \
           tests/parallel/test_overlapped_tp_collectives; do
  [ -f "$build/$bin" ] && strip -o ".devbin/$(basename "$bin")" "$build/$bin"
done
for lib in libyaml-cpp.so.0.7; do
  cp -L "/usr/lib/x86_64-linux-gnu/$lib" .devbin/lib/
done
rm -rf .devpack && mkdir -p .devpack && tar czf .devpack/devbin.tgz .devbin
du -sh .devbin .devpack
