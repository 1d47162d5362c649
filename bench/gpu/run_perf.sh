#!/usr/bin/env bash
# One device call for issue 3's speed work: the GPU op tests and golden runs (the kernels
# changed, so correctness first), GPU exact resume, then for each model in MODELS
# (default 1.7b; a name with a bench/gpu/qwen3-NAME.json config, e.g. 32b-1layer, uses it) loom with LOOM_OP_PROFILE=1 under each attention variant in VARIANTS
# (default: the deterministic heuristic choice) and, unless SKIP_BASELINE=1, the compiled
# PyTorch baseline in the same call. Binaries come from bench/gpu/pack.sh (.devbin/).
#   VARIANTS: det (default) | nondet (LOOM_SDPA_NONDETERMINISTIC=1) | tuned (LOOM_SDPA_AUTOTUNE=1)
#             | untuned (LOOM_GEMM_AUTOTUNE=0: the GEMM heuristic's first choice, no bit-exact tuning)
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  (cd tests && ../.devbin/test_cuda_ops 2>&1 | tee "$out/test_cuda_ops.log" | grep -E "^\[  (PASSED|FAILED)|Failure|error" | head -20)
  [ -x .devbin/test_nccl_comm ] && .devbin/test_nccl_comm 2>&1 | tee "$out/test_nccl_comm.log" | grep -E "^\[  (PASSED|FAILED)|Failure" | head -5
  (cd tests && ../.devbin/test_golden --gtest_filter='*Gpu*' 2>&1 | tee "$out/test_golden_gpu.log" | grep -E "PASSED|FAILED|correlation|Failure" | head -20)
  T=(--set train.device=cuda --set workload.precision=bf16)
  .devbin/loom train recipes/tiny/qwen3-tiny-cpu.yaml "${T[@]}" --set train.output_dir=/tmp/tiny-cuda > /dev/null 2>&1
  .devbin/loom train recipes/tiny/qwen3-tiny-cpu.yaml "${T[@]}" --set train.output_dir=/tmp/tiny-resume --stop-at-step 7 > /dev/null 2>&1
  .devbin/loom train recipes/tiny/qwen3-tiny-cpu.yaml "${T[@]}" --set train.output_dir=/tmp/tiny-resume > /dev/null 2>&1
  cmp /tmp/tiny-cuda/final/model.safetensors /tmp/tiny-resume/final/model.safetensors && echo "GPU resume: final weights bitwise identical"
  cmp <(cut -d, -f1-3 /tmp/tiny-cuda/metrics.jsonl) <(cut -d, -f1-3 /tmp/tiny-resume/metrics.jsonl) && echo "GPU resume: losses identical"
fi
python3 bench/gpu/make_rows.py /tmp/loom-bench-rows.jsonl 8 8192
for model in ${MODELS:-1.7b}; do
  # VARIANTS_<model> (dots as underscores) overrides VARIANTS for one model.
  key=VARIANTS_${model//[.-]/_}; variants=${!key:-${VARIANTS:-det}}
  config=recipes/qwen3-$model/config.json
  [ -f bench/gpu/qwen3-$model.json ] && config=bench/gpu/qwen3-$model.json
  for variant in $variants; do
    env=(LOOM_OP_PROFILE=1)
    [ "$variant" = nondet ] && env+=(LOOM_SDPA_NONDETERMINISTIC=1)
    [ "$variant" = tuned ] && env+=(LOOM_SDPA_AUTOTUNE=1)
    [ "$variant" = untuned ] && env+=(LOOM_GEMM_AUTOTUNE=0)
    name=$model-$variant
    env "${env[@]}" .devbin/loom train bench/gpu/qwen3-1.7b-2x8k.yaml \
      --set train.init.random.config=../../$config --set model=Qwen3-${model^^} \
      --set train.output_dir=/tmp/loom-$name ${EXTRA_SET:-} > "$out/loom-$name.log" 2>&1
    echo "loom $name rc=$?"
    grep -E "SDPA|plans|GEMM" "$out/loom-$name.log" | head -24
    python3 - "$name" <<'PY'
import json, statistics, sys
m = [json.loads(l) for l in open(f"/tmp/loom-{sys.argv[1]}/metrics.jsonl")]
w = [x for x in m if x["step"] >= 3]
t = statistics.median(x["step_time_s"] for x in w)
print(f"  {sys.argv[1]}: median step {t:.4f} s, {statistics.median(x['tokens_per_s_per_gpu'] for x in w):.0f} tok/s, "
      f"mfu {statistics.median(x['mfu'] for x in w):.4f}, peak {max(x['max_mem_gib'] for x in m):.2f} GiB, "
      f"losses {[round(x['loss'], 5) for x in m]}")
PY
    sed -n '/loom op profile/,$p' "$out/loom-$name.log" | head -16
    cp /tmp/loom-$name/metrics.jsonl "$out/loom-$name-metrics.jsonl" 2>/dev/null
    rm -rf /tmp/loom-$name  # its final checkpoint: a few runs of them fill the device's disk
  done
  if [ "${SKIP_BASELINE:-0}" != 1 ] && [ ! -f bench/gpu/qwen3-$model.json ]; then
    OUT=$out timeout 400 python3 bench/baselines/torch_lean_baseline.py qwen3-$model:2 2>&1 | tail -3
    mv "$out/torch_lean_baseline.json" "$out/torch_lean_baseline-$model.json"  # the script writes one file per call
  fi
done
pack_logs "$out"
