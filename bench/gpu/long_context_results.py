#!/usr/bin/env python3
"""The numbers of bench/gpu/run_long_context.sh (issue 41 item 4), two commands:

  long_context_results.py arm METRICS.jsonl WARMUP CONFIG.json ROW_TOKENS
      loom's arm as one JSON line from its metrics.jsonl: the median step time and tokens/s
      over the steps after WARMUP, the peak memory and the model TFLOP/s by the count the
      baseline divides by (lora_flops.full_step_flops: 6 · N · tokens + causal attention).
  long_context_results.py summary OUT_DIR [MORE_DIRS...]
      every case's two arms (<case>-loom.json, <case>-torch.json) under the folders into
      OUT_DIR/long-context-h200.json (commit it as bench/results/<date>-long-context-h200.json)
      with the issue's `summary` and whether it meets the issue's target (loom ≥ 1.15× the
      baseline at 32k). Where the baseline ran a shorter length than asked (it did not fit),
      its ratio is left out and its longest fitting length reported."""
import datetime, glob, json, os, statistics, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "baselines"))
from lora_flops import PEAK, full_step_flops  # noqa: E402

CASES = {"8b-32k": "qwen3-8b-32k", "8b-64k": "qwen3-8b-64k", "1.7b-128k": "qwen3-1.7b-128k"}  # file -> summary key


def arm(metrics, warmup, config, row_tokens):
    try:
        m = [x for x in map(json.loads, open(metrics)) if "step_time_s" in x]
    except OSError:
        return {"error": f"no metrics at {metrics}"}
    timed = [x for x in m if x["step"] > warmup]
    if not timed:
        return {"error": f"no step after step {warmup}", "steps": len(m)}
    t = statistics.median(x["step_time_s"] for x in timed)
    rows = int(statistics.median(x["tokens"] for x in timed)) // row_tokens
    n = full_step_flops(json.load(open(config)), rows, row_tokens)
    return {"impl": "loom", "row_tokens": row_tokens, "rows_per_step": rows, **n,
            "step_s": [round(x["step_time_s"], 4) for x in timed], "median_step_s": round(t, 4),
            "tokens_per_s": round(statistics.median(x["tokens_per_s_per_gpu"] for x in timed), 1),
            "model_tflops": round(n["flops"] / t / 1e12, 1), "mfu": round(n["flops"] / t / PEAK, 4),
            "peak_mem_gib": round(max(x["max_mem_gib"] for x in m), 2), "losses": [round(x["loss"], 5) for x in m]}


def summary(dirs):
    runs, meta = {}, {"gpu.txt": [], "power.txt": [], "loom-version.txt": []}
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*-loom.json")) + glob.glob(os.path.join(d, "*-torch.json"))):
            try:
                runs[os.path.basename(path)[:-5]] = json.loads(open(path).read().strip().splitlines()[-1])
            except (ValueError, IndexError) as e:
                runs[os.path.basename(path)[:-5]] = {"error": f"unreadable: {e}"}
        for f, lines in meta.items():
            if os.path.exists(os.path.join(d, f)):
                lines += open(os.path.join(d, f)).read().strip().splitlines()
    s = {}
    for case, key in CASES.items():
        loom, torch = runs.get(f"{case}-loom", {}), runs.get(f"{case}-torch", {})
        lt, bt = loom.get("tokens_per_s"), torch.get("tokens_per_s")
        same_length = torch.get("row_tokens") == loom.get("row_tokens")
        s[key] = {"loom_tokens_per_s": lt, "baseline_tokens_per_s": bt if same_length else None,
                  "ratio": round(lt / bt, 3) if lt and bt and same_length else None,
                  "model_tflops": loom.get("model_tflops"), "loom_peak_gib": loom.get("peak_mem_gib"),
                  "baseline_longest_fitting_row_tokens": torch.get("row_tokens"),
                  "baseline_tokens_per_s_at_that_length": bt}
    ratio = s["qwen3-8b-32k"]["ratio"]
    res = {"benchmark": "issue 41 item 4: long rows on one GPU, loom against the compiled lean PyTorch model with "
                        "activation checkpointing (bench/baselines/long_context.py) in the same call",
           "date": datetime.date.today().isoformat(), "gpu": sorted(set(meta["gpu.txt"])),
           "loom": sorted(set(meta["loom-version.txt"])), "command": "tar xzf .devpack/devbin.tgz && bash bench/gpu/run_long_context.sh",
           "flops_note": "model FLOPs: 6 · matmul parameters (incl. lm_head) · tokens + causal attention (layers · rows · "
                         "6 · T² · heads · head_dim); recompute not counted (bench/baselines/lora_flops.py)",
           "runs": runs, "power": meta["power.txt"], "summary": s,
           "targets_met": {"qwen3-8b-32k.ratio >= 1.15": None if ratio is None else ratio >= 1.15}}
    path = os.path.join(dirs[0], "long-context-h200.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({"summary": s, "targets_met": res["targets_met"]}, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "arm":
        print(json.dumps(arm(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))))
    elif len(sys.argv) >= 3 and sys.argv[1] == "summary":
        summary(sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
