#!/usr/bin/env bash
# Isolated packing's speed against the seed's packing of the same conversations (issue 25):
# Qwen3-1.7B on one H200, bench/gpu/qwen3-1.7b-2x8k.yaml (2 rows of 8,192 tokens a step),
# rows from bench/gpu/make_packed_rows.py (median ~1,500 tokens, a long tail to 8,192),
# ROUNDS rounds of rows-packing then isolated, STEPS steps each. Prints each run's median
# tokens/s over steps 3..STEPS and the ratio isolated / rows, both as loom counts them (a
# row's tokens, padding included) and over real tokens (× (1 − padding share)).
#   bash bench/gpu/run_packing_ab.sh        (OUT=/tmp/out, STEPS=12, ROUNDS=2)
# SET: more --set arguments for both arms (on an H100, SET='--set layout.max_tokens_per_gpu=8192'
# runs a row a micro-batch: THD's deterministic attention backward wants ~17 GiB of workspace
# for two rows of these conversations).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
steps=${STEPS:-12}
bin=${LOOM:-.devbin/loom}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
python3 bench/gpu/make_packed_rows.py /tmp/loom-packing 400 8192 | tee "$out/packing-rows.json"
for round in $(seq "${ROUNDS:-2}"); do
  for arm in rows isolated; do
    name=packing-$arm-$round
    $bin train bench/gpu/qwen3-1.7b-2x8k.yaml --set train.data.path=/tmp/loom-packing-$arm.jsonl \
      --set train.steps=$steps --set train.output_dir=/tmp/loom-$name ${SET:-} > "$out/loom-$name.log" 2>&1
    echo "$name: rc=$?"
    cp /tmp/loom-$name/metrics.jsonl "$out/loom-$name-metrics.jsonl" 2>/dev/null
    rm -rf /tmp/loom-$name  # its final checkpoint: a few runs of them fill the device's disk
  done
done
python3 - "$out" "${ROUNDS:-2}" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
pad = json.load(open(f"{out}/packing-rows.json"))["isolated_padding_share"]
def rate(name):
    m = [json.loads(l) for l in open(f"{out}/loom-{name}-metrics.jsonl") if '"eval_loss"' not in l]
    return statistics.median(x["tokens_per_s_per_gpu"] for x in m if x["step"] >= 3)
result = {"padding_share": pad, "rounds": []}
for r in range(1, rounds + 1):
    a, b = rate(f"packing-rows-{r}"), rate(f"packing-isolated-{r}")
    result["rounds"].append({"rows_tok_s": a, "isolated_tok_s": b, "ratio": b / a,
                             "ratio_real_tokens": b * (1 - pad) / a})
    print(f"round {r}: rows {a:.0f} tok/s, isolated {b:.0f} tok/s, ratio {b / a:.4f}, "
          f"over real tokens {b * (1 - pad) / a:.4f} (padding {pad:.2%}); the issue asks >= 0.95")
json.dump(result, open(f"{out}/packing-ab.json", "w"), indent=1)
PY
pack_logs "$out"
