#!/usr/bin/env python3
"""Writes rows.jsonl for the tiny recipe: 64 rows of 64 tokens over a 256-token vocabulary.

Each row is a run of short "conversations": a prompt (loss_mask 0) of arithmetic
progressions mod 256, then an answer (loss_mask 1) that continues the progression, so
the model has something learnable and the loss falls within a few steps. Deterministic
(fixed seed); run it again to get the same file.
"""
import json
import random

ROWS, ROW_TOKENS, VOCAB, EOS = 64, 64, 256, 0

rng = random.Random(20261202)
with open("rows.jsonl", "w") as out:
    for _ in range(ROWS):
        tokens, mask = [], []
        while len(tokens) < ROW_TOKENS:
            start, stride = rng.randrange(1, VOCAB), rng.choice([1, 2, 3, 5])
            prompt, answer = rng.randrange(4, 9), rng.randrange(4, 9)
            seq = [(start + i * stride) % (VOCAB - 1) + 1 for i in range(prompt + answer)]
            tokens += seq + [EOS]
            mask += [0] * prompt + [1] * answer + [0]
        out.write(json.dumps({"tokens": tokens[:ROW_TOKENS], "loss_mask": mask[:ROW_TOKENS]}) + "\n")
