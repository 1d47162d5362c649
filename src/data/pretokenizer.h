// The Qwen2/Qwen3 pre-tokenizer split, hand-written: the regex of tokenizer.json
//
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
//
// with "Isolated" behaviour, as Oniguruma matches it: leftmost-first alternation, greedy
// quantifiers with backtracking. Every code point falls in some alternative and none
// matches the empty string, so the matches tile the text. Classes are unicode_flags()
// (Unicode 16.0, White_Space for \s); (?i) folds 's' to S and U+017F (long s) and the
// other letters to their ASCII case pair, as Oniguruma's case folding does.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace loom {

// The pattern string this matcher implements, as tokenizer.json spells it.
extern const std::string_view kQwenSplitPattern;

// Splits valid UTF-8 `text` into pieces: appends each piece's end offset (bytes) to *ends;
// piece k spans [ends[k-1], ends[k]) (the first begins at 0). Empty text gives no piece.
void pretokenize_qwen(std::string_view text, std::vector<size_t>* ends);

}  // namespace loom
