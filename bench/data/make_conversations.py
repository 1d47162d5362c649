#!/usr/bin/env python3
"""Synthetic chat conversations for `loom data build` benchmarks: JSONL, ~SIZE bytes.

    python3 bench/data/make_conversations.py --bytes 1e9 --seed 1 --out /tmp/conv.jsonl

Message texts are random slices of real text this machine has (the license texts of
/usr/share/common-licenses, the Python standard library's sources) and of the tokenizer
test corpus (every script, emoji, marks), so the tokenizer sees prose, code and many
scripts in roughly natural proportions, not one repeated string. Each conversation has an
optional system message, 1 to 4 user/assistant turns, and sometimes reasoning_content or
a think block, like SFT data. One line in BAD_EVERY is malformed on purpose (so the
skipped counts are exercised at scale). Deterministic for a seed on a given machine.
"""
import argparse
import glob
import gzip
import json
import os
import random
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BAD_EVERY = 10007


def corpus():
    texts = []
    for pattern in ["/usr/share/common-licenses/*", os.path.join(sysconfig.get_paths()["stdlib"], "*.py")]:
        for path in sorted(glob.glob(pattern)):
            try:
                with open(path, encoding="utf-8") as f:
                    texts.append(f.read())
            except (UnicodeDecodeError, IsADirectoryError):
                pass
    with gzip.open(os.path.join(ROOT, "tests/data/tokenizer_corpus.jsonl.gz"), "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")[1:-1]
    texts.append("\n".join(json.loads(line)["text"] for line in lines if line.startswith('{"text"')))
    return "\n".join(texts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bytes", type=float, required=True, help="stop after this many bytes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    text = corpus()

    def snippet(lo, hi):
        n = rng.randint(lo, hi)
        start = rng.randrange(0, len(text) - n)
        return text[start:start + n]

    written, lines = 0, 0
    with open(args.out + ".tmp", "w", encoding="utf-8") as out:
        while written < args.bytes:
            lines += 1
            if lines % BAD_EVERY == 0:
                line = '{"messages": [{"role": "user", "content": "cut short'
            else:
                messages = []
                if rng.random() < 0.3:
                    messages.append({"role": "system", "content": snippet(20, 200)})
                for _ in range(rng.randint(1, 4)):
                    messages.append({"role": "user", "content": snippet(20, 1500)})
                    answer = {"role": "assistant", "content": snippet(50, 3000)}
                    if rng.random() < 0.2:
                        answer["reasoning_content"] = snippet(50, 1500)
                    messages.append(answer)
                line = json.dumps({"messages": messages}, ensure_ascii=False)
            out.write(line + "\n")
            written += len(line.encode("utf-8")) + 1
    os.replace(args.out + ".tmp", args.out)
    print(f"{args.out}: {written} bytes, {lines} lines")


if __name__ == "__main__":
    main()
