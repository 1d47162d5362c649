#!/usr/bin/env python3
"""Writes the golden fixtures loom's CPU fp32 reference must reproduce (tests/golden/<case>/).

Each case is a small random Qwen3 model (Hugging Face transformers, fp32, eager attention),
8 rows of tokens and loss masks, and a 6-step training run with the loss, AdamW, LR schedule
and grad clip of docs/numerics.md, implemented here in plain torch (not
torch.optim). README.md in this folder documents every file and formula. The Qwen3-MoE cases
(tiny_qwen3_moe*) add routing, micro-batches of 2 rows and the HF or Megatron load-balancing
loss; their tensors carry the Hub's per-expert names (and 5.x's fused ones in step1/final).

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
import re
import shutil
import sys
import tempfile

import torch
from safetensors import safe_open
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
    # Qwen3-MoE: every layer sparse, 8 experts, top-2 with the top-k weights renormalised;
    # no aux loss. The router is drawn with std router_std (not 0.02) so that its logits
    # spread out and top-k never ties (asserted every step, see check_topk_gaps).
    "tiny_qwen3_moe": {
        "family": "qwen3_moe",
        "seed": 5005,
        "num_rows": 8,
        "row_tokens": 24,
        "clip_grad": 2.45,
        "router_std": 0.3,
        "model": {
            "vocab_size": 96,
            "hidden_size": 64,
            "intermediate_size": 96,  # unused: every layer is sparse
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "tie_word_embeddings": False,
            "rope_theta": 10000.0,
        },
    },
    # Layer 1 a dense MLP (mlp_only_layers) between two sparse layers; top-k weights not
    # renormalised; tied; HF's load-balancing loss per micro-batch with coef 0.1.
    "tiny_qwen3_moe_aux": {
        "family": "qwen3_moe",
        "seed": 6006,
        "num_rows": 8,
        "row_tokens": 20,
        "clip_grad": 2.7,
        "router_std": 0.3,
        "moe_aux_loss": {"kind": "hf", "coef": 0.1},
        "model": {
            "vocab_size": 96,
            "hidden_size": 64,
            "intermediate_size": 80,  # the dense layer 1
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 24,
            "norm_topk_prob": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [1],
            "tie_word_embeddings": True,
            "rope_theta": 1000000.0,
        },
    },
    # tiny_qwen3_moe's shape, another seed, Megatron's switch load-balancing loss (per
    # micro-batch and layer, per-token scaling) with coef 0.1.
    "tiny_qwen3_moe_megatron": {
        "family": "qwen3_moe",
        "seed": 7007,
        "num_rows": 8,
        "row_tokens": 24,
        "clip_grad": 2.6,
        "router_std": 0.3,
        "moe_aux_loss": {"kind": "megatron", "coef": 0.1},
        "model": {
            "vocab_size": 96,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "tie_word_embeddings": False,
            "rope_theta": 10000.0,
        },
    },
}

# Rows per micro-batch of the MoE cases (recipe.json's micro_batch_rows): the aux losses
# are per micro-batch, as loom computes them.
MOE_MICRO_BATCH_ROWS = 2

# The k-th and (k+1)-th largest router probabilities of any token, layer and step lie at
# least TOPK_MIN_GAP apart, and their logits at least TOPK_MIN_LOGIT_GAP (a probability gap
# alone says little where both are tiny): top-k is then the same in any fp32 implementation.
TOPK_MIN_GAP = 1e-6
TOPK_MIN_LOGIT_GAP = 1e-5

# The transformers classes of each family (model_type).
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
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


ROUTER_SUFFIX = ".mlp.gate.weight"
FUSED_GATE_UP = ".mlp.experts.gate_up_proj"
FUSED_DOWN = ".mlp.experts.down_proj"
HUB_EXPERT = re.compile(r"^(.*\.mlp\.experts\.)(\d+)\.(gate|up|down)_proj\.weight$")


def moe_spec(config):
    """{num_experts, top_k, norm_topk_prob, sparse_layers} of a Qwen3-MoE config; None for a
    dense model. Layer l is sparse unless l is in mlp_only_layers or (l + 1) is not a multiple
    of decoder_sparse_step (HF's Qwen3MoeDecoderLayer)."""
    if getattr(config, "model_type", None) != "qwen3_moe":
        return None
    sparse = [layer for layer in range(config.num_hidden_layers)
              if layer not in (config.mlp_only_layers or []) and config.num_experts > 0
              and (layer + 1) % config.decoder_sparse_step == 0]
    return {"num_experts": config.num_experts, "top_k": config.num_experts_per_tok,
            "norm_topk_prob": bool(config.norm_topk_prob), "sparse_layers": sparse}


def split_experts(named):
    """{name: tensor} with transformers 5.x's fused expert tensors replaced, where they stand,
    by the Hub's per-expert views: `mlp.experts.gate_up_proj` [E, 2·I, H] (gate rows first,
    then up) -> `mlp.experts.e.gate_proj.weight`, `.up_proj.weight` [I, H]; and
    `mlp.experts.down_proj` [E, H, I] -> `mlp.experts.e.down_proj.weight` [H, I]. Other names
    (4.x's per-expert parameters too) pass through; the order is kept, and so a dense model's
    dict comes back as it was."""
    out = {}
    for name, t in named.items():
        if name.endswith(FUSED_GATE_UP):
            prefix, inter = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :inter]
                out[f"{prefix}{e}.up_proj.weight"] = t[e, inter:]
        elif name.endswith(FUSED_DOWN):
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


def with_fused(named):
    """`named` (Hub per-expert names, any prefix such as "grad.") plus 5.x's fused expert
    tensors built from them: `<prefix>mlp.experts.gate_up_proj` [E, 2·I, H] and
    `<prefix>mlp.experts.down_proj` [E, H, I]. The same bytes whichever layout the installed
    transformers trains in."""
    experts = {}
    for name, t in named.items():
        match = HUB_EXPERT.match(name)
        if match:
            experts.setdefault(match.group(1), {})[(int(match.group(2)), match.group(3))] = t
    out = dict(named)
    for prefix, parts in sorted(experts.items()):
        count = 1 + max(e for e, _ in parts)
        out[prefix + "gate_up_proj"] = torch.stack(
            [torch.cat([parts[(e, "gate")], parts[(e, "up")]], dim=0) for e in range(count)])
        out[prefix + "down_proj"] = torch.stack([parts[(e, "down")] for e in range(count)])
    return out


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
    family = case.get("family", "qwen3")
    if family == "qwen3_moe" and case.get("moe_aux_loss"):
        # Only HF's own loss path reads it; the recipe's moe_aux_loss is what loom uses.
        spec["router_aux_loss_coef"] = case["moe_aux_loss"]["coef"]
    config = config_class(
        **spec,
        max_position_embeddings=64,
        initializer_range=0.02,
        attention_dropout=0.0,
        sliding_window=None,  # 4.x warns about its default 4096 even when unused
        use_cache=False,
        attn_implementation="eager",
    )
    if family == "qwen3_moe" and hasattr(config, "_experts_implementation"):
        # 5.x picks "grouped_mm" (torch._grouped_mm) where it can; "eager" is its plain loop
        # over the experts that have tokens (4.x's only implementation).
        config._experts_implementation = "eager"
    # transformers 5.x moves rope_theta into rope_parameters; check it arrived either way.
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    if theta != case["model"]["rope_theta"]:
        raise RuntimeError(f"rope_theta {theta} in the config, expected {case['model']['rope_theta']}")
    model = model_class(config).to(torch.float32).eval()
    model.config._attn_implementation = "eager"
    if family == "qwen3_moe" and getattr(model.config, "_experts_implementation", "eager") != "eager":
        raise RuntimeError(f"experts implementation {model.config._experts_implementation}, expected eager")
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    if tied != spec["tie_word_embeddings"]:
        raise RuntimeError(f"lm_head tied = {tied}, expected {spec['tie_word_embeddings']}")
    return model


def init_weights(model, gen, router_std=None):
    """HF's distribution, from our own generator so the weights do not depend on the
    transformers version: matrices N(0, 0.02), every RMSNorm weight 1 + 0.1 N(0, 1), every
    bias 0.1 N(0, 1) (HF starts them at 0; non-zero, they shift the logits), MoE routers
    (`mlp.gate.weight`) N(0, router_std). Drawn tensor by tensor in sorted Hub-name order
    (per-expert `mlp.experts.E.*_proj.weight`, also where 5.x stores the experts fused)."""
    with torch.no_grad():
        for name, p in sorted(split_experts(dict(model.named_parameters())).items()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith(NORM_SUFFIXES):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
            elif name.endswith(ROUTER_SUFFIX):
                p.copy_(router_std * noise)
            else:
                p.copy_(model.config.initializer_range * noise)


def hf_forward(model):
    """forward(params, tokens) -> (logits [R, T, V], router logits of each sparse layer
    [R·T, E], rows major; [] for a dense model)."""
    moe = moe_spec(model.config)

    def forward(params, tokens):
        del params  # the model holds them
        positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
        if not moe:
            return model(input_ids=tokens, position_ids=positions, use_cache=False).logits, []
        out = model(input_ids=tokens, position_ids=positions, use_cache=False, output_router_logits=True)
        router = [r for r in out.router_logits if r is not None]  # 4.x: None for dense layers
        if len(router) != len(moe["sparse_layers"]):
            raise RuntimeError(f"{len(router)} router logits, expected {len(moe['sparse_layers'])}")
        return out.logits, router

    return forward


def reference_forward(config):
    """Qwen3 written from docs/numerics.md over a {hf_name: tensor} dict, in the tensors' dtype
    (no fp32 casts, unlike HF's RMSNorm, RoPE and eager softmax): an independent check.

    Qwen3-MoE's sparse layers (Hub per-expert names): every expert runs on every token and
    the outputs are summed with a dense [tokens, E] weight that is zero off each token's top-k
    (HF runs each expert on its routed tokens only and index_adds them). forward returns
    (logits, router logits of each sparse layer [R·T, E])."""
    nq, nkv = config.num_attention_heads, config.num_key_value_heads
    moe = moe_spec(config)
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

    def swiglu(p, h, pre):
        gate = h @ p[pre + "gate_proj.weight"].T
        up = h @ p[pre + "up_proj.weight"].T
        return (torch.nn.functional.silu(gate) * up) @ p[pre + "down_proj.weight"].T

    def sparse_block(p, h, pre):  # h [tokens, hidden]
        logits = h @ p[pre + "mlp.gate.weight"].T
        probs = torch.softmax(logits, dim=-1)
        top, chosen = torch.topk(probs, moe["top_k"], dim=-1)
        if moe["norm_topk_prob"]:
            top = top / top.sum(dim=-1, keepdim=True)
        weight = torch.zeros_like(probs).scatter(1, chosen, top)
        out = torch.zeros_like(h)
        for e in range(moe["num_experts"]):
            out = out + weight[:, e:e + 1] * swiglu(p, h, pre + f"mlp.experts.{e}.")
        return out, logits

    def forward(p, tokens):
        rows, length = tokens.shape
        router = []
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
            if moe and layer in moe["sparse_layers"]:
                y, logits = sparse_block(p, h.reshape(rows * length, -1), pre)
                router.append(logits)
                x = x + y.view(rows, length, -1)
            else:
                x = x + swiglu(p, h, pre + "mlp.")
        x = rms(x, p["model.norm.weight"])
        head = p.get("lm_head.weight", p["model.embed_tokens.weight"])
        return x @ head.T, router

    return forward


# ---------------------------------------------------------------------------------------
# Training (docs/numerics.md: loss, AdamW, LR schedule, grad clip)


def hf_load_balancing_loss(layer_logits, num_experts, top_k):
    """transformers' load_balancing_loss_func (attention_mask None) over one micro-batch: the
    router logits [tokens, E] of every sparse layer, stacked into rows. p = softmax(logits)
    in their dtype; tokens_per_expert = mean over rows of one_hot(topk(p, k)) [k, E];
    router_prob_per_expert = mean over rows of p [E]; aux = E · Σ tokens_per_expert ·
    router_prob_per_expert. The counts carry no gradient. Plain torch (4.x's op order), so
    the fixtures do not depend on the transformers version; transformers' own function must
    agree to 1e-6 relative."""
    probs = torch.softmax(torch.cat(layer_logits, dim=0), dim=-1)
    chosen = torch.topk(probs.detach(), top_k, dim=-1).indices
    tokens_per_expert = torch.nn.functional.one_hot(chosen, num_experts).to(probs.dtype).mean(dim=0)
    aux = torch.sum(tokens_per_expert * probs.mean(dim=0)[None, :]) * num_experts
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func
    theirs = load_balancing_loss_func(tuple(layer_logits), num_experts, top_k).item()
    if abs(theirs - aux.item()) > 1e-6 * abs(aux.item()):
        raise RuntimeError(f"load_balancing_loss_func {theirs!r} != plain torch {aux.item()!r}")
    return aux


def megatron_load_balancing_loss(logits, num_experts, top_k, coef):
    """Megatron-core's switch_load_balancing_loss_func for one micro-batch and one sparse layer,
    logits [T_b, E]: p = softmax(logits); count_e = the (token, slot) pairs of topk(p, k) that
    chose e (no gradient); aux = Σ_e (Σ_t p_te) · count_e · (E · coef / (k · T_b²)), the
    coefficient included."""
    probs = torch.softmax(logits, dim=-1)
    chosen = torch.topk(probs.detach(), top_k, dim=-1).indices
    count = torch.nn.functional.one_hot(chosen, num_experts).to(probs.dtype).sum(dim=(0, 1))
    tokens = logits.shape[0]
    return torch.sum(probs.sum(dim=0) * count) * (num_experts * coef / (top_k * tokens * tokens))


def moe_objective(loss, nll, n, router, aux, moe, micro_tokens):
    """The step's objective with recipe["moe_aux_loss"]'s term, and trace.json's aux_loss.

    router: each sparse layer's logits [R·T, E] over the step's rows; micro-batch b is rows
    [b·micro_tokens, (b+1)·micro_tokens). hf: loss + coef · mean_b aux_b (aux_loss: mean_b
    aux_b). megatron: (Σ nll + Σ_b Σ_l aux_bl) / N (aux_loss: mean_bl aux_bl / coef)."""
    num_experts, top_k, coef = moe["num_experts"], moe["top_k"], aux["coef"]
    micro = [slice(s, s + micro_tokens) for s in range(0, router[0].shape[0], micro_tokens)]
    if aux["kind"] == "hf":
        per_micro = torch.stack([hf_load_balancing_loss([r[m] for r in router], num_experts, top_k)
                                 for m in micro])
        mean = per_micro.mean()
        return loss + coef * mean, mean.item()
    if aux["kind"] == "megatron":
        terms = torch.stack([megatron_load_balancing_loss(r[m], num_experts, top_k, coef)
                             for m in micro for r in router])
        return (nll.sum() + terms.sum()) / n.sum(), (terms.mean() / coef).item()
    raise ValueError(f"unknown moe_aux_loss kind {aux['kind']!r}")


def topk_gaps(router, top_k):
    """Smallest gaps between the k-th and (k+1)-th largest fp32 router probability and router
    logit over every token and sparse layer: top-k is ambiguous between implementations where
    they are ~0."""
    prob_gaps, logit_gaps = [], []
    for logits in router:
        logits = logits.detach().float()
        top = torch.topk(torch.softmax(logits, dim=-1), top_k + 1, dim=-1).values
        prob_gaps.append((top[:, top_k - 1] - top[:, top_k]).min().item())
        top = torch.topk(logits, top_k + 1, dim=-1).values
        logit_gaps.append((top[:, top_k - 1] - top[:, top_k]).min().item())
    return min(prob_gaps), min(logit_gaps)


def train(forward, params, tokens, loss_mask, recipe, moe=None, stats=None):
    """Runs recipe["steps"] steps on `params` ({hf_name: leaf tensor}, updated in place).

    moe: moe_spec of the model (None: dense). Every step asserts that top-k has no near-tie,
    adds recipe["moe_aux_loss"]'s term to the objective when there is one, and traces
    aux_loss (null without an aux loss). The grad norm is over the Hub tensors
    (split_experts), so it does not depend on how transformers stores the experts.
    stats, a dict, receives "min_topk_gap" and "min_topk_logit_gap".

    Returns (trace list, step-1 record {logits, nll, num_targets, router_logits.L,
    grad.<hub_name>})."""
    gb, num_rows = recipe["global_batch"], tokens.shape[0]
    b1, b2, eps, wd = recipe["beta1"], recipe["beta2"], recipe["eps"], recipe["weight_decay"]
    aux = recipe.get("moe_aux_loss")
    micro_tokens = recipe.get("micro_batch_rows", gb) * tokens.shape[1]
    m = {name: torch.zeros_like(p) for name, p in params.items()}
    v = {name: torch.zeros_like(p) for name, p in params.items()}
    trace, step1, min_gap, min_logit_gap = [], None, math.inf, math.inf
    for step in range(1, recipe["steps"] + 1):
        index = [((step - 1) * gb + i) % num_rows for i in range(gb)]
        batch_tokens, batch_mask = tokens[index], loss_mask[index]
        logits, router = forward(params, batch_tokens)
        nll, n = row_nll(logits, batch_tokens, batch_mask)
        loss = nll.sum() / n.sum()
        objective, aux_value = loss, None
        if moe:
            gap, logit_gap = topk_gaps(router, moe["top_k"])
            if gap < TOPK_MIN_GAP or logit_gap < TOPK_MIN_LOGIT_GAP:
                raise RuntimeError(f"step {step}: top-k probabilities {gap:.3g} apart (min {TOPK_MIN_GAP}), "
                                   f"logits {logit_gap:.3g} (min {TOPK_MIN_LOGIT_GAP})")
            min_gap, min_logit_gap = min(min_gap, gap), min(min_logit_gap, logit_gap)
            if aux:
                objective, aux_value = moe_objective(loss, nll, n, router, aux, moe, micro_tokens)
        grads = torch.autograd.grad(objective, list(params.values()))
        grads = dict(zip(params.keys(), grads))
        hub_grads = split_experts(grads)
        if step == 1:
            step1 = {"logits": logits.detach(), "nll": nll.detach(), "num_targets": n.detach()}
            if moe:
                step1.update({f"router_logits.{layer}": r.detach()
                              for layer, r in zip(moe["sparse_layers"], router)})
            step1.update({"grad." + name: g for name, g in hub_grads.items()})
        # Per-tensor L2 norms combined, as Megatron's multi-tensor l2norm.
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in hub_grads.values()]))
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
        entry = {
            "step": step,
            "loss": loss.item(),
            "grad_norm": norm.item(),
            "lr": lr,
            "clipped": bool(clipped),
            "num_targets": n.sum().item(),
        }
        if moe:
            entry["aux_loss"] = aux_value
        trace.append(entry)
    if stats is not None and moe:
        stats["min_topk_gap"], stats["min_topk_logit_gap"] = min_gap, min_logit_gap
    return trace, step1


def hf_loss_path(model, tokens, loss_mask, num_targets, recipe):
    """Step-1 loss through HF's own ForCausalLM loss (labels -100 where mask is 0, summed
    and divided by num_items_in_batch) and its grads (Hub names), for the README's tolerance
    table. MoE: one call per micro-batch; hf aux: each micro-batch's HF `aux_loss`
    (output_router_logits, no labels) enters as coef · mean_b; megatron: its term from HF's
    router logits."""
    labels = torch.where(loss_mask.bool(), tokens, torch.full_like(tokens, -100))
    positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
    moe = moe_spec(model.config)
    params = dict(model.named_parameters())
    if not moe:
        out = model(input_ids=tokens, position_ids=positions, labels=labels, use_cache=False,
                    num_items_in_batch=torch.tensor(num_targets))
        loss = out.loss
    else:
        aux, rows = recipe.get("moe_aux_loss"), recipe["micro_batch_rows"]
        loss, hf_aux, megatron = 0.0, [], []
        for b in range(0, tokens.shape[0], rows):
            mb = slice(b, b + rows)
            out = model(input_ids=tokens[mb], position_ids=positions[mb], labels=labels[mb], use_cache=False,
                        num_items_in_batch=torch.tensor(num_targets))
            loss = loss + out.loss
            if aux:
                routed = model(input_ids=tokens[mb], position_ids=positions[mb], use_cache=False,
                               output_router_logits=True)
                hf_aux.append(routed.aux_loss)
                megatron += [megatron_load_balancing_loss(r, moe["num_experts"], moe["top_k"], aux["coef"])
                             for r in routed.router_logits if r is not None]
        if aux and aux["kind"] == "hf":
            loss = loss + aux["coef"] * torch.stack(hf_aux).mean()
        elif aux:
            loss = loss + torch.stack(megatron).sum() / num_targets
    grads = torch.autograd.grad(loss, list(params.values()))
    return loss.detach(), split_experts(dict(zip(params.keys(), grads)))


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
    if moe_spec(model.config):
        hub_checkpoint(model, directory)


def hub_checkpoint(model, directory):
    """A Qwen3-MoE checkpoint as the Hub's: config.json's expert count under `num_experts`
    (5.x writes `num_local_experts`, its attribute_map's target), and per-expert
    `mlp.experts.E.{gate,up,down}_proj.weight` tensors in model.safetensors (5.x converts its
    fused tensors back on save; anything else is rewritten from split_experts)."""
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        config = json.load(f)
    if "num_local_experts" in config:
        config["num_experts"] = config.pop("num_local_experts")
        with open(path, "w") as f:
            f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")  # as to_json_string
    hub = tensors_to_save(split_experts(dict(model.named_parameters())))
    path = os.path.join(directory, "model.safetensors")
    with safe_open(path, "pt") as f:
        same = set(f.keys()) == set(hub) and all(torch.equal(f.get_tensor(k), hub[k]) for k in hub)
    if not same:
        save_file(hub, path, metadata={"format": "pt"})


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
    moe = moe_spec(model.config)
    if moe:
        recipe["micro_batch_rows"] = MOE_MICRO_BATCH_ROWS
        if case.get("moe_aux_loss"):
            recipe["moe_aux_loss"] = dict(case["moe_aux_loss"])
    init_weights(model, gen, case.get("router_std"))
    rows = make_rows(case, gen)
    tokens = torch.tensor([r["tokens"] for r in rows])
    loss_mask = torch.tensor([r["loss_mask"] for r in rows])
    initial = split_experts({n: p.detach().clone() for n, p in model.named_parameters()})
    stats = {}

    tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=out_dir)
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        save_model(model, os.path.join(tmp, "model"))
        with open(os.path.join(tmp, "rows.jsonl"), "w") as f:
            for row in rows:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
        write_json(os.path.join(tmp, "recipe.json"), recipe)
        params = dict(model.named_parameters())
        trace, step1 = train(hf_forward(model), params, tokens, loss_mask, recipe, moe, stats)
        save_file(tensors_to_save(with_fused(step1)), os.path.join(tmp, "step1.safetensors"),
                  metadata={"format": "pt"})
        write_json(os.path.join(tmp, "trace.json"), {"steps": trace})
        save_file(tensors_to_save(with_fused(split_experts(params))), os.path.join(tmp, "final.safetensors"),
                  metadata={"format": "pt"})
        final_dir = os.path.join(out_dir, name)
        if os.path.exists(final_dir):
            shutil.rmtree(final_dir)
        os.rename(tmp, final_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    print(f"{name}: step-1 loss {trace[0]['loss']!r}"
          + (f", aux_loss {trace[0]['aux_loss']!r}, min top-k gap {stats['min_topk_gap']:.3g} "
             f"(logits {stats['min_topk_logit_gap']:.3g})" if moe else ""))
    for t in trace:
        print(f"  step {t['step']}: loss {t['loss']:.7f} grad_norm {t['grad_norm']:.6f} "
              f"lr {t['lr']:.6e} clipped {t['clipped']}"
              + (f" aux_loss {t['aux_loss']:.7f}" if t.get("aux_loss") is not None else ""))
    if check:
        final = {n: p.detach().clone() for n, p in split_experts(params).items()}
        check_case(model, initial, tokens, loss_mask, recipe, trace, step1, final,
                   os.path.join(out_dir, name, "model"))


def max_rel(a, b):
    """max |a - b| / max |b| over a tensor (relative to the tensor's scale)."""
    scale = b.abs().max().item()
    return (a.double() - b.double()).abs().max().item() / (scale if scale > 0 else 1.0)


def check_case(model, initial, tokens, loss_mask, recipe, trace, step1, final, model_dir):
    gb = recipe["global_batch"]
    moe = moe_spec(model.config)
    with torch.no_grad():
        for name, p in split_experts(dict(model.named_parameters())).items():
            p.copy_(initial[name])
    hf_loss, hf_grads = hf_loss_path(model, tokens[:gb], loss_mask[:gb], trace[0]["num_targets"], recipe)
    grad_names = [k[5:] for k in step1 if k.startswith("grad.")]
    # The step-1 objective from the trace: the loss plus the aux term.
    objective, aux = trace[0]["loss"], recipe.get("moe_aux_loss")
    if aux and aux["kind"] == "hf":
        objective += aux["coef"] * trace[0]["aux_loss"]
    elif aux:  # megatron: mean_bl aux_bl / coef -> Σ_bl aux_bl / N
        terms = gb // recipe["micro_batch_rows"] * len(moe["sparse_layers"])
        objective += aux["coef"] * trace[0]["aux_loss"] * terms / trace[0]["num_targets"]
    print(f"  HF loss path vs manual (fp32): objective rel {abs(hf_loss.item() - objective) / objective:.2e}, "
          f"grads max rel {max(max_rel(hf_grads[n], step1['grad.' + n]) for n in grad_names):.2e}")
    # The written checkpoint as transformers loads it (its default experts implementation).
    loaded = getattr(transformers, "AutoModelForCausalLM").from_pretrained(
        model_dir, attn_implementation="eager").to(torch.float32).eval()
    positions = torch.arange(tokens.shape[1]).expand(gb, -1)
    with torch.no_grad():
        logits = loaded(input_ids=tokens[:gb], position_ids=positions, use_cache=False).logits
    experts = (getattr(loaded.config, "_experts_implementation", None) or "4.x") + " experts" if moe else "dense"
    print(f"  from_pretrained(model/) ({experts}) "
          f"logits vs step1: max abs {(logits.double() - step1['logits'].double()).abs().max().item():.2e}")
    for dtype in (torch.float32, torch.float64):
        params = {n: t.to(dtype).clone().requires_grad_(True) for n, t in initial.items()}
        ref_trace, ref_step1 = train(reference_forward(model.config), params, tokens, loss_mask, recipe, moe)
        print(f"  reference {str(dtype)[6:]} vs HF fp32:"
              f" logits max abs {(ref_step1['logits'].double() - step1['logits'].double()).abs().max().item():.2e},"
              f" step-1 grads max rel {max(max_rel(ref_step1['grad.' + n], step1['grad.' + n]) for n in grad_names):.2e},"
              f" trace loss max rel {max(abs(a['loss'] - b['loss']) / b['loss'] for a, b in zip(ref_trace, trace)):.2e},"
              f" grad_norm max rel {max(abs(a['grad_norm'] - b['grad_norm']) / b['grad_norm'] for a, b in zip(ref_trace, trace)):.2e},"
              f" clipped same {all(a['clipped'] == b['clipped'] for a, b in zip(ref_trace, trace))},"
              f" final max abs {max((params[n].double() - final[n].double()).abs().max().item() for n in final):.2e}"
              + (f", aux_loss max rel {max(abs(a['aux_loss'] - b['aux_loss']) / b['aux_loss'] for a, b in zip(ref_trace, trace)):.2e}"
                 if moe and recipe.get("moe_aux_loss") else ""))


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
