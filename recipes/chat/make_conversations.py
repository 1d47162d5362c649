#!/usr/bin/env python3
"""Writes conversations.jsonl, the main job's chat data: 400 conversations, ~250 kB.

    python3 recipes/chat/make_conversations.py        # from the repository root or here

The texts are the machine's own: the docstrings and signatures of the Python standard
library's modules (read with `ast`, nothing imported) and the license texts of Debian's
/usr/share/common-licenses. Each conversation is what SFT data looks like to `loom data
build --loss-mask qwen3`: a system prompt in most, one to three user/assistant turns, and
reasoning before each answer, given three ways the Qwen3 template accepts: as
`reasoning_content`, as a `<think>...</think>` block at the start of `content`, or not at
all (the template then writes an empty think block). Questions are answerable from the
text (what a module is for, what a function does, how many parameters it takes, which
license a sentence is from), so a small model's loss falls as it trains.

Deterministic for a machine: sorted inputs, a fixed seed. Another Python version or
Debian release gives other texts; the committed file is the data, this script its source.
"""
import ast
import glob
import json
import os
import random
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
CONVERSATIONS = 400
SEED = 20261204

SYSTEM_PROMPTS = [
    "You are a concise assistant for Python programmers. Answer from the standard library's own documentation.",
    "You are a helpful assistant. Think step by step, then answer in one or two sentences.",
    "You answer questions about software licenses and the Python standard library. Be exact.",
    "You are loom's demo assistant: short answers, code names in backticks.",
]


def first_paragraph(doc, limit=400):
    paragraph = doc.strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in paragraph.splitlines())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def parameters(node):
    a = node.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return [n for n in names if n not in ("self", "cls")]


def stdlib_modules():
    """(module, summary, [(function, params, summary)]) for the stdlib's documented modules."""
    modules = []
    for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py"))):
        name = os.path.basename(path)[:-3]
        if name.startswith("_") or name == "this":
            continue
        try:
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, UnicodeDecodeError):
            continue
        doc = ast.get_docstring(tree)
        functions = []
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                fdoc = ast.get_docstring(node)
                if fdoc:
                    functions.append((node.name, parameters(node), first_paragraph(fdoc, 300)))
        if doc and functions:
            modules.append((name, first_paragraph(doc), functions))
    return modules


def license_sentences():
    """(license, sentence) pairs: sentences of 12 to 40 words from each license text."""
    pairs = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = " ".join(f.read().split())
        for sentence in text.split(". "):
            if 12 <= len(sentence.split()) <= 40:
                pairs.append((os.path.basename(path), sentence.strip() + "."))
    return pairs


def spelled(n):
    words = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    return words[n] if n < len(words) else str(n)


def listed(names):
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


class Writer:
    """Assistant turns with their reasoning in one of the three forms the template takes."""

    def __init__(self, rng):
        self.rng = rng

    def answer(self, reasoning, content):
        form = self.rng.random()
        if form < 0.5:
            return {"role": "assistant", "content": content, "reasoning_content": reasoning}
        if form < 0.85:
            return {"role": "assistant", "content": f"<think>\n{reasoning}\n</think>\n\n{content}"}
        return {"role": "assistant", "content": content}


def module_turns(w, module):
    name, summary, functions = module
    shown = w.rng.sample(functions, min(3, len(functions)))
    turns = [
        {"role": "user", "content": w.rng.choice([f"What is the `{name}` module for?",
                                                   f"What does Python's `{name}` module do?",
                                                   f"Explain the `{name}` module briefly."])},
        w.answer(f"The question is about the standard library module {name}. Its docstring begins: "
                 f"\"{summary[:160]}\". Public functions to name: {', '.join(f[0] for f in shown)}.",
                 f"`{name}`: {summary} Its functions include {listed([f[0] for f in shown])}."),
    ]
    for function, params, doc in shown[: w.rng.randint(0, 2)]:
        turns.append({"role": "user", "content": w.rng.choice([f"And `{function}`?",
                                                                f"What does `{name}.{function}` do?"])})
        turns.append(w.answer(f"{name}.{function}({', '.join(params)}) is documented as: \"{doc[:160]}\".",
                              f"`{name}.{function}({', '.join(params)})`: {doc}"))
    return turns


def parameter_turns(w, module):
    name, _, functions = module
    function, params, _ = w.rng.choice(functions)
    count = len(params)
    content = f"{spelled(count).capitalize()}: {listed(params)}." if count else "None: it takes no arguments."
    return [
        {"role": "user", "content": f"How many parameters does `{name}.{function}` take?"},
        w.answer(f"The signature is {function}({', '.join(params)}). Counting the parameters "
                 f"(self and cls excluded): {count}.", content),
    ]


def license_turns(w, pair):
    license, sentence = pair
    return [
        {"role": "user", "content": f"Which license text says: \"{sentence}\""},
        w.answer(f"This sentence is from the {license} text in /usr/share/common-licenses.",
                 f"The {license} license."),
    ]


def main():
    rng = random.Random(SEED)
    w = Writer(rng)
    modules, licenses = stdlib_modules(), license_sentences()
    lines = []
    for _ in range(CONVERSATIONS):
        messages = []
        if rng.random() < 0.8:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        kind = rng.random()
        if kind < 0.5:
            messages += module_turns(w, rng.choice(modules))
        elif kind < 0.8:
            messages += parameter_turns(w, rng.choice(modules))
            if rng.random() < 0.3:
                messages += parameter_turns(w, rng.choice(modules))
        else:
            messages += license_turns(w, rng.choice(licenses))
        lines.append(json.dumps({"messages": messages}, ensure_ascii=False))
    out = os.path.join(HERE, "conversations.jsonl")
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(out + ".tmp", out)
    print(f"{out}: {len(lines)} conversations, {os.path.getsize(out)} bytes")


if __name__ == "__main__":
    main()
