"""The model FLOPs of a LoRA step (issue 40) and of a full fine-tuning step, from a config.json's
dict, without torch: what the baselines (lora_peft.py, long_context.py) and loom's arms
(bench/gpu/lora_results.py, long_context_results.py) both divide by.
  4 · N_base · tokens      the frozen base: forward and input gradient, no weight gradient
                           (N_base: every decoder matmul weight and the lm_head, not the embedding)
  6 · N_adapter · tokens   the adapters: forward, input and weight gradients
                           (N_adapter = Σ over layers and targets of rank · (in + out))
  attention                layers · rows · 6 · T² · heads · head_dim (QKᵀ and PV, causal, fwd + bwd)
"""

PEAK = 989e12
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def target_shapes(c):
    """(in, out) of each LoRA target of one decoder layer, from a config.json's dict."""
    h, q, kv, f = c["hidden_size"], c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"], c["intermediate_size"]
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}


def counts(c, rank, targets, rows, T):
    """The model FLOPs of one LoRA step over rows × T tokens (the docstring's count) from a
    config.json's dict; bench/gpu/lora_results.py divides loom's step times by the same numbers."""
    L, V, h = c["num_hidden_layers"], c["vocab_size"], c["hidden_size"]
    shapes = target_shapes(c)
    n_base = L * sum(i * o for i, o in shapes.values()) + V * h
    n_adapter = L * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)
    tokens = rows * T
    attn = L * rows * 6 * T * T * c["num_attention_heads"] * c["head_dim"]
    return dict(n_base_matmul=n_base, n_adapter=n_adapter, tokens=tokens, flops_base=4 * n_base * tokens,
                flops_adapter=6 * n_adapter * tokens, flops_attention=attn,
                flops=4 * n_base * tokens + 6 * n_adapter * tokens + attn)


def full_step_flops(c, rows, T):
    """Full fine-tuning's model FLOPs over rows × T tokens: 6 · N_base · tokens (every weight
    trains) + the same causal attention as a LoRA step."""
    n = counts(c, 0, [], rows, T)
    return dict(n_base_matmul=n["n_base_matmul"], tokens=n["tokens"], flops_base=6 * n["n_base_matmul"] * n["tokens"],
                flops_attention=n["flops_attention"], flops=6 * n["n_base_matmul"] * n["tokens"] + n["flops_attention"])
