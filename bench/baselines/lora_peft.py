"""The PyTorch anchor for LoRA SFT (issue 40 item 6): what a user picks for LoRA on one GPU,
transformers + PEFT, made as fast as plain PyTorch allows, on the work loom's LoRA recipes do.

  model      Qwen3ForCausalLM from a config.json (--config: recipes/qwen3-8b/config.json,
             recipes/qwen3-32b/config.json), random init made on the device (no download), bf16
             weights, SDPA attention (--attn flash: the flash backend alone, enable_gqa; auto: let
             PyTorch pick).
  adapters   peft.LoraConfig(r=16, lora_alpha=32, all seven targets q/k/v/o/gate/up/down_proj,
             lora_dropout 0): PEFT's default init (A Kaiming-uniform, B zero), adapters kept in fp32
             (get_peft_model's autocast_adapter_dtype), the step under bf16 autocast (HF Trainer's
             bf16=True): bf16 GEMMs with fp32 master adapters.
  loss       fused linear + cross entropy (fused_linear_ce.py, shared with moe_slice.py): chunks of
             --ce-chunk tokens, per-token mean over the supervised targets, no [tokens, vocab]
             tensor kept, no dW GEMM for the frozen lm_head.
  optimizer  torch.optim.AdamW(fused=True) over the adapters alone (lr 1e-5, betas 0.9/0.98, decay
             0.1 on every adapter: all are 2-D), clip_grad_norm_(1.0) over them.
  compile    --compile auto tries torch.compile of the whole trunk (embedding .. final norm,
             fullgraph=False: HF's mask helpers may break the graph), then each decoder layer on its
             own (regional compilation: one graph shared by the identical layers), then eager; the
             loss chunk is compiled whenever the trunk is. The JSON says which ran ("compile") and,
             under "attempts", what failed before it and why. (transformers' mask helpers may build
             the causal mask as a tensor while dynamo traces them, which the flash backend refuses:
             the whole-trunk try then fails early and the per-layer compile, whose mask is made
             eagerly and skipped for is_causal, runs flash. --attn auto would instead let the
             whole trunk run a slower masked kernel.)
  memory     --grad-ckpt auto runs without activation checkpointing; out of GPU memory, it runs a row
             a step (the same work a token), and if that does not fit either, --rows rows with HF's
             (non-reentrant) gradient checkpointing; on|off force it at --rows rows.
  data       --rows rows of --row-tokens tokens a step (2 × 8,192), one micro-batch: random ids
             (seeded), every next token a target; or --data ROWS.jsonl (bench/gpu/make_rows.py's
             rows, what loom trains on: target t+1 counts where loss_mask[t+1] is 1).

Model FLOPs a step: lora_flops.py's count, 4 · base matmul parameters · tokens + 6 · adapter
parameters · tokens + causal attention (issue 40's, the one loom's LoRA arms are divided by).
tflops_per_s counts all three (recomputed activations not counted); mfu is that over 989e12.

usage:
  python3 lora_peft.py --config recipes/qwen3-8b/config.json [--rows 2] [--row-tokens 8192]
         [--warmup 3] [--steps 6] [--compile auto|model|layers|none] [--mode default]
         [--grad-ckpt auto|on|off] [--data ROWS.jsonl] [--json PATH] [--device cuda|cpu]
One JSON line on stdout (and in --json PATH, else $OUT/lora_peft.json when OUT is set).
"""
import argparse, gc, json, math, os, statistics, sys, time, traceback
import torch
from fused_linear_ce import FusedLinearCE, ce_chunk
from lora_flops import PEAK, TARGETS, counts


def read_config(path):
    """config.json (a file or the folder holding it) as a dict and as transformers' config."""
    from transformers import AutoConfig
    path = os.path.join(path, "config.json") if os.path.isdir(path) else path
    with open(path) as f:
        raw = json.load(f)
    return raw, AutoConfig.from_pretrained(path)


def bad_input(what):
    print(f"lora_peft: {what}", file=sys.stderr)
    sys.exit(2)


def make_batch(a, vocab, dev):
    """ids [rows, T] and labels [rows·T] (the next token, -100 where it is not a target)."""
    if a.data:
        recs = []
        with open(a.data) as f:
            for number, line in zip(range(1, a.rows + 1), f):
                r = json.loads(line)
                for key in ("tokens", "loss_mask"):
                    if not isinstance(r.get(key), list) or len(r[key]) != a.row_tokens:
                        bad_input(f"{a.data}:{number}: field '{key}': expected a list of {a.row_tokens} (--row-tokens)")
                recs.append(r)
        if len(recs) < a.rows:
            bad_input(f"{a.data}: {len(recs)} rows, expected at least {a.rows} (--rows)")
        ids = torch.tensor([r["tokens"] for r in recs])
        mask = torch.tensor([r["loss_mask"] for r in recs], dtype=torch.bool)
    else:
        g = torch.Generator().manual_seed(7)
        ids = torch.randint(0, min(vocab, 151643), (a.rows, a.row_tokens), generator=g)
        mask = torch.ones_like(ids, dtype=torch.bool)
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = torch.where(mask[:, 1:], ids[:, 1:], -100)
    return ids.to(dev), labels.reshape(-1).to(dev)


def build(a, cfg, dev):
    """The bf16 base, random init on `dev`, with PEFT's LoRA adapters; the optimizer over them."""
    import peft
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    with torch.device(dev):
        base = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    base.config.use_cache = False
    lora = peft.LoraConfig(r=a.rank, lora_alpha=a.alpha, target_modules=a.targets, lora_dropout=a.dropout,
                           bias="none", task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, lora)  # adapters upcast to fp32 (autocast_adapter_dtype)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-5, betas=(0.9, 0.98), weight_decay=0.1, fused=True)
    return model, opt, trainable


def trunk_of(model):
    """The Qwen3Model (embedding, layers, final norm) inside PEFT's wrapper, and the lm_head."""
    causal_lm = model.get_base_model()
    return causal_lm.model, causal_lm.lm_head


def compile_trunk(trunk, how, mode):
    if how == "model":
        return torch.compile(trunk, mode=mode, dynamic=False)
    if how == "layers":
        for layer in trunk.layers:
            layer.compile(mode=mode, dynamic=False)
    return trunk


def train_step(fwd, head, opt, trainable, ids, labels, a, chunk_fn):
    with torch.autocast(ids.device.type, dtype=torch.bfloat16):
        h = fwd(input_ids=ids).last_hidden_state
    loss = FusedLinearCE.apply(h.reshape(-1, h.shape[-1]), head.weight, labels, a.ce_chunk, chunk_fn)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def is_oom(e):
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def run_attempt(a, raw, cfg, dev, ids, labels, how, rows, ckpt):
    """Builds, warms up and times one way (compile, rows a step, checkpointing) on the first `rows`
    rows; returns the result dict."""
    ids, labels = ids[:rows], labels[:rows * a.row_tokens]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    chunk_fn = ce_chunk if how == "none" else torch.compile(ce_chunk, mode=a.mode, dynamic=False)
    model, opt, trainable = build(a, cfg, dev)
    try:
        trunk, head = trunk_of(model)
        if ckpt:
            model.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        fwd = compile_trunk(trunk, how, a.mode)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        losses = []
        for i in range(a.warmup):
            losses.append(float(train_step(fwd, head, opt, trainable, ids, labels, a, chunk_fn)))
            print(f"lora_peft: compile={how} grad_ckpt={ckpt} warmup step {i + 1} done at "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        sync(dev)
        warm_s = time.perf_counter() - t0
        walls, gpus = [], []
        for _ in range(a.steps):
            sync(dev)
            t0 = time.perf_counter()
            if dev.type == "cuda":
                ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ev0.record()
            loss = train_step(fwd, head, opt, trainable, ids, labels, a, chunk_fn)
            if dev.type == "cuda":
                ev1.record()
            sync(dev)
            walls.append(time.perf_counter() - t0)
            if dev.type == "cuda":
                gpus.append(ev0.elapsed_time(ev1) / 1e3)
            losses.append(float(loss))
        n = counts(raw, a.rank, a.targets, rows, a.row_tokens)
        n_trainable = sum(p.numel() for p in trainable)
        if n_trainable != n["n_adapter"]:
            raise RuntimeError(f"PEFT made {n_trainable} trainable parameters, the count says {n['n_adapter']}")
        step = statistics.median(walls)
        r = dict(what="lora sft train step", impl="transformers+peft", compile=how,
                 compile_mode=None if how == "none" else (a.mode or "default"), grad_ckpt=ckpt,
                 attention=f"sdpa ({a.attn})", precision="bf16 base, fp32 adapters, bf16 autocast",
                 rank=a.rank, alpha=a.alpha, targets=a.targets, dropout=a.dropout,
                 optimizer="AdamW(fused=True) over the adapters, fp32 state",
                 loss_impl=f"fused linear+CE, chunks of {a.ce_chunk} tokens (dX in forward, frozen lm_head)",
                 layers=raw["num_hidden_layers"], rows=rows, row_tokens=a.row_tokens,
                 data=a.data or "random ids, seed 7", **n,
                 step_s=[round(t, 5) for t in walls], step_gpu_s=[round(t, 5) for t in gpus],
                 median_step_s=round(step, 5), tokens_per_s=round(n["tokens"] / step, 1),
                 tflops_per_s=round(n["flops"] / step / 1e12, 1), mfu=round(n["flops"] / step / PEAK, 4),
                 warmup_steps=a.warmup, warmup_s=round(warm_s, 1), losses=[round(x, 5) for x in losses],
                 graph_breaks=sum(torch._dynamo.utils.counters["graph_break"].values()))
        if dev.type == "cuda":
            r["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        return r
    finally:
        del model, opt, trainable
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def bench(a, dev):
    if dev.type == "cuda" and a.attn == "flash":
        from moe_slice import set_attention_backend
        set_attention_backend("flash", dev)
    raw, cfg = read_config(a.config)
    if a.layers:
        raw["num_hidden_layers"] = a.layers
        cfg.num_hidden_layers = a.layers
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = cfg.layer_types[:a.layers]
    ids, labels = make_batch(a, raw["vocab_size"], dev)
    hows = {"auto": ["model", "layers", "none"]}.get(a.compile, [a.compile])
    # Out of memory, a user first halves the micro-batch (a row a step: the same work a token), and
    # only then recomputes activations.
    fits = {"auto": [(a.rows, False)] + ([(1, False)] if a.rows > 1 else []) + [(a.rows, True)],
            "on": [(a.rows, True)], "off": [(a.rows, False)]}[a.grad_ckpt]
    attempts, failed = [], set()
    for how in hows:
        for rows, ckpt in fits:
            if how in failed:
                break
            try:
                r = run_attempt(a, raw, cfg, dev, ids, labels, how, rows, ckpt)
                r["attempts"] = attempts
                return r
            except Exception as e:  # noqa: BLE001 - record why, then the next way
                attempts.append(dict(compile=how, rows=rows, grad_ckpt=ckpt, error=repr(e)[:400]))
                traceback.print_exc(file=sys.stderr)
                if not is_oom(e):
                    failed.add(how)
                print(f"lora_peft: compile={how} rows={rows} grad_ckpt={ckpt} failed "
                      f"({'out of memory' if is_oom(e) else 'error'}), trying the next", file=sys.stderr, flush=True)
    return dict(what="lora sft train step", error="every way failed", attempts=attempts)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="a config.json, or the folder holding one")
    p.add_argument("--layers", type=int, default=0, help="keep this many decoder layers (0: the config's)")
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--row-tokens", type=int, default=8192)
    p.add_argument("--data", default=None, help="rows from bench/gpu/make_rows.py instead of random ids")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32.0)
    p.add_argument("--targets", nargs="+", default=TARGETS)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--compile", default="auto", choices=["auto", "model", "layers", "none"])
    p.add_argument("--mode", default="default", help="torch.compile mode ('default' for the default)")
    p.add_argument("--grad-ckpt", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--attn", default="flash", choices=["flash", "auto"])
    p.add_argument("--ce-chunk", type=int, default=4096)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None, help="also write the JSON line here (default: $OUT/lora_peft.json if OUT is set)")
    a = p.parse_args()
    a.mode = None if a.mode == "default" else a.mode
    dev = torch.device(a.device)
    r = bench(a, dev)
    import peft, transformers
    r.update(config=os.path.abspath(a.config), torch=torch.__version__, transformers=transformers.__version__,
             peft=peft.__version__, gpu=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu")
    line = json.dumps(r)
    print(line, flush=True)
    path = a.json or (os.path.join(os.environ["OUT"], "lora_peft.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            f.write(line + "\n")
    if "error" in r or not all(math.isfinite(x) for x in r["losses"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
