// The Qwen2/Qwen3 and Llama 3 pre-tokenizer splits, hand-written: the regex of tokenizer.json
//
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
//
// (Llama 3's: \p{N}{1,3} for \p{N}, numbers in groups of up to three digits)
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

// The pattern strings this matcher implements, as tokenizer.json spells them.
extern const std::string_view kQwenSplitPattern;
extern const std::string_view kLlama3SplitPattern;

// Splits valid UTF-8 `text` into pieces: appends each piece's end offset (bytes) to *ends;
// piece k spans [ends[k-1], ends[k]) (the first begins at 0). Empty text gives no piece.
// `number_digits`: the most digits a number piece takes (1: Qwen's pattern, 3: Llama 3's).
void pretokenize(std::string_view text, int number_digits, std::vector<size_t>* ends);

}  // namespace loom
