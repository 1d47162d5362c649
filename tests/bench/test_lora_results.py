"""bench/gpu/lora_results.py on made-up metrics (no torch needed): a loom arm's median over the
steps after the warmup, its TFLOP/s by lora_flops' count, and the summary's ratios and targets."""
import json, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "bench", "gpu", "lora_results.py")
sys.path.insert(0, os.path.join(ROOT, "bench", "baselines"))
from lora_flops import TARGETS, counts  # noqa: E402

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def metrics(path, times, rows):
    with open(path, "w") as f:
        for i, t in enumerate(times, 1):
            f.write(json.dumps({"step": i, "loss": 12.0 - i, "grad_norm": 1.0, "lr": 1e-5, "tokens": rows * 8192,
                                "step_time_s": t, "tokens_per_s_per_gpu": rows * 8192 / t, "mfu": 0.4,
                                "max_mem_gib": 60.0 + i}) + "\n")


def arm(*args):
    return json.loads(subprocess.run([sys.executable, TOOL, "arm", *args], capture_output=True, text=True,
                                     check=True).stdout)


config8 = os.path.join(ROOT, "recipes", "qwen3-8b", "config.json")
config32 = os.path.join(ROOT, "recipes", "qwen3-32b", "config.json")
raw8, raw32 = json.load(open(config8)), json.load(open(config32))
with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
    metrics(f"{a}/lora8.jsonl", [30.0, 10.0, 12.0, 11.0], 16)       # step 1 (warmup) slow: left out
    metrics(f"{a}/full8.jsonl", [30.0, 20.0, 20.0], 16)
    metrics(f"{b}/lora32.jsonl", [30.0, 16.0, 16.0], 4)
    lora8 = arm("lora8", f"{a}/lora8.jsonl", "1", config8, "16")
    full8 = arm("full8", f"{a}/full8.jsonl", "1", config8, "16", "full")
    lora32 = arm("lora32", f"{b}/lora32.jsonl", "1", config32, "16")
    n8, n32 = counts(raw8, 16, TARGETS, 16, 8192), counts(raw32, 16, TARGETS, 4, 8192)
    check(lora8["step_s"] == [10.0, 12.0, 11.0] and lora8["median_step_s"] == 11.0, "the median over steps 2-4")
    check(lora8["tokens_per_s"] == round(16 * 8192 / 11.0, 1), f"tokens/s {lora8['tokens_per_s']}")
    check(lora8["tflops_per_s"] == round(n8["flops"] / 11.0 / 1e12, 1) and lora8["n_adapter"] == 36 * 16 * (
        (4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 3 * (4096 + 12288)), "8B LoRA TFLOP/s by the LoRA count")
    check(full8["flops"] == 6 * n8["n_base_matmul"] * 16 * 8192 + n8["flops_attention"] and "n_adapter" not in full8,
          "full fine-tuning counts 6 · base + attention, no adapters")
    check(lora32["peak_mem_gib"] == 63.0 and lora32["tflops_per_s"] == round(n32["flops"] / 16.0 / 1e12, 1),
          f"32B peak {lora32['peak_mem_gib']} GiB, {lora32['tflops_per_s']} TFLOP/s")
    for d, r in ((a, lora8), (a, full8), (b, lora32)):
        with open(f"{d}/{r['arm']}-1.json", "w") as f:
            f.write(json.dumps(r) + "\n")
    with open(f"{a}/peft8-1.json", "w") as f:
        f.write(json.dumps({"tokens_per_s": 5000.0, "tflops_per_s": 300.0}) + "\n")
    with open(f"{a}/peft8-2.json", "w") as f:
        f.write(json.dumps({"tokens_per_s": 7000.0, "tflops_per_s": 300.0}) + "\n")
    subprocess.run([sys.executable, TOOL, "summary", a, b], capture_output=True, check=True)
    res = json.load(open(f"{a}/lora-h200.json"))
    s = res["summary"]
    check(s["qwen3-8b"]["peft_tokens_per_s"] == 6000.0, "the median over an arm's rounds (5,000 and 7,000)")
    check(s["qwen3-8b"]["ratio_vs_peft"] == round(lora8["tokens_per_s"] / 6000.0, 3)
          and s["qwen3-8b"]["ratio_vs_full"] == round(lora8["tokens_per_s"] / full8["tokens_per_s"], 3),
          f"ratios {s['qwen3-8b']}")
    check(s["qwen3-32b"]["model_tflops"] == lora32["tflops_per_s"] and s["qwen3-32b"]["fp8_model_tflops"] is None,
          "32B: the bf16 arm's TFLOP/s, no fp8 arm")
    met = res["targets_met"]
    check(met["qwen3-32b.fp8_model_tflops >= 900"] is None and met["qwen3-8b.ratio_vs_peft >= 1.5"]
          == (s["qwen3-8b"]["ratio_vs_peft"] >= 1.5), f"targets {met}")
    check(sorted(res["runs"]) == sorted([f"{os.path.basename(a)}/{n}" for n in ("lora8-1", "full8-1", "peft8-1", "peft8-2")]
                                        + [f"{os.path.basename(b)}/lora32-1"]), "every run kept, named by folder")
bad = subprocess.run([sys.executable, TOOL, "nonsense"], capture_output=True, text=True)
check(bad.returncode == 2 and "summary OUT_DIR" in bad.stderr, "a bad command exits 2 with the usage on stderr")
print(f"{len(failures)} failed" if failures else "all passed", flush=True)
sys.exit(1 if failures else 0)
