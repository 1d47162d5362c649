#!/usr/bin/env python3
"""Generates tests/data/chat_cases.jsonl: Qwen3 chat renderings, tokens and loss masks.

The oracle for src/data/chat.h. Run at development time only; the output is committed and
read by tests/data/test_chat.cpp:

    /opt/goldenv/bin/python tests/data/chat_reference.py     # transformers + tokenizers

For each conversation (hand-written cases for every branch of the template, then seeded
random ones) it records:
  rendered       transformers' apply_chat_template(messages, tools=..., tokenize=False);
  rendered_gen   the same with add_generation_prompt=True;
  tokens, loss_mask  slime's gen_multi_turn_loss_mask_qwen3 (slime/utils/mask_utils.py,
                 THUDM/slime), restated below on top of transformers' apply_chat_template.
"""
import json
import os
import random

from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 7


class Qwen3LossMask:
    """slime's MultiTurnLossMaskGenerator, tokenizer_type "qwen3"."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.system_message_length, self.gen_token_length = self._system_message_length()

    def _ids(self, messages, **kw):
        return self.tok.apply_chat_template(messages, tokenize=True, return_dict=False, **kw)

    def _system_message_length(self):
        test_string = "FOR TESTING ONLY"
        msgs = [{"role": "user", "content": test_string}] * 2
        raw = self.tok(test_string, add_special_tokens=False)["input_ids"]
        text = self.tok.apply_chat_template(msgs, add_special_tokens=False, tokenize=False)
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        at = [i for i in range(len(ids) - len(raw) + 1) if ids[i:i + len(raw)] == raw]
        idx_1, idx_2 = at
        end_interval = len(ids) - len(raw) - idx_2
        gen = len(self._ids(msgs, add_special_tokens=False, add_generation_prompt=True)) - len(ids)
        return idx_1 - ((idx_2 - idx_1) - end_interval - len(raw)), gen

    def __call__(self, messages, tools=None):
        tokens, mask = [], []
        prefix = {"role": "user", "content": "FOR CALCULATING LOSS MASK ONLY"}
        prefix_ids = self._ids([prefix])
        i = 0
        while i < len(messages):
            message = messages[i]
            end = i + 1
            if message["role"] == "tool":
                while end < len(messages) and messages[end]["role"] == "tool":
                    end += 1
            group = messages[i:end]
            if i == 0:
                ids = self._ids(group + [prefix], tools=tools)[: -len(prefix_ids)]
            else:
                ids = self._ids([prefix] + group)[len(prefix_ids):]
            if message["role"] != "system" and i > 0:
                ids = ids[self.system_message_length:]
            if message["role"] == "assistant":
                m = [0] * self.gen_token_length + [1] * (len(ids) - self.gen_token_length)
            else:
                m = [0] * len(ids)
            if message.get("step_loss_mask", 1) != 1:
                m = [0] * len(ids)
            tokens += ids
            mask += m
            i = end
        return tokens, mask


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city, in °C — «now».",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer",
                   "minimum": 1, "maximum": 1e16, "default": 0.5, "scale": 1e-05}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "q": {"type": "string", "description": "quote \" backslash \\ tab \t newline \n ctrl \u0001"}}}}}


def u(content, **kw):
    return {"role": "user", "content": content, **kw}


def a(content, **kw):
    return {"role": "assistant", "content": content, **kw}


def s(content):
    return {"role": "system", "content": content}


def t(content):
    return {"role": "tool", "content": content}


def call(name, arguments, wrap=True):
    c = {"name": name, "arguments": arguments}
    return {"type": "function", "function": c} if wrap else c


CASES = [
    {"messages": [u("Hi"), a("Hello!")]},
    {"messages": [s("You are terse."), u("2+2?"), a("4")]},
    {"messages": [s("Sys"), u("q1"), a("a1"), u("q2"), a("a2")]},
    {"messages": [u("q"), a("<think>\nLet me think.\n</think>\n\nThe answer.")]},
    {"messages": [u("q"), a("<think>r1</think>a1"), u("q2"), a("<think>\n\nr2\n\n</think>\n\n\na2")]},
    {"messages": [u("q"), a("answer", reasoning_content="because\n")]},
    {"messages": [u("q"), a("ans", reasoning_content=""), u("q2"), a("ans2", reasoning_content="deep")]},
    {"messages": [u("q"), a("x</think>y</think>z")]},
    {"messages": [u("q"), a("<think>a<think>b</think>c")]},
    {"messages": [u("q"), a("content with </think> but reasoning given", reasoning_content="r")]},
    {"messages": [u("q"), a("a", thinking="from thinking"), u("q2"), a("b", reasoning="from reasoning")]},
    {"messages": [a("I start the conversation."), u("ok"), a("fine")]},
    {"messages": [u("q"), s("late system"), a("a")]},
    {"messages": [s("S"), u("weather?"), a("", tool_calls=[call("get_weather", {"city": "Paris", "days": 2})]),
                  t("{\"temp\": 21}"), a("It is 21 °C.")], "tools": [WEATHER]},
    {"messages": [u("two calls"), a("Let me check.", tool_calls=[call("get_weather", {"city": "Oslo"}),
                                                                  call("search", "{\"q\": \"raw string\"}")]),
                  t("r1"), t("r2"), t("r3"), a("<think>\ncombine\n</think>\n\nDone.")], "tools": [WEATHER, SEARCH]},
    {"messages": [u("q"), a("", tool_calls=[call("search", {"q": "x", "n": 1.0, "f": [1, 2.5, None, True]},
                                                wrap=False)]), t("<tool_response>nested</tool_response>"),
                  a("final")]},
    {"messages": [u("q"), a("", tool_calls=[call("search", {"q": "a"})]), u("<tool_response>\nr\n</tool_response>"),
                  a("<think>multi-step</think>after tool")]},
    {"messages": [t("a tool first"), u("q"), a("a")]},
    {"messages": [s("only tools system")], "tools": [SEARCH]},
    {"messages": [u("q"), a("masked", step_loss_mask=0), u("q2"), a("kept", step_loss_mask=1)]},
    {"messages": [u("Unicode: café, 中文, emoji 👍🏽, marks e\u0301, <|im_end|> inside")]},
    {"messages": [u("q"), a("\n\nleading newlines and trailing\n\n")]},
    {"messages": [u(""), a("")]},
    {"messages": [u("q"), a("", reasoning_content="\nonly reasoning\n")]},
    {"messages": [s("sys"), t("t1"), t("t2")]},
]

WORDS = ["hello", "world", "the", "answer", "is", "42", "Paris", "über", "中文", "👍", "\n", "  ", "code()",
         "<think>", "</think>", "<tool_response>", "</tool_response>", "x=1;", "'s", "\t"]


def random_text(rng, n):
    return "".join(rng.choice(WORDS) + rng.choice(["", " ", " ", "\n"]) for _ in range(rng.randint(0, n)))


def random_case(rng):
    messages = []
    if rng.random() < 0.5:
        messages.append(s(random_text(rng, 8)))
    for _ in range(rng.randint(1, 5)):
        messages.append(u(random_text(rng, 10)))
        r = rng.random()
        if r < 0.3:
            messages.append(a(random_text(rng, 10)))
        elif r < 0.55:
            messages.append(a(f"<think>{random_text(rng, 6)}</think>{random_text(rng, 8)}"))
        elif r < 0.75:
            messages.append(a(random_text(rng, 8), reasoning_content=random_text(rng, 6)))
        else:
            calls = [call(rng.choice(["get_weather", "search"]),
                          {"city": random_text(rng, 2), "n": rng.randint(0, 9)} if rng.random() < 0.7
                          else json.dumps({"q": random_text(rng, 3)}))
                     for _ in range(rng.randint(1, 3))]
            messages.append(a(random_text(rng, 4), tool_calls=calls))
            for _ in range(rng.randint(1, 3)):
                messages.append(t(random_text(rng, 6)))
            messages.append(a(random_text(rng, 6)))
        if rng.random() < 0.2:
            messages[-1]["step_loss_mask"] = 0
    case = {"messages": messages}
    if rng.random() < 0.4:
        case["tools"] = [WEATHER, SEARCH][: rng.randint(1, 2)]
    return case


def main():
    tok = AutoTokenizer.from_pretrained(os.path.join(HERE, "qwen3-tokenizer"))
    masker = Qwen3LossMask(tok)
    rng = random.Random(SEED)
    cases = CASES + [random_case(rng) for _ in range(150)]
    out = os.path.join(HERE, "chat_cases.jsonl")
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        for case in cases:
            tools = case.get("tools")
            messages = case["messages"]
            tokens, mask = masker(messages, tools)
            record = {
                "conversation": case,
                "rendered": tok.apply_chat_template(messages, tools=tools, tokenize=False),
                "rendered_gen": tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                                        add_generation_prompt=True),
                "tokens": tokens, "loss_mask": mask,
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(out + ".tmp", out)
    print(f"{len(cases)} conversations -> {out} (system_message_length {masker.system_message_length}, "
          f"gen_token_length {masker.gen_token_length})")


if __name__ == "__main__":
    main()
