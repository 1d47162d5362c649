"""cuDNN and flash SDPA at the attention shapes of Qwen3's sizes, alone on the GPU.

Separates what the attention library does at a shape from what the training step's other
work (clocks, power, HBM) costs it: loom's op profile gives the in-step rates, this the
library's at the same shape. Prints one JSON object.

    python3 bench/gpu/attention_shapes.py > attention.json
"""

import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROWS, TOKENS, HEAD_DIM = 2, 8192, 128
# (name, q heads, kv heads): Qwen3-0.6B/1.7B, 4B/8B, 32B.
SHAPES = [("16q/8kv", 16, 8), ("32q/8kv", 32, 8), ("64q/8kv", 64, 8)]


def causal_forward_flop(q_heads):
    # Two matmuls of 2·s²·d each a head, halved by the causal mask.
    return ROWS * q_heads * 2 * 2 * TOKENS * TOKENS * HEAD_DIM / 2


def timed(fn, warmup=3, iters=10):
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def tensors(q_heads, kv_heads, token_major, expand_kv):
    """q, k, v as [rows, heads, tokens, d] views; token-major ones stride like loom's qkv buffer."""
    heads = q_heads + 2 * kv_heads
    gen = torch.Generator(device="cuda").manual_seed(0)
    if token_major:
        qkv = torch.randn(ROWS, TOKENS, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        q, k, v = qkv.split([q_heads, kv_heads, kv_heads], dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    else:
        q = torch.randn(ROWS, q_heads, TOKENS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(ROWS, kv_heads, TOKENS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(ROWS, kv_heads, TOKENS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    if expand_kv:
        group = q_heads // kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    return [t.detach().requires_grad_(True) for t in (q, k, v)]


def measure(backend, q_heads, kv_heads, token_major, expand_kv):
    q, k, v = tensors(q_heads, kv_heads, token_major, expand_kv)
    gqa = not expand_kv and q_heads != kv_heads
    with sdpa_kernel([backend]):
        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

        out = forward()
        d_out = torch.randn_like(out)

        def forward_backward():
            o = forward()
            torch.autograd.grad(o, (q, k, v), d_out)

        fwd_ms = timed(forward)
        both_ms = timed(forward_backward)
    flop = causal_forward_flop(q_heads)
    bwd_ms = both_ms - fwd_ms
    return {
        "forward_ms": round(fwd_ms, 3),
        "backward_ms": round(bwd_ms, 3),
        "forward_tflops": round(flop / fwd_ms / 1e9, 1),
        "backward_tflops_2.5x": round(2.5 * flop / bwd_ms / 1e9, 1),
    }


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "rows": ROWS, "tokens": TOKENS, "runs": []}
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]
    for name, qh, kh in SHAPES:
        for backend_name, backend in backends:
            for token_major in (True, False):
                for expand_kv in (False, True):
                    run = {"shape": name, "backend": backend_name,
                           "layout": "token-major (loom)" if token_major else "head-major",
                           "kv": "expanded to q heads" if expand_kv else "gqa"}
                    try:
                        run.update(measure(backend, qh, kh, token_major, expand_kv))
                    except RuntimeError as err:  # a backend refusing a shape is a result too
                        run["error"] = str(err).splitlines()[0][:200]
                    print(json.dumps(run), file=sys.stderr)
                    result["runs"].append(run)
                    torch.cuda.empty_cache()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
