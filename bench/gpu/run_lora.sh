#!/usr/bin/env bash
# Issue 40 item 6 on one H200: LoRA's speed, every arm on the same rows (bench/gpu/make_rows.py,
# 8,192 tokens a row), each under bench/gpu/power_trace.sh, then bench/gpu/lora_results.py
# summary: $OUT/lora-h200.json (commit as bench/results/<date>-lora-h200.json) holds every run and
# the issue's `summary`. The arms:
#   full8   loom, Qwen3-8B full fine-tuning: qwen3-8b-offload-full.yaml (optimizer state on the host,
#           no recompute: full fine-tuning's fastest fit on one H200) at global batch GB8
#   lora8   loom, Qwen3-8B LoRA r16 on all seven targets: qwen3-8b-lora.yaml at global batch GB8
#   fp88    the same with workload.precision fp8 (the frozen base quantized once at load): not in
#           the default ARMS. The issue's 1.5x over PEFT is bf16 against bf16; this arm says
#           what the FP8 base adds beside it (1.5x of PEFT's 424 model TFLOP/s is 636, near what
#           bf16 GEMMs sustain under the 700 W cap: docs/performance.md)
#   peft8   bench/baselines/lora_peft.py (transformers + PEFT, compiled) on recipes/qwen3-8b, the first
#           2 of the same rows a step (one micro-batch: its step is the work of one of loom's 8)
#   lora32  loom, Qwen3-32B LoRA, bf16 base: qwen3-32b-lora.yaml at global batch GB32
#   fp832   the same with workload.precision fp8 (the frozen base quantized once at load)
# ARMS runs in the order given; the default alternates the 8B arms' order between two rounds:
#   "lora8 peft8 full8 lora32 fp832 full8 peft8 lora8". An arm whose estimated time (EST_<arm>,
#   seconds: guesses until measured) would end past DEADLINE (seconds from the start, 570) is
#   skipped and said so: a device call ends at 600 s. Where one call cannot hold them all (loom's
#   start and final checkpoint at 32 B parameters may take minutes), run the arms in calls back to
#   back on the same warm machine, each with its own OUT, and summarise the folders together:
#     ARMS="lora8 peft8 full8" OUT=$OUT/a bash bench/gpu/run_lora.sh        (call 1)
#     ARMS="lora32 fp832" OUT=$OUT/b bash bench/gpu/run_lora.sh             (call 2)
#     python3 bench/gpu/lora_results.py summary A B     (here, on the two logs.tgz unpacked)
# Knobs: GB8 (16), GB32 (4), STEPS8 / STEPS32 (3: step 1 is warmup, the median over the rest),
# PEFT_WARMUP (3), PEFT_STEPS (6), PEFT_COMPILE (auto: whole trunk, else per layer, else eager),
# PEFT_GRAD_CKPT (auto), ARM_TIMEOUT (400 s an arm), LOOM_SET (more --set arguments for every loom
# arm), SKIP_PACK (1: leave the files unpacked).
#   tar xzf .devpack/devbin.tgz && bash bench/gpu/run_lora.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
gb8=${GB8:-16}; gb32=${GB32:-4}; steps8=${STEPS8:-3}; steps32=${STEPS32:-3}
arm_timeout=${ARM_TIMEOUT:-400}; deadline=${DEADLINE:-570}
declare -A est=([full8]=${EST_full8:-120} [lora8]=${EST_lora8:-80} [fp88]=${EST_fp88:-80} [peft8]=${EST_peft8:-180}
                [lora32]=${EST_lora32:-240} [fp832]=${EST_fp832:-240})
rows=/tmp/loom-lora-rows.jsonl
need=$(( (gb8 > gb32 ? gb8 : gb32) * (steps8 > steps32 ? steps8 : steps32) ))
python3 bench/gpu/make_rows.py "$rows" "$need" 8192 151643 0
LOOM_SET_ARGS=()
[ -n "${LOOM_SET:-}" ] && eval "LOOM_SET_ARGS=($LOOM_SET)"

# loom_arm RUN RECIPE CONFIG STEPS GLOBAL_BATCH [full] [--set ...]: `loom train`, its metrics
# summarised by lora_results.py arm (step 1 is the warmup).
loom_arm() {
  local run=$1 recipe=$2 config=$3 steps=$4 gb=$5 kind=$6; shift 6
  .devbin/loom plan "$recipe" --set workload.global_batch="$gb" "$@" ${LOOM_SET:+"${LOOM_SET_ARGS[@]}"} \
    > "$out/$run-plan.txt" 2>&1
  echo "  plan rc=$? (0 fits): $(grep -E "^predicted|= on the GPU" "$out/$run-plan.txt" | tr -s ' ' | tr '\n' ' ')"
  TRACE=$out/power-$run.csv bash bench/gpu/power_trace.sh \
    timeout "$arm_timeout" .devbin/loom train "$recipe" --set train.data.path=$rows --set workload.global_batch="$gb" \
    --set train.steps="$steps" --set "result.window=[2, $steps]" --set train.output_dir=/tmp/$run "$@" \
    ${LOOM_SET:+"${LOOM_SET_ARGS[@]}"} > "$out/$run.log" 2>&1
  echo "  loom rc=$?"
  cp /tmp/$run/metrics.jsonl "$out/$run-metrics.jsonl" 2>/dev/null
  rm -rf /tmp/$run  # the final checkpoint (16 GB for the full 8B): a few fill the device's disk
  python3 bench/gpu/lora_results.py arm "${run%-*}" "$out/$run-metrics.jsonl" 1 "$config" 16 $kind > "$out/$run.json"
}

peft_arm() {
  local run=$1
  TRACE=$out/power-$run.csv bash bench/gpu/power_trace.sh \
    timeout "$arm_timeout" python3 bench/baselines/lora_peft.py --config recipes/qwen3-8b/config.json --data $rows \
    --rows 2 --row-tokens 8192 --warmup "${PEFT_WARMUP:-3}" --steps "${PEFT_STEPS:-6}" \
    --compile "${PEFT_COMPILE:-auto}" --grad-ckpt "${PEFT_GRAD_CKPT:-auto}" --json "$out/$run.json" \
    > "$out/$run.log" 2>&1
  echo "  peft rc=$?"
}

declare -A round=()
for arm in ${ARMS:-lora8 peft8 full8 lora32 fp832 full8 peft8 lora8}; do
  if (( SECONDS - start + ${est[$arm]:-0} > deadline )); then
    echo "== $arm skipped: at $((SECONDS - start)) s its ~${est[$arm]:-?} s would pass the ${deadline} s deadline"
    continue
  fi
  round[$arm]=$(( ${round[$arm]:-0} + 1 )); run=$arm-${round[$arm]}
  echo "== $run ($(date +%T), $((SECONDS - start)) s in)"
  case $arm in
    full8)  loom_arm "$run" bench/gpu/qwen3-8b-offload-full.yaml recipes/qwen3-8b/config.json "$steps8" "$gb8" full ;;
    lora8)  loom_arm "$run" bench/gpu/qwen3-8b-lora.yaml recipes/qwen3-8b/config.json "$steps8" "$gb8" lora ;;
    fp88)   loom_arm "$run" bench/gpu/qwen3-8b-lora.yaml recipes/qwen3-8b/config.json "$steps8" "$gb8" lora \
              --set workload.precision=fp8 ;;
    peft8)  peft_arm "$run" ;;
    lora32) loom_arm "$run" bench/gpu/qwen3-32b-lora.yaml recipes/qwen3-32b/config.json "$steps32" "$gb32" lora ;;
    fp832)  loom_arm "$run" bench/gpu/qwen3-32b-lora.yaml recipes/qwen3-32b/config.json "$steps32" "$gb32" lora \
              --set workload.precision=fp8 ;;
    *)      echo "unknown arm $arm"; continue ;;
  esac
  [ -f "$out/$run-metrics.jsonl" ] || [ "$arm" = peft8 ] || { echo "  no metrics; the log ends:"; tail -4 "$out/$run.log"; }
  python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).read()); print('  ', {k: r.get(k) for k in
    ('tokens_per_s','median_step_s','tflops_per_s','peak_mem_gib','compile','grad_ckpt','error')})" \
    "$out/$run.json" 2>/dev/null || { echo "  no result; the log ends:"; tail -4 "$out/$run.log"; }
  power_summary "$run" "$out/power-$run.csv" | tee -a "$out/power.txt"
done
.devbin/loom --version > "$out/loom-version.txt" 2>&1
python3 bench/gpu/lora_results.py summary "$out"
echo "done at $((SECONDS - start)) s"
[ -z "${SKIP_PACK:-}" ] && pack_logs "$out"
