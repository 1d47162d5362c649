#!/usr/bin/env python3
"""Writes tests/data/chat_formats_cases.jsonl: conversations in the llama3 and qwen2.5 chat
formats (src/data/chat_formats.h), their rendered text, HF tokenizers' ids of that text and
the `assistant` loss mask, derived here independently from the ids' character offsets.

    python3 tests/data/chat_formats_reference.py   # needs tokenizers; Llama 3's tokenizer.json
                                                   # in .deps/llama3-tokenizer (scripts/setup.sh)

The formats, as docs/data.md states them:
  llama3   "<|begin_of_text|>" + per message
           "<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>"
  qwen2.5  per message "<|im_start|>{role}\\n{content}<|im_end|>\\n", Qwen2.5's default system
           message first when the conversation has none.
Mask: a token is 1 when it starts at or after an assistant message's content and before
the end of that message's text (content, end token, and "\\n" for qwen2.5), and that message
has step_loss_mask 1; else 0.
"""
import json
import os

import tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 12345 * 678?"},
     {"role": "assistant", "content": "8,369,910 — let me double-check: 12345 × 678 = 8369910."}],
    [{"role": "user", "content": "Écris un haïku sur l'été."},
     {"role": "assistant", "content": "Soleil de midi\nles cigales se taisent —\nl'ombre d'un figuier"}],
    [{"role": "user", "content": "Code?"},
     {"role": "assistant", "content": "```python\ndef f(x):\n    return x ** 2\n```\n"}],
    # Content that starts with white space and new lines: it meets the header's "\n".
    [{"role": "user", "content": "  indented"}, {"role": "assistant", "content": "\n\nleading newlines"}],
    [{"role": "user", "content": "first"}, {"role": "assistant", "content": "not trained", "step_loss_mask": 0},
     {"role": "user", "content": "second"}, {"role": "assistant", "content": "trained"}],
    [{"role": "user", "content": "empty answer"}, {"role": "assistant", "content": ""}],
    [{"role": "user", "content": "中文问题：今天天气怎么样？"}, {"role": "assistant", "content": "今天晴，25°C。🌞"}],
    [{"role": "system", "content": "sys"}, {"role": "user", "content": "u"},
     {"role": "system", "content": "a later system message"}, {"role": "assistant", "content": "a"}],
]


def pieces(fmt, messages):
    """(text, supervised span or None) per piece of the rendered conversation."""
    out = []
    if fmt == "llama3":
        out.append(("<|begin_of_text|>", None))
    elif messages[0]["role"] != "system":
        messages = [{"role": "system", "content": QWEN_DEFAULT_SYSTEM}] + messages
    for m in messages:
        if fmt == "llama3":
            header, body = f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n", m["content"] + "<|eot_id|>"
        else:
            header, body = f"<|im_start|>{m['role']}\n", m["content"] + "<|im_end|>\n"
        supervised = m["role"] == "assistant" and m.get("step_loss_mask", 1) == 1
        out.append((header, None))
        out.append((body, supervised))
    return out


def case(fmt, tok, messages):
    text, spans, at = "", [], 0
    for piece, supervised in pieces(fmt, messages):
        if supervised:
            spans.append((at, at + len(piece)))
        text += piece
        at += len(piece)
    enc = tok.encode(text, add_special_tokens=False)
    mask = [1 if any(b <= start < e for b, e in spans) else 0 for start, _ in enc.offsets]
    return {"format": fmt, "messages": messages, "text": text, "tokens": enc.ids, "loss_mask": mask}


def main():
    formats = {
        "qwen2.5": os.path.join(HERE, "qwen3-tokenizer", "tokenizer.json"),
        "llama3": os.path.join(ROOT, ".deps", "llama3-tokenizer", "tokenizer.json"),
    }
    out = os.path.join(HERE, "chat_formats_cases.jsonl")
    with open(out, "w") as f:
        for fmt, path in formats.items():
            tok = tokenizers.Tokenizer.from_file(path)
            for messages in CONVERSATIONS:
                f.write(json.dumps(case(fmt, tok, messages), ensure_ascii=False) + "\n")
    print(f"{2 * len(CONVERSATIONS)} cases -> {out}")


if __name__ == "__main__":
    main()
