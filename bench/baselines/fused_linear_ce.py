"""The fused linear + cross entropy (the Liger-style one) the PyTorch baselines share
(moe_slice.py, lora_peft.py): per chunk of tokens the bf16 logits, their fp32 log-sum-exp, the
per-token loss and d logits (ce_chunk: one kernel once compiled), then dX and, where the weight
trains, dW of the lm_head (dW accumulated in bf16 by addmm). No [tokens, vocab] tensor is kept
for the backward: the forward computes the gradients and the backward only scales them.

  loss = FusedLinearCE.apply(x, w, labels, chunk, chunk_fn)   # chunk_fn: ce_chunk or its compiled form
"""
import torch
import torch.nn.functional as F

BF16 = torch.bfloat16


def ce_chunk(logits, labels, inv_n):
    """bf16 logits [c, V] -> (Σ per-token loss over valid rows, d logits (softmax - onehot) · inv_n, bf16)."""
    lf = logits.float()
    lse = torch.logsumexp(lf, -1)
    valid = labels != -100
    safe = torch.where(valid, labels, 0)
    tgt = lf.gather(1, safe.unsqueeze(1)).squeeze(1)
    loss = torch.where(valid, lse - tgt, 0.0).sum()
    p = torch.exp(lf - lse.unsqueeze(1))
    hit = torch.arange(lf.shape[1], device=lf.device).unsqueeze(0) == safe.unsqueeze(1)
    grad = torch.where(hit, p - 1.0, p) * (valid.float() * inv_n).unsqueeze(1)
    return loss, grad.to(logits.dtype)


class FusedLinearCE(torch.autograd.Function):
    """mean over labels != -100 of CE(x @ w.T, labels), computing dX (and dW when w requires a
    gradient: a frozen lm_head, as under LoRA, costs no weight-gradient GEMM) chunk by chunk in
    the forward, where the logits of one chunk live at a time; the backward scales them."""
    @staticmethod
    def forward(ctx, x, w, labels, chunk, chunk_fn=ce_chunk):
        want_gw = w.requires_grad
        x, w = x.to(BF16), w.to(BF16)
        inv_n = 1.0 / (labels != -100).sum().clamp(min=1).float()
        gx = torch.empty_like(x)
        gw = torch.empty_like(w) if want_gw else None
        loss = torch.zeros((), device=x.device, dtype=torch.float32)
        for i in range(0, x.shape[0], chunk):
            xc = x[i:i + chunk]
            l, gl = chunk_fn(xc @ w.t(), labels[i:i + chunk], inv_n)
            loss = loss + l
            torch.mm(gl, w, out=gx[i:i + chunk])
            if want_gw and i == 0:
                torch.mm(gl.t(), xc, out=gw)
            elif want_gw:
                gw.addmm_(gl.t(), xc)
        ctx.save_for_backward(gx, gw)
        return loss * inv_n

    @staticmethod
    def backward(ctx, g):
        gx, gw = ctx.saved_tensors
        g = g.to(gx.dtype)
        return gx * g, None if gw is None else gw.mul_(g), None, None, None


def reference_ce(x, w, labels):
    return F.cross_entropy(x.float() @ w.float().t(), labels, ignore_index=-100)
