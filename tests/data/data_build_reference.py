#!/usr/bin/env python3
"""The rows `loom data build` must make of tests/data/conversations_small.jsonl, from the
documented algorithm alone (docs/data.md), on transformers + slime's loss mask
(chat_reference.py). Prints the rows_sha256 and counts that test_data_build.cpp pins:

    .venv/bin/python tests/data/data_build_reference.py

Lines are classified as chat.h does it (the fixture has one bad line of each kind), the
usable ones tokenized in input order, permuted by SplitMix64 Fisher-Yates, joined with the
EOS <|im_end|> (mask 0), cut into rows of ROW_TOKENS, rows without a target (a mask 1 at
position >= 1) dropped, the tail dropped, and the rows hashed as little-endian int32
tokens then one byte per mask entry.
"""
import hashlib
import json
import os
import struct
import sys

from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from chat_reference import Qwen3LossMask  # noqa: E402

M = (1 << 64) - 1
CASES = [(64, 1234), (64, 1235), (37, 0)]  # (row_tokens, seed)


def permutation(n, seed):
    state = seed

    def nxt():
        nonlocal state
        state = (state + 0x9E3779B97F4A7C15) & M
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        return z ^ (z >> 31)

    p = list(range(n))
    for i in range(n - 1, 0, -1):
        j = (nxt() * (i + 1)) >> 64
        p[i], p[j] = p[j], p[i]
    return p


def problem(raw):
    """chat.h's ChatProblem of one line, or None (enough of it for this fixture)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid_utf8"
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return "malformed_json"
    if not isinstance(value, dict) or not isinstance(value.get("messages"), list):
        return "malformed_json"
    if not value["messages"]:
        return "empty_conversation"
    for m in value["messages"]:
        if m.get("role") not in ("system", "user", "assistant", "tool"):
            return "unknown_role"
        if not isinstance(m.get("content"), str):
            return "non_string_content"
        for call in m.get("tool_calls") or []:
            if not isinstance(call.get("function", call).get("name"), str):
                return "bad_tool_call"
    return None


def main():
    tok = AutoTokenizer.from_pretrained(os.path.join(HERE, "qwen3-tokenizer"))
    masker = Qwen3LossMask(tok)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    convs, skipped = [], {}
    with open(os.path.join(HERE, "conversations_small.jsonl"), "rb") as f:
        for number, raw in enumerate(f.read().split(b"\n")[:-1], 1):
            if not raw.strip():
                continue
            why = problem(raw)
            if why:
                skipped.setdefault(why, []).append(number)
                continue
            value = json.loads(raw)
            convs.append(masker(value["messages"], tools=value.get("tools")))
    print("conversations", len(convs), "skipped", skipped)
    for row_tokens, seed in CASES:
        tokens, mask = [], []
        for k, c in enumerate(permutation(len(convs), seed)):
            if k > 0:
                tokens.append(eos)
                mask.append(0)
            tokens += convs[c][0]
            mask += convs[c][1]
        sha, rows, ones = hashlib.sha256(), 0, 0
        for r in range(len(tokens) // row_tokens):
            t = tokens[r * row_tokens:(r + 1) * row_tokens]
            m = mask[r * row_tokens:(r + 1) * row_tokens]
            if sum(m[1:]) == 0:
                continue
            sha.update(struct.pack(f"<{row_tokens}i", *t) + bytes(m))
            rows += 1
            ones += sum(m)
        print(f"row_tokens {row_tokens} seed {seed}: rows {rows} supervised {ones} "
              f"conversation_tokens {sum(len(c[0]) for c in convs)} rows_sha256 {sha.hexdigest()}")


if __name__ == "__main__":
    main()
