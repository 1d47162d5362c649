#!/usr/bin/env bash
# Issue 41 item 4 on one H200: long rows, loom against bench/baselines/long_context.py (the
# compiled lean PyTorch model with every block checkpointed) on the same random rows
# (bench/gpu/make_rows.py), each arm under bench/gpu/power_trace.sh, the two arms' order
# alternating from case to case. CASES (in the order given; default all three):
#   8b-32k    Qwen3-8B,   32,768 tokens a row:  bench/gpu/qwen3-8b-32k.yaml
#   8b-64k    Qwen3-8B,   65,536 tokens a row:  bench/gpu/qwen3-8b-64k.yaml
#   1.7b-128k Qwen3-1.7B, 131,072 tokens a row: bench/gpu/qwen3-1.7b-128k.yaml
# ROWS rows a step (2; loom's global batch, the baseline's micro-batches of one row), WARMUP (1)
# and STEPS (2) timed steps; loom's plan for the case is printed before its run. A case whose
# estimated time (EST, 200 s a case) would end past DEADLINE (570 s from the start) is skipped:
# run the rest in another call on the same warm machine with its own OUT and summarise together:
#   python3 bench/gpu/long_context_results.py summary A B   (here, on the logs.tgz unpacked)
# Results: $OUT/logs.tgz with each arm's log and JSON, the plans, power.txt and
# long-context-h200.json (bench/gpu/long_context_results.py summary).
#   tar xzf .devpack/devbin.tgz && bash bench/gpu/run_long_context.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
rows=${ROWS:-2}; warmup=${WARMUP:-1}; steps=${STEPS:-2}; deadline=${DEADLINE:-570}; est=${EST:-200}
arm_timeout=${ARM_TIMEOUT:-300}
declare -A model=([8b-32k]=qwen3-8b [8b-64k]=qwen3-8b [1.7b-128k]=qwen3-1.7b)
declare -A length=([8b-32k]=32768 [8b-64k]=65536 [1.7b-128k]=131072)

loom_arm() {  # case
  local c=$1 recipe=bench/gpu/qwen3-$1.yaml data=/tmp/rows-${length[$1]}.jsonl
  .devbin/loom plan "$recipe" --set workload.global_batch="$rows" > "$out/$c-plan.txt" 2>&1
  echo "  plan rc=$? (0 fits): $(grep -E "^predicted|= on the GPU" "$out/$c-plan.txt" | tr -s ' ' | tr '\n' ' ')"
  TRACE=$out/power-$c-loom.csv bash bench/gpu/power_trace.sh timeout "$arm_timeout" .devbin/loom train "$recipe" \
    --set train.data.path="$data" --set workload.global_batch="$rows" --set train.steps=$((warmup + steps)) \
    --set "result.window=[$((warmup + 1)), $((warmup + steps))]" --set train.output_dir=/tmp/lc-$c > "$out/$c-loom.log" 2>&1
  echo "  loom rc=$?"
  cp /tmp/lc-$c/metrics.jsonl "$out/$c-loom-metrics.jsonl" 2>/dev/null
  rm -rf /tmp/lc-$c
  python3 bench/gpu/long_context_results.py arm "$out/$c-loom-metrics.jsonl" "$warmup" \
    "recipes/${model[$c]}/config.json" "${length[$c]}" > "$out/$c-loom.json"
  power_summary "$c loom" "$out/power-$c-loom.csv" | tee -a "$out/power.txt"
}

baseline_arm() {  # case
  local c=$1
  TRACE=$out/power-$c-torch.csv bash bench/gpu/power_trace.sh timeout "$arm_timeout" python3 \
    bench/baselines/long_context.py --config "recipes/${model[$c]}/config.json" --row-tokens "${length[$c]}" --rows "$rows" \
    --warmup "$warmup" --steps "$steps" --json "$out/$c-torch.json" > "$out/$c-torch.log" 2>&1
  echo "  baseline rc=$?"
  power_summary "$c torch" "$out/power-$c-torch.csv" | tee -a "$out/power.txt"
}

order=0
for c in ${CASES:-8b-32k 8b-64k 1.7b-128k}; do
  if (( SECONDS - start + est > deadline )); then
    echo "== $c skipped: at $((SECONDS - start)) s its ~$est s would pass the $deadline s deadline"; continue
  fi
  echo "== $c ($(date +%T), $((SECONDS - start)) s in)"
  [ -f /tmp/rows-${length[$c]}.jsonl ] ||
    python3 bench/gpu/make_rows.py /tmp/rows-${length[$c]}.jsonl $((rows * (warmup + steps))) "${length[$c]}"
  if (( order % 2 == 0 )); then loom_arm "$c"; baseline_arm "$c"; else baseline_arm "$c"; loom_arm "$c"; fi
  order=$((order + 1))
  for f in "$out/$c-loom.json" "$out/$c-torch.json"; do
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('  ', sys.argv[1].rsplit('/',1)[1], {k: r.get(k)
      for k in ('row_tokens','tokens_per_s','model_tflops','peak_mem_gib','compiled','error')})" "$f" 2>/dev/null ||
      echo "   $f: no result"
  done
done
.devbin/loom --version > "$out/loom-version.txt" 2>&1
python3 bench/gpu/long_context_results.py summary "$out"
echo "done at $((SECONDS - start)) s"
[ -z "${SKIP_PACK:-}" ] && pack_logs "$out"
