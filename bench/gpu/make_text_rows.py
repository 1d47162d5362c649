#!/usr/bin/env python3
"""Writes ROWS rows of ROW_TOKENS tokens of real text for the GPU convergence runs (the device
has no network): the .py, .md, .rst and .txt files under the ROOTS (Python sources with their
docstrings and comments, and documentation: code and prose), in sorted path order, each file
tokenized with the Qwen3 tokenizer (tests/data/qwen3-tokenizer, through transformers), joined
with EOS and cut into rows; every target is supervised. Deterministic for the same ROOTS.
usage make_text_rows.py OUT ROWS ROW_TOKENS ROOT..."""
import json
import os
import sys

from transformers import PreTrainedTokenizerFast

out, rows, row_tokens, roots = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
tokenizer = PreTrainedTokenizerFast(tokenizer_file="tests/data/qwen3-tokenizer/tokenizer.json")
eos = 151643  # <|endoftext|>
files = sorted(os.path.join(d, f) for root in roots for d, _, names in os.walk(root) for f in names
               if f.endswith((".py", ".md", ".rst", ".txt")))
stream, need, used = [], rows * row_tokens, 0
for path in files:
    try:
        text = open(path, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue
    if len(text) < 2000:  # boilerplate and empty __init__.py files
        continue
    stream += tokenizer.encode(text) + [eos]
    used += 1
    if len(stream) >= need:
        break
if len(stream) < need:
    sys.exit(f"only {len(stream)} tokens under {roots}, {need} needed")
with open(out, "w") as f:
    for r in range(rows):
        tokens = stream[r * row_tokens:(r + 1) * row_tokens]
        f.write(json.dumps({"tokens": tokens, "loss_mask": [0] + [1] * (row_tokens - 1)}) + "\n")
print(f"{rows} rows of {row_tokens} tokens from {used} files under {roots}")
