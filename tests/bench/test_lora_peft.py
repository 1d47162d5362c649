"""bench/baselines/lora_peft.py on the CPU: the tiny Qwen3 of tests/golden/tiny_lora, two steps, no
compile. Checks the JSON line run_lora.sh reads, the FLOP count against a hand count, the first
step's loss against transformers' own loss of the same model, that only the adapters train, and
the rows file's loss mask. Exits 77 (CTest: skipped) where this Python lacks torch, transformers
or peft: LOOM_PYTHON names one that has them (scripts/test.sh sets it)."""
import argparse, json, math, os, subprocess, sys, tempfile

try:
    import torch, transformers, peft  # noqa: F401
except ImportError as e:
    print(f"SKIPPED: this Python ({sys.executable}) cannot import {e.name}: set LOOM_PYTHON to one with "
          "torch, transformers and peft", flush=True)
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "baselines", "lora_peft.py")
CONFIG = os.path.join(ROOT, "tests", "golden", "tiny_lora", "model", "config.json")
sys.path.insert(0, os.path.dirname(SCRIPT))
import lora_peft  # noqa: E402

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


# 1. The command line: one JSON line with the fields run_lora.sh reads.
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "r.json")
    proc = subprocess.run([sys.executable, SCRIPT, "--config", CONFIG, "--device", "cpu", "--compile", "none",
                           "--warmup", "0", "--steps", "2", "--rows", "2", "--row-tokens", "64", "--json", out],
                          capture_output=True, text=True, timeout=600)
    check(proc.returncode == 0, f"lora_peft.py exits 0 (rc {proc.returncode}; stderr ends {proc.stderr[-400:]!r})")
    r = json.loads(open(out).read()) if os.path.exists(out) else {}
stdout_line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
check(json.loads(stdout_line) == r, "the JSON on stdout is the one written to --json")
check(len(r.get("step_s", [])) == 2 and all(t > 0 for t in r["step_s"]), "two timed steps")
check(r.get("tokens") == 128 and r.get("tokens_per_s", 0) > 0, "128 tokens a step, tokens/s above 0")
check(r.get("compile") == "none" and r.get("grad_ckpt") is False and r.get("attempts") == [], "ran eager, first try")
losses = r.get("losses", [])
check(len(losses) == 2 and all(math.isfinite(x) for x in losses) and abs(losses[0] - math.log(128)) < 0.3,
      f"finite losses near ln(vocab) = {math.log(128):.3f}: {losses}")

# 2. The FLOP count by hand for the tiny config (hidden 64, 2 layers, 4 q / 2 kv heads of 32, ffn 96,
#    vocab 128), rank 16, all seven targets, 2 rows of 64 tokens.
base_layer = 64 * 128 + 2 * 64 * 64 + 128 * 64 + 3 * 64 * 96          # q, k, v, o, gate, up, down
adapter_layer = 16 * ((64 + 128) + 2 * (64 + 64) + (128 + 64) + 3 * (64 + 96))
n_base, n_adapter = 2 * base_layer + 128 * 64, 2 * adapter_layer
attention = 2 * 2 * 6 * 64 * 64 * (4 * 32)
expect = dict(n_base_matmul=n_base, n_adapter=n_adapter, flops_base=4 * n_base * 128,
              flops_adapter=6 * n_adapter * 128, flops_attention=attention,
              flops=4 * n_base * 128 + 6 * n_adapter * 128 + attention)
check(all(r.get(k) == v for k, v in expect.items()), f"FLOP count {dict((k, r.get(k)) for k in expect)} == {expect}")

# 3. In process: step 1's loss (fused linear + CE) against transformers' loss of the same model, and a
#    step that moves the adapters and no base weight.
a = argparse.Namespace(rank=16, alpha=32.0, targets=lora_peft.TARGETS, dropout=0.0, rows=2, row_tokens=64, data=None,
                       ce_chunk=48)  # a chunk that does not divide the 128 tokens
raw, cfg = lora_peft.read_config(CONFIG)
dev = torch.device("cpu")
model, opt, trainable = lora_peft.build(a, cfg, dev)
model.train()
ids, labels = lora_peft.make_batch(a, raw["vocab_size"], dev)
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    hf_loss = float(model(input_ids=ids, labels=ids).loss)
frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
trunk, head = lora_peft.trunk_of(model)
a.ce_chunk = 48
loss = float(lora_peft.train_step(trunk, head, opt, trainable, ids, labels, a, lora_peft.ce_chunk))
check(abs(loss - hf_loss) < 2e-3 * hf_loss, f"step 1 loss {loss:.6f} == transformers' {hf_loss:.6f} (rel 2e-3)")
check(abs(loss - losses[0]) < 1e-5 * loss if losses else False, "the command line's step 1 loss is the same model's")
check(len(adapters) == 2 * 7 * 2 and all(("lora_A" in n or "lora_B" in n) for n in adapters),
      f"the trainable tensors are the 28 lora_A/lora_B of 2 layers x 7 targets ({len(adapters)})")
check(all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if not p.requires_grad),
      "no base weight moved")
b_moved = all(bool(p.abs().max() > 0) for n, p in model.named_parameters() if "lora_B" in n)
decay = 1.0 - 1e-5 * 0.1  # lr · weight_decay: AdamW's decoupled decay, the only change of a zero-gradient A
a_decayed = all(float((p - adapters[n] * decay).abs().max()) <= 1e-7 * float(adapters[n].abs().max())
                for n, p in model.named_parameters() if "lora_A" in n)
check(b_moved and a_decayed, "step 1 moves every lora_B off zero; each lora_A (zero gradient while B is zero) only decays")

# 4. Rows from bench/gpu/make_rows.py: target t+1 counts where loss_mask[t+1] is 1.
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "rows.jsonl")
    with open(path, "w") as f:
        for k in range(2):
            f.write(json.dumps({"tokens": [(7 * t + k) % 128 for t in range(64)],
                                "loss_mask": [0] + [int(t % 2 == 0) for t in range(1, 64)]}) + "\n")
    a.data = path
    ids, labels = lora_peft.make_batch(a, 128, dev)
    lab = labels.view(2, 64)
    ok = all(int(lab[k, t]) == (int(ids[k, t + 1]) if (t + 1) % 2 == 0 else -100) for k in range(2) for t in range(63))
    check(ok and bool((lab[:, 63] == -100).all()), "labels from a rows file follow its loss mask")
    with open(path, "a") as f:  # a third row one token short
        f.write(json.dumps({"tokens": [1] * 63, "loss_mask": [1] * 63}) + "\n")
    bad = subprocess.run([sys.executable, SCRIPT, "--config", CONFIG, "--device", "cpu", "--compile", "none",
                          "--rows", "3", "--row-tokens", "64", "--data", path], capture_output=True, text=True, timeout=600)
    check(bad.returncode == 2 and f"{path}:3: field 'tokens'" in bad.stderr,
          f"a short row is refused naming its line and field (rc {bad.returncode})")

# 5. Out of memory (made up: the first try raises it), the baseline runs a row a step before it
#    turns to gradient checkpointing, and says why.
real_attempt = lora_peft.run_attempt


def attempt_without_room(a_, raw_, cfg_, dev_, ids_, labels_, how, rows, ckpt):
    if rows == 2 and not ckpt:
        raise torch.OutOfMemoryError("CUDA out of memory (made up by the test)")
    return real_attempt(a_, raw_, cfg_, dev_, ids_, labels_, how, rows, ckpt)


lora_peft.run_attempt = attempt_without_room
b = argparse.Namespace(config=CONFIG, layers=0, rows=2, row_tokens=64, data=None, warmup=0, steps=1, rank=16, alpha=32.0,
                       targets=lora_peft.TARGETS, dropout=0.0, compile="none", mode=None, grad_ckpt="auto", attn="flash",
                       ce_chunk=4096)
r = lora_peft.bench(b, dev)
check(r.get("rows") == 1 and r.get("grad_ckpt") is False and r.get("tokens") == 64
      and [(x["rows"], x["grad_ckpt"]) for x in r.get("attempts", [])] == [(2, False)]
      and "out of memory" in r["attempts"][0]["error"], f"out of memory: a row a step, no checkpointing ({r.get('attempts')})")
lora_peft.run_attempt = real_attempt

print(f"{len(failures)} failed" if failures else "all passed", flush=True)
sys.exit(1 if failures else 0)
