#!/usr/bin/env python3
"""Writes ROWS rows of ROW_TOKENS random token ids (every target supervised) for the GPU
benchmarks: usage make_rows.py OUT ROWS ROW_TOKENS [VOCAB]. Seeded, so runs compare."""
import json
import random
import sys

out, rows, row_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
vocab = int(sys.argv[4]) if len(sys.argv) > 4 else 151643
rng = random.Random(7)
with open(out, "w") as f:
    for _ in range(rows):
        f.write(json.dumps({"tokens": [rng.randrange(vocab) for _ in range(row_tokens)],
                            "loss_mask": [0] + [1] * (row_tokens - 1)}) + "\n")
