#!/usr/bin/env bash
# One device call for the parallel CUDA engine on the one lent GPU (issues 10 and 11: no
# kind with several GPUs is lent, and NCCL refuses two ranks on one device): its ranks share
# the GPU through HostStagedComm. First test_parallel_cuda_train (threads as ranks, every
# layout against the single-GPU engine), then `loom train --nproc N` through the binary
# (processes as ranks, LOOM_TEST_STAGED_DEVICE_COMM=1) on the tiny recipe: TP2 + SP × PP2
# and DP2 against one GPU with `loom check convergence`, and a checkpoint saved on TP2 × PP2
# resumed on DP2. With REAL=1, Qwen3-0.6B at 2 rows of 8,192 tokens a micro-batch, 2
# micro-batches a step, on one GPU and as TP2 + SP and PP2 ranks (the real shapes: 16 q / 8
# KV heads, a 151,936-row vocabulary split in two). Binaries come from bench/gpu/pack.sh
# (.devbin/); every log comes back in logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
(cd tests && ../.devbin/test_parallel_cuda_train 2>&1 | tee "$out/test_parallel_cuda_train.log" |
  grep -E "^\[  (PASSED|FAILED)|Failure|vs fp32|error" | head -60)
T=(--set train.device=cuda --set workload.precision=bf16 --set layout.max_tokens_per_gpu=128 --force)
run() {  # name ranks overrides...
  local name=$1 ranks=$2; shift 2
  local nproc=(); [ "$ranks" -gt 1 ] && nproc=(--nproc "$ranks")
  LOOM_TEST_STAGED_DEVICE_COMM=1 timeout 300 .devbin/loom train recipes/tiny/qwen3-tiny-cpu.yaml "${T[@]}" \
    --set train.output_dir=/tmp/par-$name "${nproc[@]}" "$@" > "$out/par-$name.log" 2>&1
  echo "tiny $name ($ranks ranks) rc=$?"; grep -E "ranks .* connected|error|Error" "$out/par-$name.log" | head -3
}
run one 1
run tp2sp_pp2 4 --set layout.tp=2 --set layout.pp=2 --set layout.dp=1 --set layout.sequence_parallel=true
run dp2 2 --set layout.dp=2
run tp2_dp2_offload 4 --set layout.tp=2 --set layout.dp=2 --set layout.offload.optimizer_fraction=0.5
run resumed 4 --set layout.tp=2 --set layout.pp=2 --set layout.dp=1 --set layout.sequence_parallel=true --stop-at-step 8
run resumed 2 --set layout.dp=2
for name in tp2sp_pp2 dp2 tp2_dp2_offload resumed; do
  echo "== $name against one GPU"
  .devbin/loom check convergence --candidate /tmp/par-$name --reference /tmp/par-one 2>&1 | tail -8
done
python3 - <<'PY'
import json
def losses(n): return [json.loads(l)["loss"] for l in open(f"/tmp/par-{n}/metrics.jsonl")]
one = losses("one")
for n in ["tp2sp_pp2", "dp2", "tp2_dp2_offload", "resumed"]:
    c = losses(n)
    print(n, "steps", len(c), "max rel loss diff", max(abs(a - b) / b for a, b in zip(c, one)))
PY
for name in one tp2sp_pp2 dp2 tp2_dp2_offload resumed; do cp /tmp/par-$name/metrics.jsonl "$out/par-$name-metrics.jsonl" 2>/dev/null; done
if [ "${REAL:-0}" = 1 ]; then
  python3 bench/gpu/make_rows.py /tmp/loom-bench-rows.jsonl 8 8192
  R=(--set train.init.random.config=../../recipes/qwen3-0.6b/config.json --set model=Qwen3-0.6B --set train.steps=6
     --set 'result.window=[2, 6]' --set workload.global_batch=4)
  real() {  # name ranks overrides...
    local name=$1 ranks=$2; shift 2
    local nproc=(); [ "$ranks" -gt 1 ] && nproc=(--nproc "$ranks")
    LOOM_TEST_STAGED_DEVICE_COMM=1 timeout 300 .devbin/loom train bench/gpu/qwen3-1.7b-2x8k.yaml "${R[@]}" \
      --set train.output_dir=/tmp/real-$name "${nproc[@]}" "$@" > "$out/real-$name.log" 2>&1
    echo "0.6B $name ($ranks ranks) rc=$?"; grep -E "error|Error" "$out/real-$name.log" | head -3
    cp /tmp/real-$name/metrics.jsonl "$out/real-$name-metrics.jsonl" 2>/dev/null
  }
  real one 1
  real tp2sp 2 --set layout.tp=2 --set layout.sequence_parallel=true
  real pp2 2 --set layout.pp=2
  for name in tp2sp pp2; do
    echo "== 0.6B $name against one GPU"
    .devbin/loom check convergence --candidate /tmp/real-$name --reference /tmp/real-one 2>&1 | tail -10
  done
fi
pack_logs "$out"
