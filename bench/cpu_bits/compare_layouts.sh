#!/usr/bin/env bash
# Two loom binaries on the tiny CPU recipe (recipes/tiny/qwen3-tiny-cpu.yaml) on every layout
# of CPU ranks: one rank, TP2 + SP, PP2, DP2, TP2 + SP × PP2 × DP2, TP4 × PP2 with full
# recompute. For each, the 16 steps' losses and grad norms (metrics.jsonl) and final/'s bytes
# must be equal bit for bit; prints one JSON object (bench/results) and exits 1 on a difference.
#   bench/cpu_bits/compare_layouts.sh BASE_LOOM NEW_LOOM > result.json
set -euo pipefail
cd "$(dirname "$0")/../.."
base=$(realpath "$1") new=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
layouts=(
  "one_rank|"
  "tp2_sp|--set layout.tp=2 --set layout.sequence_parallel=true"
  "pp2|--set layout.pp=2"
  "dp2|--set layout.dp=2"
  "tp2_sp_pp2_dp2|--set layout.tp=2 --set layout.sequence_parallel=true --set layout.pp=2 --set layout.dp=2"
  "tp4_pp2_recompute|--set layout.tp=4 --set layout.pp=2 --set layout.recompute.granularity=full --set layout.recompute.method=uniform --set layout.recompute.num_layers=1"
)
status=0
echo "{\"recipe\": \"recipes/tiny/qwen3-tiny-cpu.yaml\", \"base\": \"$1\", \"new\": \"$2\", \"layouts\": ["
first=1
for entry in "${layouts[@]}"; do
  name=${entry%%|*} sets=${entry#*|}
  ranks=1
  for dim in tp pp dp; do
    n=$(grep -o "layout.$dim=[0-9]*" <<<"$sets" | cut -d= -f2 || true)
    ranks=$((ranks * ${n:-1}))
  done
  for arm in base new; do
    bin=$base; [ "$arm" = new ] && bin=$new
    # shellcheck disable=SC2086
    "$bin" train recipes/tiny/qwen3-tiny-cpu.yaml $sets --set train.output_dir="$work/$name-$arm" \
      --nproc "$ranks" > "$work/$name-$arm.log" 2>&1 || { echo "$name $arm failed:" >&2; tail "$work/$name-$arm.log" >&2; exit 2; }
  done
  verdict=$(python3 - "$work/$name-base" "$work/$name-new" <<'PY'
import json, sys
a, b = sys.argv[1:3]
def metrics(d):
    return [(m["step"], m["loss"].hex() if isinstance(m["loss"], float) else m["loss"],
             float(m["grad_norm"]).hex()) for m in map(json.loads, open(f"{d}/metrics.jsonl"))]
ma, mb = metrics(a), metrics(b)
fa = open(f"{a}/final/model.safetensors", "rb").read()
fb = open(f"{b}/final/model.safetensors", "rb").read()
print(json.dumps({"steps": len(ma), "metrics_equal": ma == mb, "final_equal": fa == fb,
                  "last_loss": json.loads(open(f"{b}/metrics.jsonl").readlines()[-1])["loss"]}))
PY
)
  grep -q '"metrics_equal": true, "final_equal": true' <<<"$verdict" || status=1
  [ $first = 1 ] || echo ","
  first=0
  echo "{\"layout\": \"$name\", \"ranks\": $ranks, \"sets\": \"$sets\", \"result\": $verdict}"
done
echo "], \"all_equal\": $([ $status = 0 ] && echo true || echo false)}"
exit $status
