"""The PyTorch baseline for long rows on one GPU (issue 41 item 4): torch_lean_baseline.py's model
(fused QKV and gate/up linears, F.rms_norm, SDPA with GQA: flash attention at these lengths, each
block torch.compile'd) with every block's activations checkpointed (torch.utils.checkpoint,
non-reentrant: a block's input kept, the rest recomputed in the backward), the embedding's output
cast to bf16 so the kept inputs are bf16 as loom's are, bf16 autocast over fp32 master weights,
the fused linear + cross entropy of fused_linear_ce.py (no [tokens, vocab] logits kept) and fused
AdamW. One row a micro-batch, ROWS micro-batches a step (gradients accumulated), the optimizer
each step.

A length that does not fit is retried at half the length until one fits, and the JSON says which
length ran (`row_tokens`) against which was asked (`asked_row_tokens`): the issue reports the
baseline's longest fitting length where it cannot run loom's.

  python3 long_context.py --config recipes/qwen3-8b/config.json --row-tokens 32768 [--rows 2]
                          [--warmup 2] [--steps 3] [--compile auto|on|off] [--json OUT.json] [--device cuda]

Model FLOPs (full_step_flops, shared with bench/gpu/long_context_results.py): 6 · N · tokens (N:
matmul weights incl. the lm_head) + the causal half of attention, 6 · layers · row_tokens ·
heads · head_dim a token (QKᵀ and PV, forward and backward); recompute is not counted."""
import argparse, json, os, statistics, sys, time, traceback

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_lean_baseline as lean  # noqa: E402
from fused_linear_ce import FusedLinearCE, ce_chunk  # noqa: E402
from lora_flops import PEAK, full_step_flops  # noqa: E402


def register(config):
    """torch_lean_baseline's name for a Qwen3 config.json's model (head_dim 128, its vocabulary)."""
    c = json.load(open(config))
    if c.get("head_dim", 128) != lean.HD or c.get("vocab_size", lean.V) != lean.V:
        sys.exit(f"{config}: expected head_dim {lean.HD} and vocab_size {lean.V} (torch_lean_baseline's Qwen3)")
    name = os.path.basename(os.path.dirname(os.path.abspath(config))) or "config"
    lean.CFGS[name] = (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"],
                       c["intermediate_size"], bool(c.get("tie_word_embeddings", False)))
    return name, c


class CheckpointedModel(lean.Model):
    """lean.Model (its blocks compiled in place) with each block checkpointed and the loss
    through FusedLinearCE; `compiled` False undoes the blocks' compile (eager)."""

    def __init__(self, name, compiled):
        super().__init__(name)
        self.ce_fn = torch.compile(ce_chunk) if compiled else ce_chunk
        if not compiled:
            for b in self.blocks:
                b._compiled_call_impl = None  # what nn.Module.compile() set

    def forward(self, ids, chunk=4096):
        _, t = ids.shape
        inv = lean.inv_freq(self.hd, self.theta, self.scaling, ids.device)
        fr = torch.outer(torch.arange(t, device=ids.device, dtype=torch.float32), inv)
        fr = torch.cat((fr, fr), -1)
        cos, sin = fr.cos().to(torch.bfloat16), fr.sin().to(torch.bfloat16)
        x = self.emb(ids).to(torch.bfloat16)
        for b in self.blocks:
            x = checkpoint(b, x, cos, sin, use_reentrant=False)
        x = F.rms_norm(x, (x.shape[-1],), self.nf, self.eps)[:, :-1].reshape(-1, x.shape[-1])
        w = self.emb.weight if self.head is None else self.head.weight
        return FusedLinearCE.apply(x, w, ids[:, 1:].reshape(-1), chunk, self.ce_fn)


def run_length(name, config, row_tokens, args, compiled):
    torch.manual_seed(0)
    m = CheckpointedModel(name, compiled).to(args.device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5, betas=(0.9, 0.98), weight_decay=0.1,
                            fused=args.device == "cuda")
    vocab = lean.family(name)[1]
    gen = torch.Generator(device="cpu").manual_seed(1)
    rows = [torch.randint(0, vocab - 256, (1, row_tokens), generator=gen).to(args.device) for _ in range(args.rows)]
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        total = 0.0
        for ids in rows:
            with torch.autocast(args.device, dtype=torch.bfloat16):
                loss = m(ids) / len(rows)
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(round(float(total), 5))
    t = statistics.median(times[args.warmup:])
    tokens = args.rows * row_tokens
    flops = full_step_flops(config, args.rows, row_tokens)["flops"]
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None
    return dict(model=name, impl="pytorch-lean-compiled-checkpointed" if compiled else "pytorch-lean-eager-checkpointed",
                compiled=compiled, row_tokens=row_tokens, rows_per_step=args.rows, step_s=[round(x, 4) for x in times],
                median_step_s=round(t, 4), tokens_per_s=round(tokens / t, 1), model_tflops=round(flops / t / 1e12, 1),
                mfu=round(flops / t / PEAK, 4), peak_mem_gib=None if peak is None else round(peak, 2), losses=losses,
                torch=torch.__version__)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="a Qwen3 config.json")
    p.add_argument("--row-tokens", type=int, required=True)
    p.add_argument("--rows", type=int, default=2, help="rows (micro-batches of one row) a step")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--min-row-tokens", type=int, default=4096, help="stop halving below this length")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json")
    args = p.parse_args()
    name, config = register(args.config)
    row_tokens, result, failures = args.row_tokens, None, []
    compiled = args.compile != "off"
    while row_tokens >= args.min_row_tokens:
        try:
            result = run_length(name, config, row_tokens, args, compiled)
            break
        except torch.OutOfMemoryError as e:
            failures.append({"row_tokens": row_tokens, "error": str(e).splitlines()[0][:300]})
            print(f"{row_tokens} tokens a row: out of memory, trying {row_tokens // 2}", file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
            row_tokens //= 2
        except Exception:  # compilation fails at the first step; `auto` falls back to eager once
            if not (compiled and args.compile == "auto"):
                raise
            print("compiled blocks failed, eager instead:\n" + traceback.format_exc(limit=4), file=sys.stderr, flush=True)
            compiled = False
    out = {"asked_row_tokens": args.row_tokens, "fits": result is not None and row_tokens == args.row_tokens,
           "out_of_memory_at": failures, **(result or {"error": "no length fits"})}
    print(json.dumps(out), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
