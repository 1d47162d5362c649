#include "data/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <queue>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "data/pretokenizer.h"
#include "data/unicode.h"

namespace loom {
namespace {

using json = nlohmann::json;

constexpr size_t kShortSplit = 64;            // longer splits merge through a heap, as `tokenizers`
constexpr size_t kCacheMaxSplit = 256;        // longer splits are rare: not cached
constexpr size_t kCacheMaxEntries = 1 << 18;  // ~30 MB per thread at most, then cleared

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Each thread's merged splits of the tokenizer it last used.
struct SplitCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> index;
  std::vector<int32_t> pool;
};
thread_local SplitCache t_cache;

std::atomic<uint64_t> g_next_instance{1};

bool is_printable_byte(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

// The inverse of byte_level_char over all 256 bytes; -1 for any other character.
int byte_of_char(char32_t c) {
  static const std::vector<int> table = [] {
    std::vector<int> t(512, -1);
    for (int b = 0; b < 256; ++b) t[byte_level_char(static_cast<uint8_t>(b))] = b;
    return t;
  }();
  return c < table.size() ? table[c] : -1;
}

// What the ByteLevel decoder makes of a token string: each character's byte, or the
// string's own UTF-8 when a character is not one of the 256.
std::string byte_level_decode(const std::string& token) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    const int b = byte_of_char(utf8_decode(token, &i));
    if (b < 0) return token;
    bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

std::string field_path(const std::string& a, const std::string& b) {
  return a.empty() ? b : a + "." + b;
}

template <typename Json>
const Json& require(const Json& obj, const std::string& key, const std::string& where,
                    const std::string& path) {
  if (!obj.is_object() || !obj.contains(key))
    throw_input_error(where, "field " + field_path(path, key) + " is missing");
  return obj.at(key);
}

// A field that must equal `expected`; absent or null passes when `absent_ok` (it then
// means the default, which is `expected`).
template <typename Json>
void require_value(const Json& obj, const std::string& key, const std::type_identity_t<Json>& expected,
                   const std::string& where, const std::string& path, bool absent_ok = true) {
  if (!obj.contains(key) || obj.at(key).is_null()) {
    if (absent_ok) return;
    throw_input_error(where, "field " + field_path(path, key) + " is missing, expected " + expected.dump());
  }
  if (obj.at(key) != expected)
    throw_input_error(where, "field " + field_path(path, key) + " is " + obj.at(key).dump() + ", only " +
                                 expected.dump() + " is supported");
}

template <typename Json>
void require_type(const Json& obj, const std::string& type, const std::string& where,
                  const std::string& path) {
  if (!obj.is_object() || !obj.contains("type") || obj.at("type") != type)
    throw_input_error(where, "field " + path + " is " + obj.dump().substr(0, 200) +
                                 ", expected {\"type\": \"" + type + "\", ...}");
}

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return unicode_flags(utf8_decode(s, &i)) & kUnicodeWord;
}

bool starts_with_word(std::string_view s) {
  size_t i = 0;
  return !s.empty() && (unicode_flags(utf8_decode(s, &i)) & kUnicodeWord);
}

// Start of the white space that ends s (s.size() when there is none).
size_t trailing_space_start(std::string_view s) {
  size_t start = s.size();
  while (start > 0) {
    size_t i = start - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    size_t j = i;
    if (!(unicode_flags(utf8_decode(s, &j)) & kUnicodeSpace)) break;
    start = i;
  }
  return start;
}

size_t leading_space_length(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!(unicode_flags(utf8_decode(s, &j)) & kUnicodeSpace)) break;
    i = j;
  }
  return i;
}

// tokenizer.json is 11 MB. Parsed into a JSON type of this file's own, nlohmann's parser and
// the containers of its document are instantiated here only, so the optimisation
// CMakeLists.txt gives this file applies to them: unoptimised and under ASan, reading the
// file takes 15 s instead of about 1.
template <typename T, typename SFINAE = void>
struct TokenizerJsonSerializer : nlohmann::adl_serializer<T, SFINAE> {};
using TokenizerJson = nlohmann::basic_json<std::map, std::vector, std::string, bool, std::int64_t,
                                           std::uint64_t, double, std::allocator, TokenizerJsonSerializer>;

}  // namespace

char32_t byte_level_char(uint8_t byte) {
  if (is_printable_byte(byte)) return byte;
  char32_t n = 0;
  for (int b = 0; b < byte; ++b)
    if (!is_printable_byte(b)) ++n;
  return 256 + n;
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::filesystem::path file(path);
  if (std::filesystem::is_directory(file)) file /= "tokenizer.json";
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw_input_error(file.string(), "cannot open the file (expected a tokenizer.json or a folder with one)");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  TokenizerJson parsed;
  try {
    parsed = TokenizerJson::parse(text);
  } catch (const TokenizerJson::exception& e) {  // a syntax error, or a number too large (out_of_range)
    throw_input_error(file.string(), std::string("not valid JSON: ") + e.what());
  }
  return from_document(parsed, file.string());
}

Tokenizer Tokenizer::from_json(const json& root, const std::string& where) {
  return from_document(root, where);
}

template <typename Json>
Tokenizer Tokenizer::from_document(const Json& root, const std::string& where) {
  Tokenizer t;
  t.instance_ = g_next_instance.fetch_add(1);
  if (!root.is_object()) throw_input_error(where, "the top level is not a JSON object");

  const Json& normalizer = root.contains("normalizer") ? root.at("normalizer") : Json();
  if (normalizer.is_object() && normalizer.value("type", "") == "NFC") {
    t.nfc_ = true;
  } else if (!normalizer.is_null()) {
    throw_input_error(where, "field normalizer is " + normalizer.dump() +
                                 ", only {\"type\": \"NFC\"} or null is supported");
  }

  const Json& pre = require(root, "pre_tokenizer", where, "");
  const Json* steps = pre.is_object() && pre.value("type", "") == "Sequence"
                          ? &require(pre, "pretokenizers", where, "pre_tokenizer")
                          : nullptr;
  if (steps == nullptr || !steps->is_array() || steps->size() != 2)
    throw_input_error(where, "field pre_tokenizer is " + pre.dump().substr(0, 200) +
                                 ", expected a Sequence of a Split and a ByteLevel");
  const Json& split = (*steps)[0];
  require_type(split, "Split", where, "pre_tokenizer.pretokenizers[0]");
  const Json& pattern = require(split, "pattern", where, "pre_tokenizer.pretokenizers[0]");
  if (pattern.is_object() && pattern.contains("Regex") && pattern.at("Regex") == kQwenSplitPattern)
    t.number_digits_ = 1;
  else if (pattern.is_object() && pattern.contains("Regex") && pattern.at("Regex") == kLlama3SplitPattern)
    t.number_digits_ = 3;
  else
    throw_input_error(where, "field pre_tokenizer.pretokenizers[0].pattern is " + pattern.dump() +
                                 ", only the Qwen2/Qwen3 and Llama 3 split regexes are supported");
  require_value(split, "behavior", "Isolated", where, "pre_tokenizer.pretokenizers[0]", false);
  require_value(split, "invert", false, where, "pre_tokenizer.pretokenizers[0]");
  // ByteLevel's defaults are add_prefix_space = use_regex = true: both must be spelled out.
  require_type((*steps)[1], "ByteLevel", where, "pre_tokenizer.pretokenizers[1]");
  require_value((*steps)[1], "add_prefix_space", false, where, "pre_tokenizer.pretokenizers[1]", false);
  require_value((*steps)[1], "use_regex", false, where, "pre_tokenizer.pretokenizers[1]", false);
  // The ByteLevel decoder and post-processor leave ids alone whatever their options.
  if (root.contains("decoder") && !root.at("decoder").is_null())
    require_type(root.at("decoder"), "ByteLevel", where, "decoder");
  if (root.contains("post_processor") && !root.at("post_processor").is_null())
    require_type(root.at("post_processor"), "ByteLevel", where, "post_processor");

  const Json& model = require(root, "model", where, "");
  require_value(model, "type", "BPE", where, "model", false);
  require_value(model, "dropout", Json(), where, "model");
  require_value(model, "byte_fallback", false, where, "model");
  if (model.contains("ignore_merges") && !model.at("ignore_merges").is_boolean())
    throw_input_error(where, "field model.ignore_merges is not a boolean");
  t.ignore_merges_ = model.contains("ignore_merges") && model.at("ignore_merges").template get<bool>();
  require_value(model, "continuing_subword_prefix", "", where, "model");
  require_value(model, "end_of_word_suffix", "", where, "model");

  const Json& vocab = require(model, "vocab", where, "model");
  if (!vocab.is_object()) throw_input_error(where, "field model.vocab is not an object of token: id");
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.template get<int64_t>() < 0 || id.template get<int64_t>() >= INT32_MAX)
      throw_input_error(
          where, "field model.vocab[" + Json(token).dump() + "] is " + id.dump() + ", expected an id >= 0");
    max_id = std::max(max_id, id.template get<int32_t>());
    t.vocab_.emplace(token, id.template get<int32_t>());
  }
  const Json& added = root.contains("added_tokens") ? root.at("added_tokens") : Json::array();
  if (!added.is_array()) throw_input_error(where, "field added_tokens is not an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    const Json& a = added[i];
    AddedToken tok;
    const Json& id = require(a, "id", where, path);
    const Json& content = require(a, "content", where, path);
    if (!id.is_number_integer() || id.template get<int64_t>() < 0 || id.template get<int64_t>() >= INT32_MAX)
      throw_input_error(where, "field " + path + ".id is " + id.dump() + ", expected an id >= 0");
    if (!content.is_string() || content.template get<std::string>().empty())
      throw_input_error(where,
                        "field " + path + ".content is " + content.dump() + ", expected a non-empty string");
    tok.id = id.template get<int32_t>();
    tok.content = content.template get<std::string>();
    if (utf8_valid_prefix(tok.content) != tok.content.size())
      throw_input_error(where, "field " + path + ".content is not valid UTF-8");
    for (auto [key, flag] : {std::pair{"special", &tok.special},
                             {"single_word", &tok.single_word},
                             {"lstrip", &tok.lstrip},
                             {"rstrip", &tok.rstrip},
                             {"normalized", &tok.normalized}}) {
      // `tokenizers` defaults: normalized = !special, the rest false.
      *flag = std::string_view(key) == "normalized" ? !tok.special : false;
      if (a.contains(key)) {
        if (!a.at(key).is_boolean())
          throw_input_error(where, "field " + path + "." + key + " is not a boolean");
        *flag = a.at(key).template get<bool>();
      }
    }
    max_id = std::max(max_id, tok.id);
    t.added_by_content_[tok.content] = tok.id;
    t.added_.push_back(std::move(tok));
  }

  t.id_bytes_.assign(static_cast<size_t>(max_id) + 1, std::string());
  t.id_known_.assign(t.id_bytes_.size(), 0);
  t.id_special_.assign(t.id_bytes_.size(), 0);
  for (const auto& [token, id] : t.vocab_) {
    t.id_bytes_[static_cast<size_t>(id)] = byte_level_decode(token);
    t.id_known_[static_cast<size_t>(id)] = 1;
    if (t.ignore_merges_) t.whole_tokens_.emplace(t.id_bytes_[static_cast<size_t>(id)], id);
  }
  for (const AddedToken& tok : t.added_) {
    // An added token decodes from its normalised form when normalization changes it.
    const std::string form = tok.normalized && t.nfc_ ? unicode_nfc(tok.content) : tok.content;
    t.id_bytes_[static_cast<size_t>(tok.id)] = byte_level_decode(form);
    t.id_known_[static_cast<size_t>(tok.id)] = 1;
    t.id_special_[static_cast<size_t>(tok.id)] = tok.special;
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8_append(&ch, byte_level_char(static_cast<uint8_t>(b)));
    auto it = t.vocab_.find(ch);
    if (it == t.vocab_.end())
      throw_input_error(where, "field model.vocab lacks the byte-level token " + Json(ch).dump() +
                                   " of byte " + std::to_string(b));
    t.byte_id_[static_cast<size_t>(b)] = it->second;
  }

  const Json& merges = require(model, "merges", where, "model");
  if (!merges.is_array()) throw_input_error(where, "field model.merges is not an array");
  size_t slots = 1;
  while (slots < merges.size() * 2 + 16) slots <<= 1;
  t.merge_keys_.assign(slots, kEmptyKey);
  t.merge_values_.assign(slots, 0);
  t.merge_mask_ = slots - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& m = merges[rank];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.template get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        throw_input_error(
            where, "field model.merges[" + std::to_string(rank) + "] is " + m.dump() + ", expected \"A B\"");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].template get<std::string>();
      b = m[1].template get<std::string>();
    } else {
      throw_input_error(where, "field model.merges[" + std::to_string(rank) + "] is " + m.dump() +
                                   ", expected \"A B\" or [\"A\", \"B\"]");
    }
    auto ia = t.vocab_.find(a), ib = t.vocab_.find(b), iab = t.vocab_.find(a + b);
    if (ia == t.vocab_.end() || ib == t.vocab_.end() || iab == t.vocab_.end())
      throw_input_error(where, "field model.merges[" + std::to_string(rank) + "] " + m.dump() +
                                   " names a token that is not in model.vocab");
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) | static_cast<uint32_t>(ib->second);
    const uint64_t value = (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(iab->second);
    // A repeated pair takes its last rank, as `tokenizers` builds its merge map.
    for (uint64_t slot = hash_key(key) & t.merge_mask_;; slot = (slot + 1) & t.merge_mask_) {
      if (t.merge_keys_[slot] == kEmptyKey || t.merge_keys_[slot] == key) {
        t.merge_keys_[slot] = key;
        t.merge_values_[slot] = value;
        break;
      }
    }
  }
  t.build_added_sets();
  return t;
}

void Tokenizer::build_added_sets() {
  for (const AddedToken& tok : added_) {
    AddedSet& set = tok.normalized ? normalized_set_ : raw_set_;
    set.patterns.push_back(tok.normalized && nfc_ ? unicode_nfc(tok.content) : tok.content);
    set.tokens.push_back(static_cast<uint32_t>(&tok - added_.data()));
  }
  for (AddedSet* set : {&raw_set_, &normalized_set_}) {
    for (uint32_t i = 0; i < set->patterns.size(); ++i)
      set->by_first_byte[static_cast<unsigned char>(set->patterns[i][0])].push_back(i);
    for (auto& list : set->by_first_byte)
      std::stable_sort(list.begin(), list.end(), [&](uint32_t x, uint32_t y) {
        return set->patterns[x].size() > set->patterns[y].size();
      });
  }
}

void Tokenizer::find_added(std::string_view text, const AddedSet& set, std::vector<Match>* out) const {
  const size_t n = text.size();
  if (set.empty() || n == 0) {
    out->push_back({nullptr, 0, n});
    return;
  }
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < n) {
    // The leftmost position where a pattern starts, and its longest pattern there.
    size_t found = n;
    uint32_t which = 0;
    for (size_t i = pos; i < n && found == n; ++i) {
      for (uint32_t k : set.by_first_byte[static_cast<unsigned char>(text[i])]) {
        if (text.substr(i).starts_with(set.patterns[k])) {
          found = i;
          which = k;
          break;
        }
      }
    }
    if (found == n) break;
    const AddedToken* tok = &added_[set.tokens[which]];
    size_t start = found, stop = found + set.patterns[which].size();
    pos = stop;  // the search goes on after the match, kept or discarded
    if (tok->single_word) {
      const bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      const bool stop_space = stop == n || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (tok->lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (tok->rstrip) stop += leading_space_length(text.substr(stop));
    if (start_offset < start) out->push_back({nullptr, start_offset, start});
    out->push_back({tok, start, stop});
    start_offset = stop;
  }
  if (start_offset != n) out->push_back({nullptr, start_offset, n});
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  encode_append(text, &ids);
  return ids;
}

void Tokenizer::encode_append(std::string_view raw, std::vector<int32_t>* ids) const {
  std::string replaced;
  std::string_view text = raw;
  if (utf8_valid_prefix(raw) != raw.size()) {
    replaced = utf8_replace_invalid(raw);
    text = replaced;
  }
  std::vector<Match> pieces;
  find_added(text, raw_set_, &pieces);
  std::vector<Match> inner;
  std::string normalized;
  for (const Match& piece : pieces) {
    if (piece.token != nullptr) {
      ids->push_back(piece.token->id);
      continue;
    }
    std::string_view part = text.substr(piece.begin, piece.end - piece.begin);
    if (nfc_ && !unicode_nfc_quick_check(part)) {
      normalized = unicode_nfc(part);
      part = normalized;
    }
    if (normalized_set_.empty()) {
      encode_normalized_piece(part, ids);
      continue;
    }
    inner.clear();
    find_added(part, normalized_set_, &inner);
    for (const Match& m : inner) {
      if (m.token != nullptr) {
        ids->push_back(m.token->id);
      } else {
        encode_normalized_piece(part.substr(m.begin, m.end - m.begin), ids);
      }
    }
  }
}

void Tokenizer::encode_normalized_piece(std::string_view piece, std::vector<int32_t>* ids) const {
  thread_local std::vector<size_t> ends;
  ends.clear();
  pretokenize(piece, number_digits_, &ends);
  size_t begin = 0;
  for (size_t end : ends) {
    encode_split(piece.substr(begin, end - begin), ids);
    begin = end;
  }
}

void Tokenizer::encode_split(std::string_view bytes, std::vector<int32_t>* ids) const {
  if (bytes.size() == 1) {
    ids->push_back(byte_id_[static_cast<unsigned char>(bytes[0])]);
    return;
  }
  if (ignore_merges_) {
    // A split that is a token of the vocabulary as a whole is that token, merges or not.
    auto whole = whole_tokens_.find(std::string(bytes));
    if (whole != whole_tokens_.end()) {
      ids->push_back(whole->second);
      return;
    }
  }
  SplitCache& cache = t_cache;
  if (cache.owner != instance_) {
    cache.index.clear();
    cache.pool.clear();
    cache.owner = instance_;
  }
  const bool cacheable = bytes.size() <= kCacheMaxSplit;
  if (cacheable) {
    auto it = cache.index.find(bytes);
    if (it != cache.index.end()) {
      const int32_t* p = cache.pool.data() + it->second.first;
      ids->insert(ids->end(), p, p + it->second.second);
      return;
    }
  }
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  for (char c : bytes) symbols.push_back(byte_id_[static_cast<unsigned char>(c)]);
  merge_symbols(&symbols);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
  if (cacheable) {
    if (cache.index.size() >= kCacheMaxEntries) {
      cache.index.clear();
      cache.pool.clear();
    }
    cache.index.emplace(std::string(bytes), std::pair{static_cast<uint32_t>(cache.pool.size()),
                                                      static_cast<uint32_t>(symbols.size())});
    cache.pool.insert(cache.pool.end(), symbols.begin(), symbols.end());
  }
}

std::vector<int32_t> Tokenizer::bpe_merge(std::string_view bytes) const {
  std::vector<int32_t> symbols;
  for (char c : bytes) symbols.push_back(byte_id_[static_cast<unsigned char>(c)]);
  merge_symbols(&symbols);
  return symbols;
}

void Tokenizer::merge_symbols(std::vector<int32_t>* symbols_ptr) const {
  std::vector<int32_t>& s = *symbols_ptr;
  if (s.size() > kShortSplit) {
    merge_symbols_long(symbols_ptr);
    return;
  }
  // Short splits: the merge of each adjacent pair in an array, the lowest (rank, then
  // position) merged first; only the merged pair's neighbours change.
  uint64_t merges[kShortSplit];
  size_t n = s.size();
  for (size_t i = 0; i + 1 < n; ++i) merges[i] = merge_of(s[i], s[i + 1]);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (merges[i] < merges[best]) best = i;
    if (merges[best] == UINT64_MAX) break;
    s[best] = static_cast<int32_t>(merges[best] & 0xFFFFFFFFu);
    for (size_t i = best + 1; i + 1 < n; ++i) s[i] = s[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) merges[i] = merges[i + 1];
    --n;
    if (best > 0) merges[best - 1] = merge_of(s[best - 1], s[best]);
    if (best + 1 < n) merges[best] = merge_of(s[best], s[best + 1]);
  }
  s.resize(n);
}

void Tokenizer::merge_symbols_long(std::vector<int32_t>* symbols_ptr) const {
  std::vector<int32_t>& s = *symbols_ptr;
  const size_t n = s.size();
  // A linked list over positions and a min-heap of (rank, position) candidate merges;
  // stale candidates are skipped when popped (the pair there changed).
  std::vector<int64_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int64_t>(i + 1) : -1;
  }
  struct Candidate {
    uint32_t rank;
    size_t pos;
    int32_t id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](size_t pos) {
    if (next[pos] < 0) return;
    const uint64_t m = merge_of(s[pos], s[static_cast<size_t>(next[pos])]);
    if (m != UINT64_MAX)
      heap.push({static_cast<uint32_t>(m >> 32), pos, static_cast<int32_t>(m & 0xFFFFFFFFu)});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const size_t right = static_cast<size_t>(next[top.pos]);
    const uint64_t m = merge_of(s[top.pos], s[right]);
    if (m == UINT64_MAX || static_cast<int32_t>(m & 0xFFFFFFFFu) != top.id) continue;
    s[top.pos] = top.id;
    alive[right] = 0;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[static_cast<size_t>(next[right])] = static_cast<int64_t>(top.pos);
    if (prev[top.pos] >= 0) push(static_cast<size_t>(prev[top.pos]));
    push(top.pos);
  }
  size_t w = 0;
  for (size_t i = 0; i < n; ++i)
    if (alive[i]) s[w++] = s[i];
  s.resize(w);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !id_known_[static_cast<size_t>(id)])
      throw_input_error("decode", "id " + std::to_string(id) + " is not in the vocabulary (ids 0.." +
                                      std::to_string(vocab_size() - 1) + ")");
    if (skip_special && id_special_[static_cast<size_t>(id)]) continue;
    out += id_bytes_[static_cast<size_t>(id)];
  }
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end()) return it->second;
  if (auto it = vocab_.find(std::string(token)); it != vocab_.end()) return it->second;
  return std::nullopt;
}

}  // namespace loom
