#!/usr/bin/env bash
# A/B of two loom binaries on one machine start (separate starts differ by 1-2% on every
# op, more than most single changes gain): for each model in MODELS, ROUNDS rounds of
# BASE_LOOM then .devbin/loom, STEPS steps each of bench/gpu/qwen3-1.7b-2x8k.yaml with that
# model's config, no op profile (its events would sit between streams that overlap). Prints
# each run's median step over steps 3..STEPS and the losses (A and B must agree where the
# change moves no arithmetic); BASELINE_MODELS get the compiled PyTorch baseline after.
# A_ENV / B_ENV: environment settings of each arm (the same binary under two switches);
# A_SET / B_SET: recipe --set arguments of each arm (B_SET='--set workload.precision=fp8').
# ALTERNATE=1 runs even rounds B first (the second run of a call is the slower one).
# SKIP_PACK=1 leaves the logs unpacked (a caller that writes more into OUT packs them).
# PROMPT_FRACTION: the share of each 1,024-token turn outside the loss mask (make_rows.py).
#   BASE_LOOM=.devbin/base/loom MODELS='1.7b 4b' bash bench/gpu/run_ab.sh
#   BASE_LOOM=.devbin/loom A_ENV=LOOM_GEMM_AUTOTUNE=0 MODELS=0.6b bash bench/gpu/run_ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
base=${BASE_LOOM:?BASE_LOOM: the A binary}
steps=${STEPS:-12}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
python3 bench/gpu/make_rows.py /tmp/loom-bench-rows.jsonl 8 8192 151643 "${PROMPT_FRACTION:-0}"
for model in ${MODELS:-1.7b}; do
  config=recipes/qwen3-$model/config.json
  [ -f bench/gpu/qwen3-$model.json ] && config=bench/gpu/qwen3-$model.json
  for round in $(seq "${ROUNDS:-1}"); do
    order="A B"; [ "${ALTERNATE:-0}" = 1 ] && [ $((round % 2)) = 0 ] && order="B A"
    for arm in $order; do
      bin=.devbin/loom; arm_env=${B_ENV:-}; arm_set=${B_SET:-}
      [ "$arm" = A ] && bin=$base && arm_env=${A_ENV:-} && arm_set=${A_SET:-}
      name=$model-$arm-$round
      start=$(date +%s)
      env $arm_env $bin train bench/gpu/qwen3-1.7b-2x8k.yaml --set train.init.random.config=../../$config \
        --set model=Qwen3-${model^^} --set train.steps=$steps \
        --set train.output_dir=/tmp/loom-$name ${EXTRA_SET:-} $arm_set > "$out/loom-$name.log" 2>&1
      rc=$?
      python3 - "$name" "$rc" "$(($(date +%s) - start))" <<'PY'
import json, statistics, sys
name, rc, wall = sys.argv[1:4]
try:
    m = [json.loads(l) for l in open(f"/tmp/loom-{name}/metrics.jsonl")]
except OSError:
    print(f"{name}: rc={rc}, no metrics ({wall} s)"); sys.exit()
w = [x for x in m if x["step"] >= 3]
if not w:
    print(f"{name}: rc={rc}, fewer than 3 steps ({wall} s)"); sys.exit()
t = statistics.median(x["step_time_s"] for x in w)
print(f"{name}: rc={rc} wall {wall} s, median step {t * 1000:.1f} ms (min {min(x['step_time_s'] for x in w) * 1000:.1f}), "
      f"{statistics.median(x['tokens_per_s_per_gpu'] for x in w):.0f} tok/s, mfu {statistics.median(x['mfu'] for x in w):.4f}, "
      f"peak {max(x['max_mem_gib'] for x in m):.2f} GiB, losses {[round(x['loss'], 5) for x in m]}")
PY
      cp /tmp/loom-$name/metrics.jsonl "$out/loom-$name-metrics.jsonl" 2>/dev/null
      rm -rf /tmp/loom-$name  # its final checkpoint: a few runs of them fill the device's disk
    done
  done
done
for model in ${BASELINE_MODELS:-}; do
  OUT=$out timeout 400 python3 bench/baselines/torch_lean_baseline.py qwen3-$model:2 2>&1 | tail -2
  mv "$out/torch_lean_baseline.json" "$out/torch_lean_baseline-$model.json"
done
[ -z "${SKIP_PACK:-}" ] && pack_logs "$out"
