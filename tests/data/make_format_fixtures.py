#!/usr/bin/env python3
"""Writes tests/data/formats/: the same conversations in each input format of
`loom data build --format` (src/data/input_formats.h), as JSONL and as Parquet, and what each
record means in the messages format, mapped here independently of loom:

    FORMAT.jsonl            the records, one a line
    FORMAT.parquet          the same records as a Parquet file (a column per key, list and
                            struct columns, a key a record lacks is a null; "tools"
                            as a JSON string, since struct columns sort its keys)
    FORMAT.messages.jsonl   each record as {"messages": [...], "tools": [...]?}
    binary_column.parquet   a column of a type that has no JSON form

    .venv/bin/python tests/data/make_format_fixtures.py      # needs pyarrow (scripts/python_env.sh)

tests/data/test_data_build.cpp builds the three files of each format and expects the same
rows. The mapping (docs/data.md): ShareGPT's "from" human/user → user, gpt/assistant →
assistant, system → system, observation/tool → tool, function_call → an assistant message
whose tool_calls are the JSON value's calls; a top-level "system" first; "tools" a list or its
JSON string. Alpaca: instruction and input joined by "\\n\\n" as the user message, output as the
assistant's. prompt/completion: strings → user + assistant; message lists → the prompt's
messages (its assistant messages with step_loss_mask 0) then the completion's.
"""
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "formats")

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}

SHAREGPT = [
    {"conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello! How can I help?"}]},
    {"system": "You are terse.",
     "conversations": [{"from": "user", "value": "2+2?"}, {"from": "assistant", "value": "4"},
                       {"from": "human", "value": "And 3+3?"}, {"from": "gpt", "value": "6"}]},
    {"conversations": [{"from": "system", "value": "Reply in French."}, {"from": "human", "value": "Thanks"},
                       {"from": "gpt", "value": "De rien — avec plaisir."}]},
    {"tools": json.dumps([WEATHER]),
     "conversations": [{"from": "human", "value": "Weather in Paris?"},
                       {"from": "function_call", "value": json.dumps({"name": "get_weather",
                                                                      "arguments": {"city": "Paris"}})},
                       {"from": "observation", "value": "{\"temp\": 21}"},
                       {"from": "gpt", "value": "It is 21 °C in Paris."}]},
    {"conversations": [{"from": "human", "value": "Look it up"},
                       {"from": "function_call", "value": json.dumps([{"name": "search", "arguments": {"q": "a"}},
                                                                      {"name": "search", "arguments": {"q": "b"}}])},
                       {"from": "tool", "value": "r1"}, {"from": "tool", "value": "r2"},
                       {"from": "gpt", "value": "Both found."}]},
]

ALPACA = [
    {"instruction": "Give three primary colours.", "input": "", "output": "Red, yellow and blue."},
    {"instruction": "Translate to German.", "input": "Good morning", "output": "Guten Morgen"},
    {"instruction": "Summarise the text.", "input": "Loom packs conversations into rows.\nIt trains on them.",
     "output": "Loom packs and trains.", "system": "You are a careful editor."},
    {"instruction": "Name a prime number greater than 10.", "output": "11"},
]

PROMPT_COMPLETION = [
    {"prompt": "The capital of France is", "completion": " Paris."},
    {"prompt": "Write a haiku about rain.", "completion": "Soft rain on the roof\nthe gutters hum their one note\nsleep comes "
                                                          "easily"},
    {"prompt": "", "completion": "An empty prompt."},
]

PROMPT_COMPLETION_CONVERSATIONAL = [
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Colour of the sky?"}],
     "completion": [{"role": "assistant", "content": "Blue."}]},
    {"prompt": [{"role": "user", "content": "What is 6 × 7?"}],
     "completion": [{"role": "assistant", "content": "42"}]},
]

MESSAGES = [
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
    {"messages": [{"role": "system", "content": "You are a weather bot."},
                  {"role": "user", "content": "Weather in Oslo?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "call_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}"},
                  {"role": "assistant", "content": "3 °C in Oslo."}],
     "tools": [WEATHER]},
    {"messages": [{"role": "user", "content": "Think first"},
                  {"role": "assistant", "content": "Done.", "reasoning_content": "Short thought."}]},
]


def from_sharegpt(r):
    roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
             "observation": "tool", "tool": "tool"}
    messages = [{"role": "system", "content": r["system"]}] if r.get("system") else []
    for turn in r["conversations"]:
        if turn["from"] == "function_call":
            calls = json.loads(turn["value"])
            calls = calls if isinstance(calls, list) else [calls]
            messages.append({"role": "assistant", "content": "",
                             "tool_calls": [{"type": "function", "function": c} for c in calls]})
        else:
            messages.append({"role": roles[turn["from"]], "content": turn["value"]})
    out = {"messages": messages}
    if r.get("tools"):
        out["tools"] = json.loads(r["tools"]) if isinstance(r["tools"], str) else r["tools"]
    return out


def from_alpaca(r):
    user = "\n\n".join(part for part in [r["instruction"], r.get("input") or ""] if part)
    messages = [{"role": "system", "content": r["system"]}] if r.get("system") else []
    return {"messages": messages + [{"role": "user", "content": user}, {"role": "assistant", "content": r["output"]}]}


def from_prompt_completion(r):
    if isinstance(r["prompt"], str):
        return {"messages": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["completion"]}]}
    prompt = [dict(m, step_loss_mask=0) if m["role"] == "assistant" else m for m in r["prompt"]]
    return {"messages": prompt + r["completion"]}


def write(name, records, to_messages, for_parquet=lambda r: r):
    with open(os.path.join(OUT, name + ".jsonl"), "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(os.path.join(OUT, name + ".messages.jsonl"), "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(to_messages(r), ensure_ascii=False) + "\n")
    rows = [for_parquet(r) for r in records]
    # A column per key of any record (Table.from_pylist would take the first record's alone).
    keys = list(dict.fromkeys(k for r in rows for k in r))
    table = pa.Table.from_pydict({k: [r.get(k) for r in rows] for k in keys})
    pq.write_table(table, os.path.join(OUT, name + ".parquet"), row_group_size=2)


def main():
    os.makedirs(OUT, exist_ok=True)
    write("sharegpt", SHAREGPT, from_sharegpt)
    write("alpaca", ALPACA, from_alpaca)
    write("prompt_completion", PROMPT_COMPLETION, from_prompt_completion)
    write("prompt_completion_conversational", PROMPT_COMPLETION_CONVERSATIONAL, from_prompt_completion)
    # Struct columns hold their keys in the schema's order (pyarrow's inference sorts them),
    # so the tools, whose key order the templates render, go to Parquet as a JSON string.
    write("messages", MESSAGES, lambda r: r, lambda r: dict(r, tools=json.dumps(r["tools"])) if "tools" in r else r)
    # A column whose type has no JSON form (binary): refused, naming the column.
    pq.write_table(pa.table({"instruction": pa.array([b"bytes"], type=pa.binary()), "output": ["x"]}),
                   os.path.join(OUT, "binary_column.parquet"))
    print(f"fixtures -> {OUT}")


if __name__ == "__main__":
    main()
