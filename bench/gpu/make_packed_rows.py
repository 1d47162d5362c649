#!/usr/bin/env python3
"""The same synthetic conversations packed both ways, for the isolated-packing speed check:
usage make_packed_rows.py OUT_PREFIX CONVERSATIONS [ROW_TOKENS] [VOCAB]. Seeded.

Conversation lengths follow a realistic SFT mix: log-normal with median 1,500 tokens and a
long tail, clipped to [64, ROW_TOKENS]; the first 30% of each (its prompt) is outside the
loss mask. Writes
  OUT_PREFIX-rows.jsonl      the seed's packing: EOS-joined, cut into rows (the tail dropped);
  OUT_PREFIX-isolated.jsonl  isolated packing (docs/data.md): whole conversations binned
                             best-fit decreasing, position_ids restarting per sample, the
                             padding a sample of its own with loss mask 0;
and prints both row counts and the isolated rows' padding share, which the tokens/s of the
isolated run should be read against (its rows count padding as tokens)."""
import bisect
import json
import math
import random
import sys

prefix, count = sys.argv[1], int(sys.argv[2])
row_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
vocab = int(sys.argv[4]) if len(sys.argv) > 4 else 151643
EOS = 151645 if vocab > 151645 else vocab - 1
rng = random.Random(11)
conversations = []
for _ in range(count):
    n = int(min(row_tokens, max(64, rng.lognormvariate(math.log(1500), 0.9))))
    prompt = int(0.3 * n)
    conversations.append(([rng.randrange(vocab) for _ in range(n)], [0] * prompt + [1] * (n - prompt)))

with open(f"{prefix}-rows.jsonl", "w") as f:
    tokens, mask, rows = [], [], 0
    for i, (t, m) in enumerate(conversations):
        if i:
            tokens.append(EOS)
            mask.append(0)
        tokens += t
        mask += m
        while len(tokens) >= row_tokens:
            f.write(json.dumps({"tokens": tokens[:row_tokens], "loss_mask": mask[:row_tokens]}) + "\n")
            tokens, mask, rows = tokens[row_tokens:], mask[row_tokens:], rows + 1

# Best fit decreasing: longest first, each into the open row with the least room that holds it.
order = sorted(range(count), key=lambda i: -len(conversations[i][0]))
bins, free = [], []  # free: sorted (room, bin index)
for i in order:
    n = len(conversations[i][0])
    k = bisect.bisect_left(free, (n, -1))
    if k < len(free):
        room, b = free.pop(k)
    else:
        room, b = row_tokens, len(bins)
        bins.append([])
    bins[b].append(i)
    if room - n > 0:
        bisect.insort(free, (room - n, b))
rng.shuffle(bins)
padding = 0
with open(f"{prefix}-isolated.jsonl", "w") as f:
    for b in bins:
        tokens, mask, positions = [], [], []
        for i in b:
            t, m = conversations[i]
            tokens += t
            mask += m
            positions += list(range(len(t)))
        pad = row_tokens - len(tokens)
        padding += pad
        tokens += [EOS] * pad
        mask += [0] * pad
        positions += list(range(pad))
        f.write(json.dumps({"tokens": tokens, "loss_mask": mask, "position_ids": positions}) + "\n")
print(json.dumps({"conversations": count, "rows_packing_rows": rows, "isolated_rows": len(bins),
                  "isolated_padding_share": padding / (len(bins) * row_tokens)}))
