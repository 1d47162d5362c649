#!/usr/bin/env python3
"""Writes tests/golden/isolated/<case>/: what loom's sample-isolated rows must reproduce.

Rows of the golden case's row_tokens, each holding several samples (HF's padding-free
convention: position_ids restarting at 0 at each sample's first token) and, on some rows, a
padding tail. transformers (fp32, eager) runs every sample ALONE, as its own sequence; the
loss is loom's (docs/numerics.md): the logit at t predicts t+1 of the same sample with weight
loss_mask[t+1], loss = sum nll / sum_r max(n_r, 1), n_r the targets of row r. Written:

  rows.jsonl         {"tokens", "loss_mask", "position_ids"} per row; a padding tail is a
                     sample of its own there, with loss mask 0 (which changes nothing);
  reference.json     {"loss", "nll_sum", "targets", "denominator", "bounds": per row b_0..b_n
                     (b_n < row_tokens where the row ends in padding), "rows_loss": the
                     token-weighted loss of the golden case's own rows.jsonl at these weights
                     (rows packing, what a step-0 eval over it gives)};
  grads.safetensors  d loss / d parameter, HF names (fp32).

Run: python3 tests/golden/isolated_reference.py  (the golden cases' model/ folders must exist)
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen3ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))

# Per case: the rows' sample lengths (the last entry of a row may be "pad": its padding).
LAYOUTS = {
    "tiny_untied": [[7, 9, 8], [24], [1, 3, 11, "pad"], [5, 5, 5, 5, 4], [13, "pad"], [2, 22]],
    "tiny_tied": [[6, 14], [3, 3, 3, 3, "pad"], [20], [1, 1, 9, 9], [11, "pad"]],
}


def load_model(case):
    model = Qwen3ForCausalLM.from_pretrained(os.path.join(HERE, case, "model"), torch_dtype=torch.float32,
                                             attn_implementation="eager")
    return model.eval()


def sample_nll(model, tokens, mask):
    """Summed nll and target count of one sample run alone."""
    if len(tokens) < 2:
        return torch.zeros(()), 0
    ids = torch.tensor([tokens])
    logits = model(input_ids=ids, position_ids=torch.arange(len(tokens))[None], use_cache=False).logits[0]
    logp = torch.log_softmax(logits[:-1], dim=-1)
    target = logp.gather(-1, ids[0, 1:, None]).squeeze(-1)
    weight = torch.tensor(mask[1:], dtype=torch.float32)
    return (-target * weight).sum(), int(weight.sum().item())


def rows_loss(model, path):
    """Token-weighted loss of a rows.jsonl (rows packing: each row one sequence)."""
    nll, n = 0.0, 0
    with torch.no_grad():
        for line in open(path):
            row = json.loads(line)
            s, k = sample_nll(model, row["tokens"], row["loss_mask"])
            nll += s.item()
            n += k
    return nll / n


def generate(case):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = load_model(case)
    row_tokens = json.load(open(os.path.join(HERE, case, "recipe.json")))["row_tokens"]
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(7)
    rows, bounds_all = [], []
    total_nll = torch.zeros(())
    total_targets, denominator = 0, 0
    for layout in LAYOUTS[case]:
        lengths = [x for x in layout if x != "pad"]
        used = sum(lengths)
        assert used <= row_tokens and ("pad" in layout) == (used < row_tokens), (case, layout)
        tokens = torch.randint(0, vocab, (row_tokens,), generator=gen).tolist()
        mask = (torch.rand(row_tokens, generator=gen) < 0.7).to(torch.int64).tolist()
        for t in range(used, row_tokens):
            mask[t] = 0  # padding has no loss
        bounds, positions, row_targets = [0], [], 0
        for length in lengths:
            b = bounds[-1]
            s, k = sample_nll(model, tokens[b:b + length], mask[b:b + length])
            total_nll = total_nll + s
            row_targets += k
            bounds.append(b + length)
            positions += list(range(length))
        positions += list(range(row_tokens - used))  # the padding, a sample of its own in the .jsonl
        total_targets += row_targets
        denominator += max(row_targets, 1)
        rows.append({"tokens": tokens, "loss_mask": mask, "position_ids": positions})
        bounds_all.append(bounds)
    loss = total_nll / denominator
    names = [n for n, _ in model.named_parameters()]
    grads = torch.autograd.grad(loss, [p for _, p in model.named_parameters()])
    out = os.path.join(HERE, "isolated", case)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "rows.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    reference = {"loss": loss.item(), "nll_sum": total_nll.item(), "targets": total_targets,
                 "denominator": denominator, "bounds": bounds_all,
                 "rows_loss": rows_loss(model, os.path.join(HERE, case, "rows.jsonl"))}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")
    save_file({n: g.detach().contiguous() for n, g in zip(names, grads)}, os.path.join(out, "grads.safetensors"),
              metadata={"format": "pt"})
    print(f"{case}: loss {loss.item():.6f} over {total_targets} targets ({len(rows)} rows)", file=sys.stderr)


if __name__ == "__main__":
    for case in LAYOUTS:
        generate(case)
