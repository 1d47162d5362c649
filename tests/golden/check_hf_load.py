#!/usr/bin/env python3
"""Loads an HF checkpoint dir (one loom wrote) with transformers and checks it on rows.

usage: check_hf_load.py DIR ROWS.jsonl [--adapter ADAPTER_DIR] [--logits FILE.safetensors [--atol A]]
                                       [--expect-loss X [--rtol R]]

Runs the model of DIR's config.json (AutoModelForCausalLM: Qwen3, Qwen2, Llama, Mistral) from DIR in fp32 (eager attention, whatever dtype DIR stores) on every
row of ROWS.jsonl (each row its own sequence, positions 0..T-1) and prints the docs/numerics.md
loss of all rows taken as one global batch: sum_r nll_r / sum_r max(sum_t mask[t+1], 1).
  --adapter DIR     apply the PEFT LoRA adapter folder DIR over the model
                    (PeftModel.from_pretrained, as a user loads a LoRA run's final/)
  --logits FILE     compare with FILE's "logits" (fp32 [rows, T, vocab]); prints the max
                    abs difference; fails above --atol (default 1e-4).
  --expect-loss X   fails when |loss - X| / |X| > --rtol (default 1e-5).
Exit 0 when every requested check is within tolerance, 1 otherwise, 2 for bad input.
"""
import argparse
import os
import sys

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from transformers.utils import logging as transformers_logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate import load_rows, row_nll  # noqa: E402  (one loss definition for both)


def fail_input(where, what):
    print(f"{where}: {what}", file=sys.stderr)
    sys.exit(2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir", help="HF checkpoint dir: config.json + safetensors")
    parser.add_argument("rows", help="rows.jsonl: one {tokens, loss_mask} object per line")
    parser.add_argument("--adapter", help="PEFT adapter folder to apply over the model")
    parser.add_argument("--logits", help="safetensors file holding 'logits' [rows, T, vocab]")
    parser.add_argument("--atol", type=float, default=1e-4, help="logits max abs diff allowed")
    parser.add_argument("--expect-loss", type=float, help="expected loss of all rows")
    parser.add_argument("--rtol", type=float, default=1e-5, help="loss relative diff allowed")
    args = parser.parse_args()

    if not os.path.isfile(os.path.join(args.dir, "config.json")):
        fail_input(args.dir, "no config.json, expected an HF checkpoint dir")
    try:
        tokens, loss_mask = load_rows(args.rows)
    except (OSError, ValueError, KeyError) as e:
        fail_input(args.rows, f"cannot read rows ({e})")

    transformers_logging.disable_progress_bar()  # 5.x draws one while loading
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    model = AutoModelForCausalLM.from_pretrained(args.dir, attn_implementation="eager")
    if args.adapter:
        import peft  # only this check needs it

        if not os.path.isfile(os.path.join(args.adapter, "adapter_config.json")):
            fail_input(args.adapter, "no adapter_config.json, expected a PEFT adapter folder")
        model = peft.PeftModel.from_pretrained(model, args.adapter)
    model = model.to(torch.float32).eval()
    vocab = model.config.vocab_size
    if int(tokens.max()) >= vocab or int(tokens.min()) < 0:
        fail_input(args.rows, f"token ids span [{int(tokens.min())}, {int(tokens.max())}], expected [0, {vocab})")

    reference = None
    if args.logits:
        try:
            handle = safe_open(args.logits, framework="pt")
            reference = handle.get_slice("logits")
        except Exception as e:  # safetensors raises its own error types
            fail_input(args.logits, f"cannot read tensor 'logits' ({e})")
        expected_shape = [tokens.shape[0], tokens.shape[1], vocab]
        if list(reference.get_shape()) != expected_shape:
            fail_input(args.logits, f"'logits' has shape {list(reference.get_shape())}, expected {expected_shape}")

    nll_sum, n_sum, max_diff = 0.0, 0.0, 0.0
    positions = torch.arange(tokens.shape[1])[None, :]
    with torch.no_grad():
        for r in range(tokens.shape[0]):  # one row at a time bounds the logits memory
            logits = model(input_ids=tokens[r:r + 1], position_ids=positions, use_cache=False).logits.float()
            nll, n = row_nll(logits, tokens[r:r + 1], loss_mask[r:r + 1])
            nll_sum += float(nll.double().sum())
            n_sum += float(n.sum())
            if reference is not None:
                other = reference[r:r + 1].to(torch.float32)
                max_diff = max(max_diff, float((logits.double() - other.double()).abs().max()))
    loss = nll_sum / n_sum
    print(f"loss {loss!r} over {tokens.shape[0]} rows, {n_sum:.0f} targets")

    ok = True
    if reference is not None:
        within = max_diff <= args.atol
        ok &= within
        print(f"logits max abs diff {max_diff:.3e} (atol {args.atol:g}): {'ok' if within else 'FAIL'}")
    if args.expect_loss is not None:
        rel = abs(loss - args.expect_loss) / abs(args.expect_loss) if args.expect_loss != 0 else abs(loss)
        within = rel <= args.rtol
        ok &= within
        print(f"loss {loss!r} vs expected {args.expect_loss!r}: rel diff {rel:.3e} (rtol {args.rtol:g}): "
              f"{'ok' if within else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
