// The byte-level BPE tokenizer of a Hugging Face tokenizer.json (Qwen2/Qwen3 family),
// giving the ids `tokenizers` gives (tests/data checks it on a corpus of 10,000+ strings).
//
// encode(text), as `tokenizers` does it with add_special_tokens:
//   0. invalid UTF-8 becomes U+FFFD (unicode.h: maximal subparts);
//   1. added tokens with normalized=false are matched in the raw text (leftmost-longest,
//      honouring single_word, lstrip, rstrip);
//   2. each remaining piece is NFC-normalised (when tokenizer.json's normalizer is NFC) and
//      the added tokens with normalized=true are matched in it the same way;
//   3. each remaining piece is split by the pre-tokenizer regex (pretokenizer.h);
//   4. each split's bytes are merged by BPE: adjacent pairs merge lowest merge rank first,
//      leftmost among equals, until no pair of the merges list remains.
// No post-processing ids are added (Qwen's post_processor is ByteLevel, which adds none).
//
// decode(ids): the bytes of each token (byte-level inverse of the vocabulary's strings,
// an added token's content) concatenated: a prefix of a token sequence can end inside a
// UTF-8 sequence, so the result is bytes (utf8_replace_invalid makes it text).
//
// Supported tokenizer.json: model BPE (no dropout, no byte fallback, no subword prefix or
// suffix; ignore_merges either way: true, as Llama 3's, a split that is a vocabulary token
// as a whole is that token before any merge), normalizer NFC or none, pre_tokenizer the
// Sequence [Split(kQwenSplitPattern or kLlama3SplitPattern, Isolated),
// ByteLevel(add_prefix_space false, use_regex false)], decoder ByteLevel. Anything else is refused with an
// InputError naming the field.
//
// A Tokenizer is immutable after loading; encode and decode may run on many threads at
// once (each thread keeps its own cache of merged splits).
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace loom {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;      // skipped by decode(skip_special = true)
  bool single_word = false;  // matches only when no \w character touches it on either side
  bool lstrip = false;       // takes the white space before it
  bool rstrip = false;       // takes the white space after it
  bool normalized = false;   // matched in the normalised text, as its normalised content
};

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a folder holding one (an HF checkpoint folder).
  static Tokenizer load(const std::string& path);
  // `where` names the source in error messages.
  static Tokenizer from_json(const nlohmann::json& json, const std::string& where);

  std::vector<int32_t> encode(std::string_view text) const;
  void encode_append(std::string_view text, std::vector<int32_t>* ids) const;

  // Throws InputError for an id outside the vocabulary.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The id of a token given as tokenizer.json spells it (an added token's content, or a
  // vocabulary entry in its byte-level form such as "Ġthe").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // One past the largest id.
  int32_t vocab_size() const { return static_cast<int32_t>(id_bytes_.size()); }
  const std::vector<AddedToken>& added_tokens() const { return added_; }

  // The BPE merge of one pre-tokenizer split (its raw bytes), uncached: for tests.
  std::vector<int32_t> bpe_merge(std::string_view bytes) const;

 private:
  struct Match {
    const AddedToken* token;  // nullptr: plain text
    size_t begin, end;
  };
  // A set of added tokens matched leftmost-longest: the tokens of each first byte,
  // longest first.
  struct AddedSet {
    std::vector<std::string> patterns;
    std::vector<uint32_t> tokens;  // indices into added_
    std::vector<std::vector<uint32_t>> by_first_byte = std::vector<std::vector<uint32_t>>(256);
    bool empty() const { return patterns.empty(); }
  };

  Tokenizer() = default;
  // from_json for any nlohmann JSON type (load() reads into one of its own).
  template <typename Json>
  static Tokenizer from_document(const Json& root, const std::string& where);
  void build_added_sets();
  void find_added(std::string_view text, const AddedSet& set, std::vector<Match>* out) const;
  void encode_normalized_piece(std::string_view piece, std::vector<int32_t>* ids) const;
  void encode_split(std::string_view bytes, std::vector<int32_t>* ids) const;
  // Merges symbols in place (the heap form for long splits, as `tokenizers` does).
  void merge_symbols(std::vector<int32_t>* symbols) const;
  void merge_symbols_long(std::vector<int32_t>* symbols) const;

  // (rank << 32 | merged id) of the pair (a, b), or UINT64_MAX when it does not merge.
  uint64_t merge_of(int32_t a, int32_t b) const {
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    for (uint64_t slot = hash_key(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
      const uint64_t k = merge_keys_[slot];
      if (k == key) return merge_values_[slot];
      if (k == kEmptyKey) return UINT64_MAX;
    }
  }
  static uint64_t hash_key(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
  }
  static constexpr uint64_t kEmptyKey = UINT64_MAX;

  uint64_t instance_ = 0;  // identifies this tokenizer's data to the per-thread cache
  bool nfc_ = false;
  std::vector<std::string> id_bytes_;                      // the bytes each id decodes to
  std::vector<uint8_t> id_known_;                          // whether an id exists
  std::vector<uint8_t> id_special_;                        // whether an id is a special added token
  std::unordered_map<std::string, int32_t> vocab_;         // the model's tokens by their bytes
  int number_digits_ = 1;                                  // of the split regex (pretokenizer.h)
  bool ignore_merges_ = false;                             // a split in the vocabulary is one token
  std::unordered_map<std::string, int32_t> whole_tokens_;  // ignore_merges: tokens by raw bytes
  std::array<int32_t, 256> byte_id_{};                     // the token of each single byte
  std::vector<uint64_t> merge_keys_, merge_values_;        // open addressing, power of 2 slots
  uint64_t merge_mask_ = 0;
  std::vector<AddedToken> added_;
  std::unordered_map<std::string, int32_t> added_by_content_;
  AddedSet raw_set_, normalized_set_;
};

// The byte ↔ character map of byte-level BPE (GPT-2's bytes_to_unicode): printable
// bytes map to themselves, the rest to U+0100 onwards.
char32_t byte_level_char(uint8_t byte);

}  // namespace loom
