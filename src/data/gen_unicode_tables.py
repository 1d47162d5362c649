#!/usr/bin/env python3
"""Generates src/data/unicode_tables.cpp: the Unicode data the tokenizer needs.

Run at development time only (the output is committed):

    apt-get install unicode-data          # /usr/share/unicode: DerivedAge, PropList, ...
    pip install unicodedata2==16.0.0      # general categories of Unicode 16.0
    python3 src/data/gen_unicode_tables.py > src/data/unicode_tables.cpp

Two Unicode versions, each matching what Hugging Face `tokenizers` (the oracle) uses:
- Character classes (\\p{L}, \\p{N}, \\s) of the pre-tokenizer regex: Unicode 16.0, the
  version of the Oniguruma it bundles (a Unicode 16 letter such as U+105C0 is \\p{L}
  there, a Unicode 17 one is not).
- NFC: Unicode 9.0, the version of its normalizer (the unicode-normalization-alignments
  crate): a combining mark added after 9.0 (U+07FD, Unicode 11) has ccc 0 there. Unicode's
  normalization stability policy keeps the decomposition and combining class of an
  assigned character fixed, so 9.0's data is the current data restricted to the
  characters DerivedAge assigns by 9.0.

Tables (see unicode.h): a two-stage lookup of a flag byte per code point, a two-stage
lookup of the canonical combining class, the full canonical decompositions (Hangul
syllables are algorithmic and left out) and the primary composition pairs.
"""
import argparse
import os
import sys

import unicodedata2 as ud

FLAG_LETTER = 1
FLAG_NUMBER = 2
FLAG_SPACE = 4
FLAG_WORD = 8
FLAG_NFC_CHECK = 16
FLAG_DECOMPOSES = 32

NFC_VERSION = (9, 0)
HANGUL_S_BASE, HANGUL_S_COUNT = 0xAC00, 11172


def read_ranges(path, wanted=None):
    """Yields (first, last, value) from a UCD file of `range ; value # comment` lines."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            cps, value = (x.strip() for x in line.split(";")[:2])
            if wanted is not None and value != wanted:
                continue
            first, _, last = cps.partition("..")
            yield int(first, 16), int(last or first, 16), value


def code_points(ranges):
    return {cp for first, last, _ in ranges for cp in range(first, last + 1)}


def two_stage(values, name, ctype):
    """Emits stage1 (one block index per 256 code points) and stage2 (unique blocks)."""
    blocks, index, stage1 = [], {}, []
    for hi in range(0x110000 >> 8):
        block = tuple(values[(hi << 8) : (hi << 8) + 256])
        if block not in index:
            index[block] = len(blocks)
            blocks.append(block)
        stage1.append(index[block])
    assert len(blocks) < 256
    out = [f"const uint8_t {name}_stage1[{len(stage1)}] = {{"]
    out += wrap(stage1)
    out.append("};")
    out.append(f"const {ctype} {name}_stage2[{len(blocks) * 256}] = {{")
    for block in blocks:
        out += wrap(block)
    out.append("};")
    return out


def wrap(numbers, width=100):
    lines, line = [], "   "
    for n in numbers:
        item = f" {n},"
        if len(line) + len(item) > width:
            lines.append(line)
            line = "   "
        line += item
    if line.strip():
        lines.append(line)
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ucd", default="/usr/share/unicode", help="folder of UCD files")
    args = parser.parse_args()
    if ud.unidata_version != "16.0.0":
        sys.exit(f"unicodedata2 is Unicode {ud.unidata_version}; 16.0.0 is required")

    ucd = lambda name: os.path.join(args.ucd, name)  # noqa: E731
    white_space = code_points(read_ranges(ucd("PropList.txt"), "White_Space"))
    join_control = code_points(read_ranges(ucd("PropList.txt"), "Join_Control"))
    alphabetic = code_points(read_ranges(ucd("DerivedCoreProperties.txt"), "Alphabetic"))
    nfc_assigned = set()
    for first, last, age in read_ranges(ucd("DerivedAge.txt")):
        if tuple(int(x) for x in age.split(".")) <= NFC_VERSION:
            nfc_assigned.update(range(first, last + 1))

    flags = [0] * 0x110000
    ccc = [0] * 0x110000
    decompositions = {}
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        cat = ud.category(ch)
        f = 0
        if cat[0] == "L":
            f |= FLAG_LETTER
        if cat[0] == "N":
            f |= FLAG_NUMBER
        if cp in white_space:
            f |= FLAG_SPACE
        # Rust regex's \w (used by single_word added tokens): Alphabetic, marks, decimal
        # digits, connector punctuation, Join_Control. Alphabetic comes from the 15.0 UCD,
        # widened by the 16.0 letters and letter numbers it lacks.
        if cp in alphabetic or cat[0] in "LM" or cat in ("Nd", "Nl", "Pc") or cp in join_control:
            f |= FLAG_WORD
        if cp in nfc_assigned:
            ccc[cp] = ud.combining(ch)
            decomposition = ud.decomposition(ch)
            is_hangul = HANGUL_S_BASE <= cp < HANGUL_S_BASE + HANGUL_S_COUNT
            if decomposition and not decomposition.startswith("<") and not is_hangul:
                decompositions[cp] = [ord(c) for c in ud.normalize("NFD", ch)]
                f |= FLAG_DECOMPOSES
        flags[cp] = f

    # Primary composites: a canonical pair decomposition that NFC maps back to the character.
    compositions = {}
    for cp in sorted(decompositions):
        pair = ud.decomposition(chr(cp)).split()
        if len(pair) == 2:
            first, second = (int(x, 16) for x in pair)
            if ud.normalize("NFC", chr(first) + chr(second)) == chr(cp):
                compositions[(first, second)] = cp
    # NFC quick check is not "Yes" for a character that NFC changes (No) or that can join
    # the preceding one (Maybe: the second of a pair, Hangul vowel and trailing jamo), and
    # ccc != 0 characters need the ordering check: all of them go to the full algorithm.
    seconds = {second for _, second in compositions}
    for cp in nfc_assigned:
        if 0xD800 <= cp < 0xE000:
            continue
        changes = ud.normalize("NFC", chr(cp)) != chr(cp)
        jamo = 0x1161 <= cp <= 0x1175 or 0x11A8 <= cp <= 0x11C2
        if changes or cp in seconds or jamo or ccc[cp] != 0:
            flags[cp] |= FLAG_NFC_CHECK

    out = [
        "// Generated by src/data/gen_unicode_tables.py from unicodedata2 16.0.0 and the Debian",
        "// unicode-data UCD files (DerivedAge, PropList, DerivedCoreProperties). Do not edit.",
        "#include <cstdint>",
        "",
        '#include "data/unicode_tables.h"',
        "",
        "namespace loom::unicode_tables {",
        "",
    ]
    out += two_stage(flags, "flags", "uint8_t")
    out.append("")
    out += two_stage(ccc, "ccc", "uint8_t")
    out.append("")
    keys = sorted(decompositions)
    pool, offsets = [], []
    for cp in keys:
        offsets.append(len(pool))
        pool += decompositions[cp]
    offsets.append(len(pool))
    out.append(f"const uint32_t decomposition_cp[{len(keys)}] = {{")
    out += wrap(keys)
    out.append("};")
    out.append(f"const uint16_t decomposition_offset[{len(offsets)}] = {{")
    out += wrap(offsets)
    out.append("};")
    out.append(f"const uint32_t decomposition_pool[{len(pool)}] = {{")
    out += wrap(pool)
    out.append("};")
    out.append(f"const int decomposition_count = {len(keys)};")
    out.append("")
    pairs = sorted(compositions)
    out.append(f"const uint64_t composition_pair[{len(pairs)}] = {{")
    out += wrap([(a << 21) | b for a, b in pairs])
    out.append("};")
    out.append(f"const uint32_t composition_result[{len(pairs)}] = {{")
    out += wrap([compositions[p] for p in pairs])
    out.append("};")
    out.append(f"const int composition_count = {len(pairs)};")
    out.append("")
    out.append("}  // namespace loom::unicode_tables")
    print("\n".join(out))


if __name__ == "__main__":
    main()
