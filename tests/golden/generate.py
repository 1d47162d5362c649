#!/usr/bin/env python3
"""Writes the golden fixtures loom's CPU fp32 reference must reproduce (tests/golden/<case>/).

Each case is a small random Qwen3 model (Hugging Face transformers, fp32, eager attention),
8 rows of tokens and loss masks, and a 6-step training run with the loss, AdamW, LR schedule
and grad clip of docs/numerics.md, implemented here in plain torch (not
torch.optim). README.md in this folder documents every file and formula.

Run: python3 tests/golden/generate.py [--out DIR] [--check]
  --check also trains an independent Qwen3 written from docs/numerics.md (fp32 and fp64) and
  HF's own loss path, and prints how far each lands from the fixtures (the tolerances in
  README.md). It writes nothing extra.

Works with transformers >= 4.51 (Qwen3 classes) and 5.x. Deterministic: the weights come
from a torch.Generator, not from transformers' init code, and torch runs on one thread.
"""
import argparse
import inspect
import json
import math
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import save_file
import transformers
from transformers.utils import logging as transformers_logging

# The recipe shared by both cases; clip_grad is per case so that clipping triggers on some
# steps but not all (see the trace's "clipped").
RECIPE = {
    "global_batch": 4,
    "steps": 6,
    "lr": 1e-3,
    "min_lr": 1e-4,
    "decay": "cosine",
    "warmup_fraction": 0.2,
    "weight_decay": 0.1,
    "beta1": 0.9,
    "beta2": 0.98,
    "eps": 1e-8,
}

CASES = {
    # q heads x head_dim = 128 != hidden 64; GQA 2 q heads per kv head; theta 1e4 makes
    # RoPE angles large at positions < 24.
    "tiny_untied": {
        "seed": 1001,
        "num_rows": 8,
        "row_tokens": 24,
        "clip_grad": 2.6,
        "model": {
            "vocab_size": 128,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "tie_word_embeddings": False,
            "rope_theta": 10000.0,
        },
    },
    # One kv head for 4 q heads; lm_head tied to the embedding.
    "tiny_tied": {
        "seed": 2002,
        "num_rows": 8,
        "row_tokens": 20,
        "clip_grad": 2.2,
        "model": {
            "vocab_size": 96,
            "hidden_size": 48,
            "intermediate_size": 80,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "tie_word_embeddings": True,
            "rope_theta": 1000000.0,
        },
    },
    # Llama 3's block (no q/k norm) with its RoPE scaling: theta 100 at head_dim 16 puts the
    # 8 frequencies' wavelengths at 6.3 (high: kept), 11.2 (medium: blended) and 19.9 to 353
    # (low: divided by the factor) against an original context of 16 < row_tokens 24 (low
    # band wavelength 16, high band 8). rms_norm_eps 1e-5 as Llama's.
    "tiny_llama": {
        "family": "llama",
        "seed": 3003,
        "num_rows": 8,
        "row_tokens": 24,
        "clip_grad": 2.0,
        "model": {
            "vocab_size": 112,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "tie_word_embeddings": False,
            "rope_theta": 100.0,
            "rms_norm_eps": 1e-5,
            "rope_scaling": {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 2.0,
                             "original_max_position_embeddings": 16},
        },
    },
    # Qwen2's block: q/k/v biases, no q/k norm; tied as Qwen2.5 up to 3B; head_dim from
    # hidden / heads (Qwen2's config has no head_dim).
    "tiny_qwen2": {
        "family": "qwen2",
        "seed": 4004,
        "num_rows": 8,
        "row_tokens": 20,
        "clip_grad": 2.3,
        "model": {
            "vocab_size": 96,
            "hidden_size": 64,
            "intermediate_size": 80,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
            "rope_theta": 1000000.0,
        },
    },
}

# The transformers classes of each family (model_type).
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
}

NORM_SUFFIXES = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight",
                 "k_norm.weight", "model.norm.weight")


# ---------------------------------------------------------------------------------------
# Data


def make_masks(num_rows, length, gen):
    """Loss masks with the patterns docs/numerics.md's edge cases need (rows 0-3 form step 1)."""
    if num_rows != 8 or length < 20:
        raise ValueError("the mask patterns are written for 8 rows of >= 20 tokens")

    def runs(*pattern):  # (value, count) pairs, the last run filling the row
        mask = []
        for value, count in pattern:
            mask += [value] * count
        return (mask + [pattern[-1][0]] * length)[:length]

    return [
        runs((0, 4), (1, 6), (0, 5), (1, length)),  # chat: prompt, answer, prompt, answer
        [0] * length,  # no target at all: n_r = max(0, 1) = 1
        runs((1, 3), (0, 6), (1, 5), (0, length)),  # mask[0] = 1 has no predictor
        [1] * length,  # every position; the target count is length - 1
        [1] + [0] * (length - 1),  # only position 0 set: no target, n_r = 1
        runs((0, 3), (1, 4), (0, 2), (1, 5), (0, 3), (1, length)),  # multi-turn
        [0] * (length - 1) + [1],  # a single target, the last token
        (torch.rand(length, generator=gen) < 0.5).long().tolist(),  # scattered
    ]


def make_rows(case, gen):
    vocab = case["model"]["vocab_size"]
    n, length = case["num_rows"], case["row_tokens"]
    tokens = torch.randint(0, vocab, (n, length), generator=gen).tolist()
    masks = make_masks(n, length, gen)
    return [{"tokens": t, "loss_mask": m} for t, m in zip(tokens, masks)]


def load_rows(path):
    """rows.jsonl -> (tokens [R, T] int64, loss_mask [R, T] int64); all rows one length."""
    tokens, masks = [], []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if len(row["tokens"]) != len(row["loss_mask"]):
                raise ValueError(f"{path}:{line_no}: tokens and loss_mask differ in length")
            tokens.append(row["tokens"])
            masks.append(row["loss_mask"])
    if not tokens or any(len(t) != len(tokens[0]) for t in tokens):
        raise ValueError(f"{path}: expected one or more rows, all of one length")
    return torch.tensor(tokens, dtype=torch.int64), torch.tensor(masks, dtype=torch.int64)


# ---------------------------------------------------------------------------------------
# Loss and schedule (docs/numerics.md)


def row_nll(logits, tokens, loss_mask):
    """Per-row summed nll and target count: logits [R, T, V] -> (nll [R], n [R]).

    The logit at t predicts tokens[t+1] with weight loss_mask[t+1]; log-softmax in the
    logits' dtype (fp32 for the fixtures); n_r = max(sum_t mask[t+1], 1)."""
    logp = torch.log_softmax(logits[:, :-1, :], dim=-1)
    target_logp = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    weight = loss_mask[:, 1:].to(logits.dtype)
    nll = (-target_logp * weight).sum(dim=1)  # +0.0, not -0.0, for a row with no target
    n = weight.sum(dim=1).clamp(min=1.0)
    return nll, n


def lr_at(step, recipe):
    """LR of iteration `step` (from 1), counting samples: n = global_batch * (step - 1)."""
    total = recipe["steps"] * recipe["global_batch"]
    warmup = recipe["warmup_fraction"] * total
    n = recipe["global_batch"] * (step - 1)
    lr_max, lr_min = recipe["lr"], recipe["min_lr"]
    if warmup > 0 and n <= warmup:
        return lr_max * n / warmup
    if n > total:
        return lr_min
    return lr_min + 0.5 * (1.0 + math.cos(math.pi * (n - warmup) / (total - warmup))) * (lr_max - lr_min)


# ---------------------------------------------------------------------------------------
# Models


def build_hf_model(case):
    spec = dict(case["model"])
    spec.setdefault("rms_norm_eps", 1e-6)
    config_class, model_class = (getattr(transformers, n) for n in FAMILIES[case.get("family", "qwen3")])
    scaling = spec.pop("rope_scaling", None)
    if scaling:
        # 5.x takes rope_parameters (theta inside), 4.x rope_scaling beside rope_theta.
        if "rope_parameters" in inspect.signature(config_class.__init__).parameters:
            spec["rope_parameters"] = dict(scaling, rope_type="llama3", rope_theta=spec.pop("rope_theta"))
        else:
            spec["rope_scaling"] = dict(scaling, rope_type="llama3")
    config = config_class(
        **spec,
        max_position_embeddings=64,
        initializer_range=0.02,
        attention_dropout=0.0,
        sliding_window=None,  # 4.x warns about its default 4096 even when unused
        use_cache=False,
        attn_implementation="eager",
    )
    # transformers 5.x moves rope_theta into rope_parameters; check it arrived either way.
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    if theta != case["model"]["rope_theta"]:
        raise RuntimeError(f"rope_theta {theta} in the config, expected {case['model']['rope_theta']}")
    model = model_class(config).to(torch.float32).eval()
    model.config._attn_implementation = "eager"
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    if tied != spec["tie_word_embeddings"]:
        raise RuntimeError(f"lm_head tied = {tied}, expected {spec['tie_word_embeddings']}")
    return model


def init_weights(model, gen):
    """HF's distribution, from our own generator so the weights do not depend on the
    transformers version: matrices N(0, 0.02), every RMSNorm weight 1 + 0.1 N(0, 1), every
    bias 0.1 N(0, 1) (HF starts them at 0; non-zero, they shift the logits)."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith(NORM_SUFFIXES):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(model.config.initializer_range * noise)


def hf_forward(model):
    def forward(params, tokens):
        del params  # the model holds them
        positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
        return model(input_ids=tokens, position_ids=positions, use_cache=False).logits

    return forward


def reference_forward(config):
    """Qwen3 written from docs/numerics.md over a {hf_name: tensor} dict, in the tensors' dtype
    (no fp32 casts, unlike HF's RMSNorm, RoPE and eager softmax): an independent check."""
    nq, nkv = config.num_attention_heads, config.num_key_value_heads
    hd = getattr(config, "head_dim", None) or config.hidden_size // nq
    eps = config.rms_norm_eps
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    scaling = rope if rope.get("rope_type") == "llama3" else (getattr(config, "rope_scaling", None) or {})
    llama3 = scaling.get("rope_type") == "llama3"

    def frequencies(dtype):
        inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=dtype) / hd)
        if not llama3:
            return inv_freq
        # Llama 3's bands by wavelength against the original context (Meta's apply_scaling).
        context, factor = scaling["original_max_position_embeddings"], scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelength = 2 * math.pi / inv_freq
        smooth = (context / wavelength - low) / (high - low)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return torch.where(wavelength < context / high, inv_freq,
                           torch.where(wavelength > context / low, inv_freq / factor, blended))

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w

    def forward(p, tokens):
        rows, length = tokens.shape
        dtype = p["model.embed_tokens.weight"].dtype
        inv_freq = frequencies(dtype)
        angle = torch.arange(length, dtype=dtype)[:, None] * inv_freq[None, :]
        cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)

        def rotate(x):  # [rows, heads, T, hd]
            x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
            return x * cos + torch.cat([-x2, x1], dim=-1) * sin

        causal = torch.ones(length, length, dtype=torch.bool).tril()
        x = p["model.embed_tokens.weight"][tokens]
        for layer in range(config.num_hidden_layers):
            pre = f"model.layers.{layer}."
            h = rms(x, p[pre + "input_layernorm.weight"])
            def project(name, heads):
                y = h @ p[pre + f"self_attn.{name}_proj.weight"].T
                if pre + f"self_attn.{name}_proj.bias" in p:
                    y = y + p[pre + f"self_attn.{name}_proj.bias"]
                return y.view(rows, length, heads, hd)

            def norm(y, name):
                key = pre + f"self_attn.{name}_norm.weight"
                return rms(y, p[key]) if key in p else y

            q, k, v = project("q", nq), project("k", nkv), project("v", nkv)
            q = rotate(norm(q, "q").transpose(1, 2))
            k = rotate(norm(k, "k").transpose(1, 2))
            v = v.transpose(1, 2)
            # q head j reads kv head j // (nq / nkv)
            k = k.repeat_interleave(nq // nkv, dim=1)
            v = v.repeat_interleave(nq // nkv, dim=1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
            attn = (probs @ v).transpose(1, 2).reshape(rows, length, nq * hd)
            x = x + attn @ p[pre + "self_attn.o_proj.weight"].T
            h = rms(x, p[pre + "post_attention_layernorm.weight"])
            gate = h @ p[pre + "mlp.gate_proj.weight"].T
            up = h @ p[pre + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ p[pre + "mlp.down_proj.weight"].T
        x = rms(x, p["model.norm.weight"])
        head = p.get("lm_head.weight", p["model.embed_tokens.weight"])
        return x @ head.T

    return forward


# ---------------------------------------------------------------------------------------
# Training (docs/numerics.md: loss, AdamW, LR schedule, grad clip)


def train(forward, params, tokens, loss_mask, recipe):
    """Runs recipe["steps"] steps on `params` ({hf_name: leaf tensor}, updated in place).

    Returns (trace list, step-1 record {logits, nll, num_targets, grad.<name>})."""
    gb, num_rows = recipe["global_batch"], tokens.shape[0]
    b1, b2, eps, wd = recipe["beta1"], recipe["beta2"], recipe["eps"], recipe["weight_decay"]
    m = {name: torch.zeros_like(p) for name, p in params.items()}
    v = {name: torch.zeros_like(p) for name, p in params.items()}
    trace, step1 = [], None
    for step in range(1, recipe["steps"] + 1):
        index = [((step - 1) * gb + i) % num_rows for i in range(gb)]
        batch_tokens, batch_mask = tokens[index], loss_mask[index]
        logits = forward(params, batch_tokens)
        nll, n = row_nll(logits, batch_tokens, batch_mask)
        loss = nll.sum() / n.sum()
        grads = torch.autograd.grad(loss, list(params.values()))
        grads = dict(zip(params.keys(), grads))
        if step == 1:
            step1 = {"logits": logits.detach(), "nll": nll.detach(), "num_targets": n.detach()}
            step1.update({"grad." + name: g for name, g in grads.items()})
        # Per-tensor L2 norms combined, as Megatron's multi-tensor l2norm.
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
        coef = recipe["clip_grad"] / (norm.item() + 1e-6)
        clipped = coef < 1.0
        lr = lr_at(step, recipe)
        bc1, bc2 = 1.0 - b1**step, 1.0 - b2**step
        with torch.no_grad():
            for name, p in params.items():
                g = grads[name] * coef if clipped else grads[name]
                m[name] = b1 * m[name] + (1.0 - b1) * g
                v[name] = b2 * v[name] + (1.0 - b2) * (g * g)
                update = (m[name] / bc1) / (torch.sqrt(v[name] / bc2) + eps)
                if p.ndim > 1:  # no decay on 1-D (norm) weights
                    update = update + wd * p
                p.sub_(lr * update)
        trace.append({
            "step": step,
            "loss": loss.item(),
            "grad_norm": norm.item(),
            "lr": lr,
            "clipped": bool(clipped),
            "num_targets": n.sum().item(),
        })
    return trace, step1


def hf_loss_path(model, tokens, loss_mask, num_targets):
    """Step-1 loss through HF's own ForCausalLM loss (labels -100 where mask is 0, summed
    and divided by num_items_in_batch) and its grads, for the README's tolerance table."""
    labels = torch.where(loss_mask.bool(), tokens, torch.full_like(tokens, -100))
    positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
    out = model(input_ids=tokens, position_ids=positions, labels=labels, use_cache=False,
                num_items_in_batch=torch.tensor(num_targets))
    names = [name for name, _ in model.named_parameters()]
    grads = torch.autograd.grad(out.loss, [p for _, p in model.named_parameters()])
    return out.loss.detach(), dict(zip(names, grads))


# ---------------------------------------------------------------------------------------
# Output


def save_model(model, directory):
    kwargs = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True  # 4.x; 5.x writes only safetensors
    model.save_pretrained(directory, **kwargs)
    for name in os.listdir(directory):
        if name not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(directory, name))  # generation_config.json: not needed


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")


def tensors_to_save(record):
    return {name: t.detach().to(torch.float32).contiguous() for name, t in record.items()}


def generate_case(name, case, out_dir, check):
    recipe = dict(RECIPE, row_tokens=case["row_tokens"], clip_grad=case["clip_grad"])
    gen = torch.Generator().manual_seed(case["seed"])
    model = build_hf_model(case)
    init_weights(model, gen)
    rows = make_rows(case, gen)
    tokens = torch.tensor([r["tokens"] for r in rows])
    loss_mask = torch.tensor([r["loss_mask"] for r in rows])
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}

    tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=out_dir)
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        save_model(model, os.path.join(tmp, "model"))
        with open(os.path.join(tmp, "rows.jsonl"), "w") as f:
            for row in rows:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
        write_json(os.path.join(tmp, "recipe.json"), recipe)
        params = dict(model.named_parameters())
        trace, step1 = train(hf_forward(model), params, tokens, loss_mask, recipe)
        save_file(tensors_to_save(step1), os.path.join(tmp, "step1.safetensors"), metadata={"format": "pt"})
        write_json(os.path.join(tmp, "trace.json"), {"steps": trace})
        save_file(tensors_to_save(params), os.path.join(tmp, "final.safetensors"), metadata={"format": "pt"})
        final_dir = os.path.join(out_dir, name)
        if os.path.exists(final_dir):
            shutil.rmtree(final_dir)
        os.rename(tmp, final_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    print(f"{name}: step-1 loss {trace[0]['loss']!r}")
    for t in trace:
        print(f"  step {t['step']}: loss {t['loss']:.7f} grad_norm {t['grad_norm']:.6f} "
              f"lr {t['lr']:.6e} clipped {t['clipped']}")
    if check:
        final = {n: p.detach().clone() for n, p in params.items()}
        check_case(model, initial, tokens, loss_mask, recipe, trace, step1, final)


def max_rel(a, b):
    """max |a - b| / max |b| over a tensor (relative to the tensor's scale)."""
    scale = b.abs().max().item()
    return (a.double() - b.double()).abs().max().item() / (scale if scale > 0 else 1.0)


def check_case(model, initial, tokens, loss_mask, recipe, trace, step1, final):
    gb = recipe["global_batch"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(initial[name])
    hf_loss, hf_grads = hf_loss_path(model, tokens[:gb], loss_mask[:gb], trace[0]["num_targets"])
    grad_names = [k[5:] for k in step1 if k.startswith("grad.")]
    print(f"  HF loss path vs manual (fp32): loss rel {abs(hf_loss.item() - trace[0]['loss']) / trace[0]['loss']:.2e}, "
          f"grads max rel {max(max_rel(hf_grads[n], step1['grad.' + n]) for n in grad_names):.2e}")
    for dtype in (torch.float32, torch.float64):
        params = {n: t.to(dtype).clone().requires_grad_(True) for n, t in initial.items()}
        ref_trace, ref_step1 = train(reference_forward(model.config), params, tokens, loss_mask, recipe)
        print(f"  reference {str(dtype)[6:]} vs HF fp32:"
              f" logits max abs {(ref_step1['logits'].double() - step1['logits'].double()).abs().max().item():.2e},"
              f" step-1 grads max rel {max(max_rel(ref_step1['grad.' + n], step1['grad.' + n]) for n in grad_names):.2e},"
              f" trace loss max rel {max(abs(a['loss'] - b['loss']) / b['loss'] for a, b in zip(ref_trace, trace)):.2e},"
              f" grad_norm max rel {max(abs(a['grad_norm'] - b['grad_norm']) / b['grad_norm'] for a, b in zip(ref_trace, trace)):.2e},"
              f" clipped same {all(a['clipped'] == b['clipped'] for a, b in zip(ref_trace, trace))},"
              f" final max abs {max((params[n].double() - final[n].double()).abs().max().item() for n in final):.2e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)),
                        help="folder that receives one subfolder per case (default: this folder)")
    parser.add_argument("--check", action="store_true",
                        help="also print the tolerance checks of README.md")
    parser.add_argument("--case", action="append", choices=sorted(CASES),
                        help="generate only this case (repeatable; default: all)")
    args = parser.parse_args()
    transformers_logging.disable_progress_bar()  # 5.x draws one per saved shard
    torch.set_num_threads(1)  # one reduction order, so two runs give identical bytes
    torch.use_deterministic_algorithms(True)
    for name in args.case or CASES:
        generate_case(name, CASES[name], args.out, args.check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
