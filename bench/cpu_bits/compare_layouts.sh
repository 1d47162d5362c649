#!/usr/bin/env bash
# Two loom binaries on the tiny CPU recipes (recipes/tiny/) on every layout of CPU ranks, in
# fp32 and in FP8 (tensor and block scaling): one rank, TP2 + SP, PP2, DP2, TP2 + SP × PP2 ×
# DP2, TP4 × PP2 with full recompute; FP8 on one rank (with its statistics), TP2 without SP
# (the layers keep FP8 transposes of their inputs), TP2 + SP × PP2 × DP2, full recompute of a
# block of layers with a kept layer after it, selective recompute, Qwen2's biases; block
# scaling on one rank and on PP2 × DP2. For each, the 16 steps' losses and grad norms
# (metrics.jsonl), fp8_stats.jsonl where there is one, and final/'s bytes must be equal bit for
# bit; prints one JSON object (bench/results) and exits 1 on a difference.
#   bench/cpu_bits/compare_layouts.sh BASE_LOOM NEW_LOOM > result.json
set -euo pipefail
cd "$(dirname "$0")/../.."
base=$(realpath "$1") new=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
qwen3=recipes/tiny/qwen3-tiny-cpu.yaml qwen2=recipes/tiny/qwen2-tiny-cpu.yaml
fp8="--set workload.precision=fp8"
block="$fp8 --set workload.fp8.scaling=block"
layouts=(
  "one_rank|$qwen3|"
  "tp2_sp|$qwen3|--set layout.tp=2 --set layout.sequence_parallel=true"
  "pp2|$qwen3|--set layout.pp=2"
  "dp2|$qwen3|--set layout.dp=2"
  "tp2_sp_pp2_dp2|$qwen3|--set layout.tp=2 --set layout.sequence_parallel=true --set layout.pp=2 --set layout.dp=2"
  "tp4_pp2_recompute|$qwen3|--set layout.tp=4 --set layout.pp=2 --set layout.recompute.granularity=full --set layout.recompute.method=uniform --set layout.recompute.num_layers=1"
  "fp8_one_rank_stats|$qwen3|$fp8 --set train.fp8_stats_every=4"
  "fp8_tp2|$qwen3|$fp8 --set layout.tp=2"
  "fp8_tp2_sp_pp2_dp2|$qwen3|$fp8 --set layout.tp=2 --set layout.sequence_parallel=true --set layout.pp=2 --set layout.dp=2"
  "fp8_recompute_block|$qwen3|$fp8 --set layout.recompute.granularity=full --set layout.recompute.method=block --set layout.recompute.num_layers=1"
  "fp8_selective|$qwen3|$fp8 --set layout.recompute.granularity=selective"
  "fp8_qwen2_tp2|$qwen2|$fp8 --set layout.tp=2"
  "fp8_block_one_rank|$qwen3|$block --set train.fp8_stats_every=4"
  "fp8_block_pp2_dp2|$qwen3|$block --set layout.pp=2 --set layout.dp=2"
)
status=0
echo "{\"base\": \"$1\", \"new\": \"$2\", \"layouts\": ["
first=1
for entry in "${layouts[@]}"; do
  name=${entry%%|*} rest=${entry#*|}
  recipe=${rest%%|*} sets=${rest#*|}
  ranks=1
  for dim in tp pp dp; do
    n=$(grep -o "layout.$dim=[0-9]*" <<<"$sets" | cut -d= -f2 || true)
    ranks=$((ranks * ${n:-1}))
  done
  for arm in base new; do
    bin=$base; [ "$arm" = new ] && bin=$new
    # shellcheck disable=SC2086
    "$bin" train "$recipe" $sets --set train.output_dir="$work/$name-$arm" \
      --nproc "$ranks" > "$work/$name-$arm.log" 2>&1 || { echo "$name $arm failed:" >&2; tail "$work/$name-$arm.log" >&2; exit 2; }
  done
  verdict=$(python3 - "$work/$name-base" "$work/$name-new" <<'PY'
import json, sys
a, b = sys.argv[1:3]
def metrics(d):
    return [(m["step"], m["loss"].hex() if isinstance(m["loss"], float) else m["loss"],
             float(m["grad_norm"]).hex()) for m in map(json.loads, open(f"{d}/metrics.jsonl"))]
ma, mb = metrics(a), metrics(b)
def stats(d):
    try:
        return open(f"{d}/fp8_stats.jsonl").read()
    except FileNotFoundError:
        return None
fa = open(f"{a}/final/model.safetensors", "rb").read()
fb = open(f"{b}/final/model.safetensors", "rb").read()
print(json.dumps({"steps": len(ma), "metrics_equal": ma == mb and stats(a) == stats(b), "final_equal": fa == fb,
                  "fp8_stats_compared": stats(a) is not None,
                  "last_loss": json.loads(open(f"{b}/metrics.jsonl").readlines()[-1])["loss"]}))
PY
)
  grep -q '"metrics_equal": true, "final_equal": true' <<<"$verdict" || status=1
  [ $first = 1 ] || echo ","
  first=0
  echo "{\"layout\": \"$name\", \"recipe\": \"$recipe\", \"ranks\": $ranks, \"sets\": \"$sets\", \"result\": $verdict}"
done
echo "], \"all_equal\": $([ $status = 0 ] && echo true || echo false)}"
exit $status
