#!/usr/bin/env bash
# A Qwen3-30B-A3B slice on one GPU (LAYERS of its 48 decoder layers, 8 by default; 2 × 8,192
# tokens a step, full fine-tuning from a random init): the hand-written PyTorch baseline
# (bench/baselines/moe_slice.py: torch.compile, sort-based dispatch, torch._grouped_mm experts,
# flash or cuDNN SDPA, fused linear + CE, fused AdamW on bf16 parameters) and loom on the same
# work (bench/gpu/qwen3-30b-a3b-slice.yaml), in one call, each arm under bench/gpu/power_trace.sh.
#   ARMS (run in this order; default "check gg flash"):
#     check  moe_slice.py --check on the GPU: tiny sizes, torch._grouped_mm forward/backward and the
#            grouped MoE against a per-expert loop, the fused loss against F.cross_entropy, compiled
#            against eager (seconds, plus one small compile)
#     gg     moe_slice.py --grouped-gemm-only: torch._grouped_mm alone at the slice's shapes
#            (128 experts, 131,072 rows; gate_up and down; forward, dX, dW), even and Zipf counts,
#            against one dense cuBLAS GEMM of the same FLOPs (GG_COMPILE=1 adds inductor's
#            max-autotune forward: minutes)
#     flash  the training step with flash SDPA (enable_gqa)
#     cudnn  the training step with cuDNN SDPA (k/v expanded to 32 heads)
#     loom   loom_arm below: `loom train` of LOOM_RECIPE at LAYERS layers (112 GiB at 8 by loom plan:
#            an H200; LAYERS=4 on an H100)
#   LAYERS (8), WARMUP (3), STEPS (8), MODE (torch.compile mode: max-autotune-no-cudagraphs;
#   MODE=default for the default), COMPILE (auto: the whole trunk fullgraph, falling back to
#   fullgraph=False, then per block, then eager; or full|full-breaks|blocks|none),
#   PRECISION (bf16: bf16 params/grads/AdamW state, 8 B a parameter, 41.8 GiB at 8 layers;
#   amp: fp32 params and state, 16 B a parameter, 83.6 GiB at 8 layers: H200 only),
#   ARM_TIMEOUT (seconds an arm may take, 420), EXTRA (more moe_slice.py arguments for every
#   baseline arm; later ones win: EXTRA="--ce-chunk 8192"), SKIP_PACK (1: leave the logs
#   unpacked, for a caller that writes more into OUT). A device call is at most 10 minutes: the first
#   compile with max-autotune is not measured yet, so run the training arms in separate calls
#   until it is (the JSON's warmup_s says how long the compile and warmup took).
#     ARMS="check gg" bash bench/gpu/run_moe.sh
#     ARMS=flash bash bench/gpu/run_moe.sh
#     ARMS=loom bash bench/gpu/run_moe.sh
# Results: $OUT/moe_slice-<arm>.json (one JSON line each), the logs and power traces, packed.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
layers=${LAYERS:-8}; warmup=${WARMUP:-3}; steps=${STEPS:-8}
arm_timeout=${ARM_TIMEOUT:-420}
common=(--layers "$layers" --rows 2 --row-tokens 8192 --warmup "$warmup" --steps "$steps"
        --mode "${MODE:-max-autotune-no-cudagraphs}" --compile "${COMPILE:-auto}" --precision "${PRECISION:-bf16}")

baseline() {  # arm, then moe_slice.py arguments
  local arm=$1; shift
  echo "== $arm ($(date +%T))"
  TRACE=$out/power-$arm.csv bash bench/gpu/power_trace.sh \
    timeout "$arm_timeout" python3 bench/baselines/moe_slice.py "$@" ${EXTRA:-} --json "$out/moe_slice-$arm.json" \
    > "$out/moe_slice-$arm.log" 2>&1
  echo "$arm rc=$? ($(date +%T))"
  if [ ! -f "$out/moe_slice-$arm.json" ]; then
    echo "  no JSON; the log ends:"; tail -5 "$out/moe_slice-$arm.log"
  else python3 - "$out/moe_slice-$arm.json" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read())
if "results" in r:  # --grouped-gemm-only
    for x in r["results"]:
        print(f"  {x['proj']:8} {x['dist']:22} {x['op']:26} " + (f"{x['ms']:8.3f} ms {x['tflops_per_s']:6.1f} TFLOP/s"
              if "ms" in x else x.get("error", "")))
elif "passed" in r:
    print("  check passed" if r["passed"] else "  CHECK FAILED", json.dumps(r)[:1500])
elif "error" in r:
    print("  error:", r["error"], r.get("attempts"))
else:
    print(f"  compile={r['compile']} mode={r['compile_mode']} attention={r['attention']}: median step {r['median_step_s'] * 1e3:.1f} ms, "
          f"{r['tokens_per_s']:.0f} tok/s, {r['tflops_per_s']} TFLOP/s (mfu {r['mfu']}, 6N {r['mfu_6n']}), "
          f"peak {r.get('peak_mem_gib')} GiB, warmup {r['warmup_s']} s, losses {r['losses']}, failed before: {r['attempts']}")
PY
  fi
  power_summary "  power" "$out/power-$arm.csv"
}

# ---- The loom arm: LOOM_RECIPE (bench/gpu/qwen3-30b-a3b-slice.yaml: bf16, no recompute) with
# its model's config.json at LAYERS layers (recipes/qwen3-30b-a3b-slice/config.json, rewritten
# into /tmp), on the same rows as the other GPU benchmarks (bench/gpu/make_rows.py), WARMUP +
# STEPS steps; the median step over the timed steps from metrics.jsonl (tokens_per_s_per_gpu,
# max_mem_gib as run_ab.sh reads them), and the TFLOP/s by the baseline's own count
# (moe_slice.counts: 6·N_active·tokens + causal attention), so both arms divide the same FLOPs.
# loom's fp32 master weights, grads and AdamW state take 16 bytes a parameter: 8 layers need
# 112 GiB by loom plan (an H200); `loom train` refuses a layout its plan says does not fit, so on an
# H100 run LAYERS=4. LOOM_SET: more --set arguments.
LOOM_RECIPE=${LOOM_RECIPE:-bench/gpu/qwen3-30b-a3b-slice.yaml}
loom_arm() {
  echo "== loom ($(date +%T))"
  python3 bench/gpu/make_rows.py /tmp/loom-bench-rows.jsonl $((2 * (warmup + steps))) 8192 151643 0
  python3 - "$layers" > /tmp/loom-moe-config.json <<'PY'
import json, sys
config = json.load(open("recipes/qwen3-30b-a3b-slice/config.json"))
config["num_hidden_layers"] = int(sys.argv[1])
print(json.dumps(config, indent=2))
PY
  local total=$((warmup + steps))
  LOOM_SET_ARGS=()
  [ -n "${LOOM_SET:-}" ] && eval "LOOM_SET_ARGS=($LOOM_SET)"
  TRACE=$out/power-loom.csv bash bench/gpu/power_trace.sh \
    timeout "$arm_timeout" .devbin/loom train "$LOOM_RECIPE" --set train.data.path=/tmp/loom-bench-rows.jsonl \
    --set train.init.random.config=/tmp/loom-moe-config.json \
    --set train.steps=$total --set "result.window=[$((warmup + 1)), $total]" \
    --set train.output_dir=/tmp/loom-moe ${LOOM_SET:+"${LOOM_SET_ARGS[@]}"} > "$out/loom-moe.log" 2>&1
  echo "loom rc=$? ($(date +%T))"
  cp /tmp/loom-moe/metrics.jsonl "$out/loom-moe-metrics.jsonl" 2>/dev/null
  rm -rf /tmp/loom-moe  # its final checkpoint: a few runs of them fill the device's disk
  python3 - "$out/loom-moe-metrics.jsonl" "$warmup" "$layers" <<'PY' | tee "$out/loom-moe.json"
import json, statistics, sys
sys.path.insert(0, "bench/baselines")
from moe_slice import counts, QWEN3_30B_A3B, PEAK
path, warmup, layers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    m = [x for x in map(json.loads, open(path)) if "step_time_s" in x]
except OSError:
    print(json.dumps({"arm": "loom", "error": "no metrics"})); sys.exit()
w = [x for x in m if x["step"] > warmup]
if not w:
    print(json.dumps({"arm": "loom", "error": f"no step after {warmup}"})); sys.exit()
n = counts(QWEN3_30B_A3B, layers, 2, 8192)
t = statistics.median(x["step_time_s"] for x in w)
print(json.dumps({"arm": "loom", "layers": layers, "median_step_s": round(t, 5),
                  "step_s": [round(x["step_time_s"], 5) for x in w],
                  "tokens_per_s": round(statistics.median(x["tokens_per_s_per_gpu"] for x in w), 1),
                  "tflops_per_s": round(n["flops"] / t / 1e12, 1), "mfu": round(n["flops"] / t / PEAK, 4),
                  "mfu_6n": round(n["flops_linear"] / t / PEAK, 4),
                  "peak_mem_gib": max(x["max_mem_gib"] for x in m), "losses": [round(x["loss"], 5) for x in m]}))
PY
  power_summary "  power" "$out/power-loom.csv"
}
# ---------------------------------------------------------------------------------------------

for arm in ${ARMS:-check gg flash}; do
  case $arm in
    check) baseline check --check ;;
    gg)    baseline gg --grouped-gemm-only ${GG_COMPILE:+--gg-compile} ;;
    flash) baseline flash "${common[@]}" --attn flash ;;
    cudnn) baseline cudnn "${common[@]}" --attn cudnn ;;
    loom)  loom_arm ;;
    *)     echo "unknown arm $arm" ;;
  esac
done
[ -z "${SKIP_PACK:-}" ] && pack_logs "$out"
