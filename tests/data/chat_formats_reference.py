#!/usr/bin/env python3
"""Writes tests/data/chat_formats_cases.jsonl: conversations in the llama3 and qwen2.5 chat
formats (src/data/chat_formats.h), their rendered text, HF tokenizers' ids of that text and
the `assistant` loss mask, derived here independently from the ids' character offsets.

    .venv/bin/python tests/data/chat_formats_reference.py \
        --qwen25-template Qwen2.5-7B-Instruct/tokenizer_config.json \
        --llama31-template Llama-3.1-8B-Instruct/tokenizer_config.json

needs transformers and tokenizers (scripts/python_env.sh), Llama 3's tokenizer.json in
.deps/llama3-tokenizer (scripts/setup.sh), and the two families' chat templates: the
tokenizer_config.json of a Qwen2.5-*-Instruct and of a Llama-3.1-*-Instruct checkpoint (or
the template alone as a .jinja file). They are not in the repository (Llama's is under
Meta's license); the cases record each template's sha256.

Conversations with tools (TOOL_CASES) are rendered by transformers' apply_chat_template with
those templates: the text is theirs, and an assistant message's supervised span runs from
the end of its header to the end of its text, both found by rendering the conversation up
to the message before it and up to it. Before rendering, an arguments string holding a JSON
object (OpenAI's form) is decoded, as loom does for these formats (the templates write
arguments with tojson and would quote the string), and empty tools lists and tool_calls are
left out (Llama 3.1's template tests the key). The conversations without tools are rendered
by the restatement below; for qwen2.5 the Qwen2.5 template renders them too and must agree.

The formats, as docs/data.md states them:
  llama3   "<|begin_of_text|>" + per message
           "<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>"
  qwen2.5  per message "<|im_start|>{role}\\n{content}<|im_end|>\\n", Qwen2.5's default system
           message first when the conversation has none.
Mask: a token is 1 when it starts at or after an assistant message's content and before
the end of that message's text (content, end token, and "\\n" for qwen2.5), and that message
has step_loss_mask 1; else 0.
"""
import argparse
import copy
import hashlib
import json
import os

import tokenizers
from transformers import PreTrainedTokenizerFast

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


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city, in °C — «now».",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer",
                   "minimum": 1, "maximum": 1e16, "default": 0.5}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "q": {"type": "string", "description": "quote \" backslash \\ tab \t newline \n"}, "tags": {"type": "array"}}}}}


def openai_call(name, arguments, call_id="call_1"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool(content, call_id="call_1"):
    return {"role": "tool", "tool_call_id": call_id, "content": content}


# (formats, conversation): tool calls and results, as OpenAI's API and the Hub's tool data
# write them.
TOOL_CASES = [
    (["qwen2.5", "llama3"], {"messages": [
        {"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None,
         "tool_calls": [openai_call("get_weather", "{\"city\": \"Paris\", \"days\": 2}")]},
        tool("{\"temp\": 21, \"sky\": \"clear\"}"), {"role": "assistant", "content": "It is 21 °C and clear."}],
        "tools": [WEATHER]}),
    (["qwen2.5", "llama3"], {"messages": [
        {"role": "user", "content": "  Find «café» recipes\n"},
        {"role": "assistant", "content": "",
         "tool_calls": [openai_call("search", {"q": "café", "n": 1.0, "f": [1, 2.5, None, True], "o": {}})]},
        tool("[\"r1\", \"r2\"]"), {"role": "assistant", "content": "\u3000Two found.\n\n"}],
        "tools": [SEARCH, WEATHER]}),
    (["qwen2.5", "llama3"], {"messages": [
        {"role": "user", "content": "no tools list, a call anyway"},
        {"role": "assistant", "content": None, "tool_calls": [openai_call("search", "not a JSON object")]},
        tool("plain text result"), {"role": "user", "content": "thanks"}, {"role": "assistant", "content": "ok"}]}),
    (["qwen2.5", "llama3"], {"messages": [
        {"role": "system", "content": "  padded system  "}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "step_loss_mask": 0,
         "tool_calls": [openai_call("get_weather", {"city": "Oslo"})]},
        tool("{}"), {"role": "assistant", "content": "done"}], "tools": [WEATHER]}),
    (["qwen2.5"], {"messages": [
        {"role": "user", "content": "two calls"},
        {"role": "assistant", "content": "Let me check both.",
         "tool_calls": [openai_call("get_weather", "{\"city\": \"Oslo\"}"),
                        openai_call("search", {"q": "x"}, "call_2")]},
        tool("r1"), tool("r2", "call_2"), tool("r3"), {"role": "assistant", "content": "Done."}],
        "tools": [WEATHER, SEARCH]}),
    (["qwen2.5"], {"messages": [
        {"role": "user", "content": "unwrapped call"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "search", "arguments": {"q": "y"}}]},
        tool("r"), {"role": "assistant", "content": "ok"}]}),
]

HEADERS = {"qwen2.5": "<|im_start|>assistant\n", "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n"}


def template_text(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        text = json.loads(text)["chat_template"]
    return text


def for_transformers(conversation):
    """The messages and tools as the templates are given them (the module docstring)."""
    messages = []
    for m in copy.deepcopy(conversation["messages"]):
        if not m.get("tool_calls"):
            m.pop("tool_calls", None)
        for call in m.get("tool_calls", []):
            f = call.get("function", call)
            if isinstance(f["arguments"], str):
                try:
                    decoded = json.loads(f["arguments"])
                except json.JSONDecodeError:
                    decoded = None
                if isinstance(decoded, dict):
                    f["arguments"] = decoded
        messages.append(m)
    return messages, conversation.get("tools") or None


def tool_case(fmt, tok, hf, template, conversation):
    messages, tools = for_transformers(conversation)
    render = lambda ms: hf.apply_chat_template(ms, tools=tools, chat_template=template, tokenize=False)  # noqa: E731
    text = render(messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or m.get("step_loss_mask", 1) != 1:
            continue
        before, upto = render(messages[:i]), render(messages[: i + 1])
        assert text.startswith(upto) and upto.startswith(before), (fmt, i)
        assert upto[len(before):].startswith(HEADERS[fmt]), (fmt, i, upto[len(before):])
        spans.append((len(before) + len(HEADERS[fmt]), len(upto)))
    enc = tok.encode(text, add_special_tokens=False)
    mask = [1 if any(b <= start < e for b, e in spans) else 0 for start, _ in enc.offsets]
    out = {"format": fmt, "messages": conversation["messages"]}
    if "tools" in conversation:
        out["tools"] = conversation["tools"]
    return {**out, "text": text, "tokens": enc.ids, "loss_mask": mask}


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qwen25-template", required=True, help="Qwen2.5-*-Instruct tokenizer_config.json")
    parser.add_argument("--llama31-template", required=True, help="Llama-3.1-*-Instruct tokenizer_config.json")
    args = parser.parse_args()
    templates = {"qwen2.5": template_text(args.qwen25_template), "llama3": template_text(args.llama31_template)}
    paths = {
        "qwen2.5": os.path.join(HERE, "qwen3-tokenizer", "tokenizer.json"),
        "llama3": os.path.join(ROOT, ".deps", "llama3-tokenizer", "tokenizer.json"),
    }
    out = os.path.join(HERE, "chat_formats_cases.jsonl")
    n = 0
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        for fmt, path in paths.items():
            tok = tokenizers.Tokenizer.from_file(path)
            hf = PreTrainedTokenizerFast(tokenizer_file=path, bos_token="<|begin_of_text|>")
            sha = hashlib.sha256(templates[fmt].encode()).hexdigest()
            for messages in CONVERSATIONS:
                c = case(fmt, tok, messages)
                if fmt == "qwen2.5":
                    assert hf.apply_chat_template(messages, chat_template=templates[fmt], tokenize=False) == c["text"]
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
                n += 1
            for formats, conversation in TOOL_CASES:
                if fmt in formats:
                    c = tool_case(fmt, tok, hf, templates[fmt], conversation)
                    f.write(json.dumps({**c, "template_sha256": sha}, ensure_ascii=False) + "\n")
                    n += 1
    os.replace(out + ".tmp", out)
    print(f"{n} cases -> {out}")


if __name__ == "__main__":
    main()
