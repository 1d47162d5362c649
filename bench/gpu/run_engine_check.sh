#!/usr/bin/env bash
# One device call for issue 3: the GPU op tests, the GPU golden runs, the tiny recipe on
# GPU vs CPU, then Qwen3-1.7B (2 × 8,192 tokens) with loom and the compiled PyTorch
# baseline in the same call. Binaries come from bench/gpu/pack.sh (.devbin/).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
(cd tests && ../.devbin/test_cuda_ops 2>&1 | tee "$out/test_cuda_ops.log" | tail -40)
(cd tests && ../.devbin/test_golden --gtest_filter='*Gpu*' 2>&1 | tee "$out/test_golden_gpu.log" | grep -E "OK|FAIL|correlation|Failure|error" )
for dev in cpu cuda; do
  prec=fp32; [ $dev = cuda ] && prec=bf16
  .devbin/loom train recipes/tiny/qwen3-tiny-cpu.yaml --set train.device=$dev --set workload.precision=$prec \
    --set train.output_dir=/tmp/tiny-$dev > "$out/tiny-$dev.log" 2>&1; echo "tiny $dev rc=$?"
  cp /tmp/tiny-$dev/metrics.jsonl "$out/tiny-$dev-metrics.jsonl" 2>/dev/null
done
python3 - <<'PY'
import json, statistics as s
c=[json.loads(l)["loss"] for l in open("/tmp/tiny-cuda/metrics.jsonl")]
r=[json.loads(l)["loss"] for l in open("/tmp/tiny-cpu/metrics.jsonl")]
mc,mr=s.mean(c),s.mean(r)
corr=sum((a-mc)*(b-mr) for a,b in zip(c,r))/(sum((a-mc)**2 for a in c)*sum((b-mr)**2 for b in r))**.5
print(f"tiny recipe GPU bf16 vs CPU fp32: correlation {corr:.6f}, final loss diff {abs(c[-1]-r[-1])/r[-1]:.5f}")
PY
# Exact resume on the GPU: 16 steps straight (above) against stop at 7 + resume.
T=(--set train.device=cuda --set workload.precision=bf16 --set train.output_dir=/tmp/tiny-resume)
.devbin/loom train recipes/tiny/qwen3-tiny-cpu.yaml "${T[@]}" --stop-at-step 7 > /dev/null 2>&1
.devbin/loom train recipes/tiny/qwen3-tiny-cpu.yaml "${T[@]}" > "$out/tiny-resume.log" 2>&1; echo "resume rc=$?"
cmp /tmp/tiny-cuda/final/model.safetensors /tmp/tiny-resume/final/model.safetensors && echo "GPU resume: final weights bitwise identical"
cmp <(cut -d, -f1-3 /tmp/tiny-cuda/metrics.jsonl) <(cut -d, -f1-3 /tmp/tiny-resume/metrics.jsonl) && echo "GPU resume: losses identical"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 .devbin/loom train recipes/tiny/qwen3-tiny-cpu.yaml \
  --set train.device=cuda --set workload.precision=bf16 --set train.steps=2 --set 'result.window=[1, 2]' \
  --set train.output_dir=/tmp/tiny-memcheck > "$out/memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -3 "$out/memcheck.log"
python3 bench/gpu/make_rows.py /tmp/loom-bench-rows.jsonl 8 8192
LOOM_OP_PROFILE=1 .devbin/loom train bench/gpu/qwen3-1.7b-2x8k.yaml > "$out/loom-1.7b.log" 2>&1; echo "loom 1.7b rc=$?"; tail -32 "$out/loom-1.7b.log"
cp /tmp/loom-bench-1.7b/metrics.jsonl "$out/loom-1.7b-metrics.jsonl" 2>/dev/null
cp /tmp/loom-bench-1.7b/result.yaml "$out/loom-1.7b-result.yaml" 2>/dev/null
if [ "${SKIP_BASELINE:-0}" != 1 ]; then
  OUT=$out timeout 400 python3 bench/baselines/torch_lean_baseline.py qwen3-1.7b:2 2>&1 | tail -3
fi
# At most 8 files come back from a device call: everything in one archive.
cp /tmp/tiny-cuda/metrics.jsonl "$out/tiny-cuda-metrics.jsonl" 2>/dev/null
pack_logs "$out"
