#!/usr/bin/env python3
"""The numbers of bench/gpu/run_lora.sh (issue 40 item 6), two commands:

  lora_results.py arm NAME METRICS.jsonl WARMUP CONFIG.json RANK [full]
      one loom arm's JSON line from its metrics.jsonl: the median step time and tokens/s over the
      steps after WARMUP, the peak memory, and the model TFLOP/s by lora_flops.counts (4 · base +
      6 · adapter + attention; with `full`, full fine-tuning's 6 · base + attention), the same
      count the PEFT baseline divides by, over the tokens of each step.
  lora_results.py summary OUT_DIR [MORE_DIRS...]
      every arm's JSON line under the folders (<arm>-<round>.json; run_lora.sh's OUT, one a device
      call) into one bench/results-style file, OUT_DIR/lora-h200.json (commit it as
      bench/results/<date>-lora-h200.json), with the issue's `summary` (the median over an arm's
      rounds) and whether it meets the issue's targets. With several folders a run is named
      <folder>/<arm>-<round>; loom's commit comes from loom-version.txt (`loom --version`)."""
import datetime, glob, json, os, statistics, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "baselines"))
from lora_flops import PEAK, TARGETS, counts, full_step_flops  # noqa: E402

ARMS = {  # arm -> what it runs
    "full8": "loom, Qwen3-8B full fine-tuning (bench/gpu/qwen3-8b-offload-full.yaml: optimizer on the host, no recompute)",
    "lora8": "loom, Qwen3-8B LoRA r16 on all seven targets (bench/gpu/qwen3-8b-lora.yaml)",
    "fp88": "loom, Qwen3-8B LoRA r16, FP8 base (bench/gpu/qwen3-8b-lora.yaml, workload.precision fp8)",
    "peft8": "transformers + PEFT, Qwen3-8B LoRA r16 on all seven targets (bench/baselines/lora_peft.py)",
    "lora32": "loom, Qwen3-32B LoRA r16, bf16 base (bench/gpu/qwen3-32b-lora.yaml)",
    "fp832": "loom, Qwen3-32B LoRA r16, FP8 base (bench/gpu/qwen3-32b-lora.yaml, workload.precision fp8)",
}
TARGETS_40 = [("qwen3-8b", "ratio_vs_peft", 1.5), ("qwen3-8b", "ratio_vs_full", 1.4),  # (model, summary key, at least)
              ("qwen3-32b", "model_tflops", 600), ("qwen3-32b", "fp8_model_tflops", 900)]


def arm(name, metrics, warmup, config, rank, full=False):
    try:
        m = [x for x in map(json.loads, open(metrics)) if "step_time_s" in x]
    except OSError:
        return {"arm": name, "error": f"no metrics at {metrics}"}
    timed = [x for x in m if x["step"] > warmup]
    if not timed:
        return {"arm": name, "error": f"no step after step {warmup}", "steps": len(m)}
    raw = json.load(open(config))
    row_tokens = 8192
    t = statistics.median(x["step_time_s"] for x in timed)
    tokens = statistics.median(x["tokens"] for x in timed)
    rows = int(tokens) // row_tokens
    n = full_step_flops(raw, rows, row_tokens) if full else counts(raw, rank, TARGETS, rows, row_tokens)
    flops = n["flops"]
    return {"arm": name, "what": ARMS.get(name, name), "flops_count": "6·base + attention" if full else
            "4·base + 6·adapter + attention", **n,
            "step_s": [round(x["step_time_s"], 5) for x in timed], "median_step_s": round(t, 5),
            "tokens_per_s": round(statistics.median(x["tokens_per_s_per_gpu"] for x in timed), 1),
            "tflops_per_s": round(flops / t / 1e12, 1), "mfu": round(flops / t / PEAK, 4),
            "loom_mfu_field": [x.get("mfu") for x in timed],
            "peak_mem_gib": round(max(x["max_mem_gib"] for x in m), 2), "losses": [round(x["loss"], 5) for x in m]}


def summary(dirs):
    runs, gpu, power, version = {}, [], [], []
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*-[0-9].json"))):
            name = os.path.basename(path)[:-5]
            runs[name if len(dirs) == 1 else f"{os.path.basename(os.path.normpath(d))}/{name}"] = \
                json.loads(open(path).read().strip().splitlines()[-1])
        for lst, f in ((gpu, "gpu.txt"), (power, "power.txt"), (version, "loom-version.txt")):
            if os.path.exists(os.path.join(d, f)):
                lst += open(os.path.join(d, f)).read().strip().splitlines()

    def pick(name, key):
        vals = [r[key] for k, r in runs.items() if k.rsplit("/", 1)[-1].rsplit("-", 1)[0] == name and key in r and "error" not in r]
        return round(statistics.median(vals), 2) if vals else None

    def ratio(a, b):
        return round(a / b, 3) if a and b else None

    full, lora, peft = pick("full8", "tokens_per_s"), pick("lora8", "tokens_per_s"), pick("peft8", "tokens_per_s")
    s = {"qwen3-8b": {"full_tokens_per_s": full, "lora_tokens_per_s": lora, "peft_tokens_per_s": peft,
                      "ratio_vs_peft": ratio(lora, peft), "ratio_vs_full": ratio(lora, full),
                      "fp8_lora_tokens_per_s": pick("fp88", "tokens_per_s"),
                      "fp8_ratio_vs_peft": ratio(pick("fp88", "tokens_per_s"), peft)},
         "qwen3-32b": {"lora_tokens_per_s": pick("lora32", "tokens_per_s"),
                       "fp8_lora_tokens_per_s": pick("fp832", "tokens_per_s"),
                       "peak_gib": pick("lora32", "peak_mem_gib"), "fp8_peak_gib": pick("fp832", "peak_mem_gib"),
                       "model_tflops": pick("lora32", "tflops_per_s"), "fp8_model_tflops": pick("fp832", "tflops_per_s")}}
    met = {f"{model}.{key} >= {goal}": None if s[model][key] is None else s[model][key] >= goal
           for model, key, goal in TARGETS_40}
    res = {"benchmark": "issue 40 item 6: LoRA on one H200, loom against transformers + PEFT (compiled) and against "
                        "loom's own full fine-tuning (Qwen3-8B), and Qwen3-32B LoRA in bf16 and with the FP8 base",
           "date": datetime.date.today().isoformat(), "gpu": sorted(set(gpu)), "loom": sorted(set(version)),
           "command": "tar xzf .devpack/devbin.tgz && bash bench/gpu/run_lora.sh",
           "flops_note": "model FLOPs: 4 · base matmul parameters · tokens + 6 · adapter parameters · tokens + causal "
                         "attention (layers · rows · 6 · T² · heads · head_dim); full fine-tuning 6 · base · tokens + "
                         "attention; recompute not counted (bench/baselines/lora_flops.py)",
           "arms": ARMS, "runs": runs, "power": power, "summary": s, "targets_met": met}
    path = os.path.join(dirs[0], "lora-h200.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({"summary": s, "targets_met": met}, indent=1))


if __name__ == "__main__":
    if len(sys.argv) >= 7 and sys.argv[1] == "arm":
        print(json.dumps(arm(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]),
                             full=len(sys.argv) > 7 and sys.argv[7] == "full")))
    elif len(sys.argv) >= 3 and sys.argv[1] == "summary":
        summary(sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
