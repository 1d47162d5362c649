#!/usr/bin/env python3
"""Writes ROWS rows of ROW_TOKENS random token ids for the GPU benchmarks:
usage make_rows.py OUT ROWS ROW_TOKENS [VOCAB] [PROMPT_FRACTION]. Seeded, so runs compare.

PROMPT_FRACTION 0 (the default) supervises every target. Above 0 each row is packed chat
turns of 1,024 tokens whose first PROMPT_FRACTION of tokens (the prompt) is outside the loss
mask, as in SFT rows built with the qwen3 loss mask."""
import json
import random
import sys

out, rows, row_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
vocab = int(sys.argv[4]) if len(sys.argv) > 4 else 151643
prompt_fraction = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
TURN = 1024
rng = random.Random(7)
with open(out, "w") as f:
    for _ in range(rows):
        mask = [0 if (t % TURN) < prompt_fraction * TURN else 1 for t in range(row_tokens)]
        mask[0] = 0
        f.write(json.dumps({"tokens": [rng.randrange(vocab) for _ in range(row_tokens)], "loss_mask": mask}) + "\n")
