#!/usr/bin/env bash
# Issue 39 (mixtures of experts) on the GPU in one device call, under 9 minutes: are the MoE
# ops and CUTLASS's grouped GEMM right on the GPU, does a MoE model train there, and how fast
# is the Qwen3-30B-A3B slice against its PyTorch baseline. In order:
#   1. test_cuda_ops: the op table's MoE cases (route, sort, permute, combine, grouped_linear
#      through CUTLASS and, at its odd shape, the CUDA-core kernels; column_sum,
#      copy_from_host) against the CPU twins;
#   2. test_grouped_gemm: CUTLASS's grouped GEMM against cuBLASLt one expert at a time,
#      bitwise determinism;
#   3. grouped_gemm_perf and op_table_perf's MoE cases: TFLOP/s and GB/s (JSON lines);
#   4. recipes/tiny/moe-tiny-cpu.yaml trained 16 steps on the CPU (fp32) and on the GPU (bf16):
#      each step's loss within LOSS_TOL (0.03) relative of the CPU's;
#   5. the slice (bench/gpu/run_moe.sh): the loom arm, then the baseline's flash arm, LAYERS
#      layers, WARMUP + STEPS steps each.
# Each part has a time limit, cut to what is left of BUDGET (530 s) so that the whole ends in
# time; a part that does not finish says so and the rest still run.
#
# Memory: loom's slice at 8 layers takes 111.6 GiB by `loom plan` (bf16 weights, fp32 grads,
# AdamW state: 16 bytes a parameter of 5.6 B, plus activations and SDPA's workspace), so the
# default run wants an H200. On an H100 run LAYERS=4 (67.7 GiB; the baseline's bf16 state fits
# either). loom's time includes the random init of 5.6 B parameters on the host and the save
# of final/; its metrics are written step by step, so a cut save loses nothing.
# The baseline compiles with MODE=default here (max-autotune's first compile takes minutes;
# bench/gpu/run_moe.sh alone runs it).
#   bench/gpu/pack.sh build                     # on the build machine: .devbin/, .devpack/
#   tar xzf .devpack/devbin.tgz && bash bench/gpu/run_moe_check.sh            # an H200
#   tar xzf .devpack/devbin.tgz && LAYERS=4 bash bench/gpu/run_moe_check.sh   # an H100
# Results: $OUT/logs.tgz (every log, the JSON lines, the power traces); the summary on stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
deadline=$((SECONDS + ${BUDGET:-530}))
limit() {  # seconds a part may take: its own limit, or what is left before the deadline
  local left=$((deadline - SECONDS - 5))
  echo $(($1 < left ? $1 : (left > 1 ? left : 1)))
}

run_test() {  # binary, time limit in seconds, gtest filter
  (cd tests && timeout "$(limit "$2")" "../.devbin/$1" --gtest_filter="${3:-*}" > "$out/$1.log" 2>&1
   echo "$1 rc=$?: $(grep -E '^\[  (PASSED|FAILED|  SKIPPED)' "$out/$1.log" | tr '\n' ' ')")
  grep -E "^\[  FAILED|Failure|error " "$out/$1.log" | head -8
}

echo "== tests ($(date +%T))"
run_test test_cuda_ops 90 '*moe*:*grouped*:*column_sum*:*copy_from_host*'
run_test test_grouped_gemm 90

echo "== perf ($(date +%T))"
timeout "$(limit 45)" .devbin/grouped_gemm_perf > "$out/grouped_gemm_perf.jsonl" 2> "$out/grouped_gemm_perf.err"
echo "grouped_gemm_perf rc=$?: $(wc -l < "$out/grouped_gemm_perf.jsonl") cases"
cat "$out/grouped_gemm_perf.jsonl"
for part in moe grouped_linear column_sum; do
  timeout "$(limit 30)" .devbin/op_table_perf "$part" >> "$out/op_table_perf.jsonl" 2>> "$out/op_table_perf.err"
  echo "op_table_perf $part rc=$?"
done
cat "$out/op_table_perf.jsonl"

echo "== tiny MoE, CPU fp32 against GPU bf16 ($(date +%T))"
for device in cpu cuda; do
  sets=(--set train.output_dir=/tmp/moe-tiny-$device)
  [ $device = cuda ] && sets+=(--set train.device=cuda --set workload.precision=bf16)
  rm -rf /tmp/moe-tiny-$device
  timeout "$(limit 60)" .devbin/loom train recipes/tiny/moe-tiny-cpu.yaml "${sets[@]}" > "$out/moe-tiny-$device.log" 2>&1
  echo "loom train ($device) rc=$?"
  cp /tmp/moe-tiny-$device/metrics.jsonl "$out/moe-tiny-$device-metrics.jsonl" 2>/dev/null
done
python3 - "$out/moe-tiny-cpu-metrics.jsonl" "$out/moe-tiny-cuda-metrics.jsonl" "${LOSS_TOL:-0.03}" <<'PY' | tee "$out/moe-tiny-compare.json"
import json, sys
def losses(path):
    try:
        return [x["loss"] for x in map(json.loads, open(path)) if "loss" in x and "step" in x]
    except OSError:
        return []
cpu, gpu, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
rel = [abs(g - c) / abs(c) for c, g in zip(cpu, gpu)]
ok = len(cpu) == 16 and len(gpu) == 16 and max(rel) <= tol
print(json.dumps({"check": "moe-tiny cpu fp32 vs cuda bf16", "passed": ok, "tolerance": tol,
                  "worst_rel": round(max(rel), 5) if rel else None,
                  "cpu": [round(x, 5) for x in cpu], "cuda": [round(x, 5) for x in gpu]}))
PY

echo "== the Qwen3-30B-A3B slice ($(date +%T))"
export LAYERS=${LAYERS:-8} WARMUP=${WARMUP:-2} STEPS=${STEPS:-4} MODE=${MODE:-default}
ARMS=loom ARM_TIMEOUT=$(limit 180) OUT=$out SKIP_PACK=1 bash bench/gpu/run_moe.sh
ARMS=flash ARM_TIMEOUT=$(limit 240) OUT=$out SKIP_PACK=1 bash bench/gpu/run_moe.sh
echo "== done ($(date +%T))"
pack_logs "$out"
