#include "data/row_store.h"

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/json_strict.h"
#include "io/file_output.h"

namespace loom {

static_assert(std::endian::native == std::endian::little, "tokens.bin is little-endian int32, read in place");

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

constexpr const char* kTokensFile = "tokens.bin";
constexpr const char* kMaskFile = "loss_mask.bin";
constexpr const char* kSamplesFile = "samples.bin";
constexpr const char* kManifestFile = "manifest.json";

bool is_row_store(const fs::path& dir) {
  return fs::exists(dir / kManifestFile) && fs::exists(dir / kTokensFile);
}

int64_t manifest_int(const ojson& m, const char* key, const std::string& where) {
  if (!m.contains(key) || !m[key].is_number_integer() || m[key].get<int64_t>() < 0)
    throw_input_error(where, std::string("manifest check failed: field ") + key +
                                 " is missing or not a non-negative integer");
  return m[key].get<int64_t>();
}

// The run's tokenizer files against the ones the store was built with: every file either
// side names must carry the same digest on both.
void check_tokenizer(const ojson& m, const ojson& run, const std::string& where) {
  if (!m.contains("tokenizer_sha256") || !m["tokenizer_sha256"].is_object())
    throw_input_error(
        where, "tokenizer check failed: the manifest records no tokenizer_sha256; the run's tokenizer is " +
                   run.dump());
  const ojson& built = m["tokenizer_sha256"];
  auto differs = [&](const std::string& file) {
    const std::string ours = built.contains(file) ? built[file].dump() : "absent";
    const std::string theirs = run.contains(file) ? run[file].dump() : "absent";
    if (ours != theirs)
      throw_input_error(where, "tokenizer check failed: " + file + " has sha256 " + theirs +
                                   " in the run's tokenizer, " + ours +
                                   " in the one the store was built with");
  };
  for (const auto& [file, digest] : run.items()) differs(file);
  for (const auto& [file, digest] : built.items()) differs(file);
}

}  // namespace

void row_bounds_hash(Sha256& sha, std::span<const int32_t> bounds) {
  const int32_t n = static_cast<int32_t>(bounds.size()) - 1;
  sha.update(&n, sizeof(n));
  sha.update(bounds.data(), bounds.size() * sizeof(int32_t));
}

void row_store_check_replaceable(const std::string& dir) {
  if (fs::exists(dir) && !(fs::is_directory(dir) && (fs::is_empty(dir) || is_row_store(dir))))
    throw_input_error(dir, "exists and is not a row store; refusing to replace it");
}

RowStoreWriter::RowStoreWriter(const std::string& dir, int64_t row_tokens, RowPacking packing)
    : dir_(dir), tmp_dir_(dir + ".tmp"), row_tokens_(row_tokens), packing_(packing) {
  if (row_tokens < 1 || row_tokens > kMaxRowTokens)
    throw_input_error("row_tokens",
                      std::to_string(row_tokens) + ", expected 1 to " + std::to_string(kMaxRowTokens));
  row_store_check_replaceable(dir_);
  std::error_code ec;
  fs::remove_all(tmp_dir_, ec);  // what a failed build left
  if (!fs::create_directories(tmp_dir_, ec) && ec)
    throw_runtime_failure(tmp_dir_, "cannot create the folder: " + ec.message());
  tokens_out_ = std::make_unique<FileOutput>((fs::path(tmp_dir_) / kTokensFile).string());
  mask_out_ = std::make_unique<FileOutput>((fs::path(tmp_dir_) / kMaskFile).string());
  if (packing_ == RowPacking::isolated)
    samples_out_ = std::make_unique<FileOutput>((fs::path(tmp_dir_) / kSamplesFile).string());
}

RowStoreWriter::~RowStoreWriter() {
  if (committed_) return;
  tokens_out_.reset();
  mask_out_.reset();
  samples_out_.reset();
  std::error_code ec;
  fs::remove_all(tmp_dir_, ec);
}

void RowStoreWriter::append(const int32_t* tokens, const uint8_t* loss_mask,
                            std::span<const int32_t> bounds) {
  const size_t n = static_cast<size_t>(row_tokens_);
  LOOM_ASSERT((packing_ == RowPacking::isolated) == !bounds.empty(), "sample bounds iff isolated packing");
  tokens_out_->write(tokens, n * sizeof(int32_t));
  mask_out_->write(loss_mask, n);
  sha_.update(tokens, n * sizeof(int32_t));
  sha_.update(loss_mask, n);
  for (size_t t = 0; t < n; ++t) mask_ones_ += loss_mask[t];
  if (packing_ == RowPacking::isolated) {
    LOOM_ASSERT(bounds.size() >= 2 && bounds.front() == 0 && bounds.back() <= row_tokens_,
                "bad sample bounds");
    const int32_t samples = static_cast<int32_t>(bounds.size()) - 1;
    samples_out_->write(&samples, sizeof(samples));
    samples_out_->write(bounds.data(), bounds.size() * sizeof(int32_t));
    row_bounds_hash(sha_, bounds);
    padding_tokens_ += row_tokens_ - bounds.back();
  }
  ++rows_;
}

ojson RowStoreWriter::commit(const ojson& fields) {
  LOOM_ASSERT(!committed_, "row store committed twice");
  if (rows_ == 0)
    throw_input_error(dir_, "no rows to write: the input does not fill one row with a supervised target");
  tokens_out_->commit();
  mask_out_->commit();
  const bool isolated = packing_ == RowPacking::isolated;
  if (isolated) samples_out_->commit();
  ojson manifest = {{"format", isolated ? kRowStoreFormatPacked : kRowStoreFormat}};
  manifest["packing"] = isolated ? "isolated" : "rows";
  manifest["rows"] = rows_;
  manifest["row_tokens"] = row_tokens_;
  manifest["padding_tokens"] = padding_tokens_;
  manifest["supervised_token_ratio"] =
      static_cast<double>(mask_ones_) / static_cast<double>(rows_ * row_tokens_);
  manifest["rows_sha256"] = sha_.hex_digest();
  manifest["files"] = {{"tokens", kTokensFile}, {"loss_mask", kMaskFile}};
  if (isolated) manifest["files"]["samples"] = kSamplesFile;
  for (const auto& [key, value] : fields.items()) {
    LOOM_ASSERT(!manifest.contains(key), "a builder field repeats a row store field: " + key);
    manifest[key] = value;
  }
  file_write_atomic((fs::path(tmp_dir_) / kManifestFile).string(), manifest.dump(2) + "\n");
  // Swap the new store in: an older one moves aside first and is removed after.
  const std::string old_dir = dir_ + ".old";
  std::error_code ec;
  fs::remove_all(old_dir, ec);
  if (fs::exists(dir_)) {
    fs::rename(dir_, old_dir, ec);
    if (ec) throw_runtime_failure(dir_, "cannot move the old row store aside: " + ec.message());
  }
  fs::rename(tmp_dir_, dir_, ec);
  if (ec) throw_runtime_failure(dir_, "cannot rename " + tmp_dir_ + " into place: " + ec.message());
  committed_ = true;
  fs::remove_all(old_dir, ec);
  file_sync_dir(fs::absolute(dir_).parent_path().string());
  return manifest;
}

RowStore RowStore::open(const std::string& dir, const RowStoreExpect& expect) {
  const fs::path root(dir);
  const std::string manifest_path = (root / kManifestFile).string();
  std::ifstream in(manifest_path);
  if (!in)
    throw_input_error(manifest_path, "cannot open: not a row store (expected a folder from loom data build)");
  std::stringstream text;
  text << in.rdbuf();
  RowStore store;
  try {
    StrictParsed<ojson> parsed = json_parse_strict<ojson>(text.str(), /*throw_invalid=*/true);
    if (parsed.duplicate)
      throw_input_error(manifest_path, "manifest check failed: found the key '" + *parsed.duplicate +
                                           "' a second time, expected each key once");
    store.manifest_ = std::move(parsed.value);
  } catch (const ojson::exception& e) {  // a syntax error, or a number too large (out_of_range)
    throw_input_error(manifest_path, std::string("manifest check failed: not valid JSON: ") + e.what());
  }
  const ojson& m = store.manifest_;
  if (!m.is_object() || !m.contains("format") ||
      (m["format"] != kRowStoreFormat && m["format"] != kRowStoreFormatPacked))
    throw_input_error(manifest_path,
                      "manifest check failed: field format is " +
                          (m.is_object() && m.contains("format") ? m["format"].dump() : "missing") +
                          ", expected \"" + kRowStoreFormat + "\" or \"" + kRowStoreFormatPacked + "\"");
  // loom-rows-1 is rows packing (its packing field is newer than the format); loom-rows-2
  // is isolated packing.
  const bool isolated = m["format"] == kRowStoreFormatPacked;
  const char* packing = isolated ? "isolated" : "rows";
  if ((isolated || m.contains("packing")) && (!m.contains("packing") || m["packing"] != packing))
    throw_input_error(manifest_path, "manifest check failed: field packing is " +
                                         (m.contains("packing") ? m["packing"].dump() : "missing") +
                                         ", expected \"" + packing + "\" for format " + m["format"].dump());
  store.rows_ = manifest_int(m, "rows", manifest_path);
  store.row_tokens_ = manifest_int(m, "row_tokens", manifest_path);
  if (store.rows_ == 0 || store.row_tokens_ == 0)
    throw_input_error(manifest_path, "manifest check failed: rows and row_tokens must be positive");
  if (store.rows_ > std::numeric_limits<int64_t>::max() / 4 / store.row_tokens_)
    throw_input_error(manifest_path, "manifest check failed: rows × row_tokens is too large");
  if (!m.contains("rows_sha256") || !m["rows_sha256"].is_string())
    throw_input_error(manifest_path, "manifest check failed: field rows_sha256 is missing or not a string");
  if (expect.row_tokens && *expect.row_tokens != store.row_tokens_)
    throw_input_error(manifest_path, "row_tokens check failed: the store's rows hold " +
                                         std::to_string(store.row_tokens_) + " tokens, the run's " +
                                         std::to_string(*expect.row_tokens) + " (workload.row_tokens)");
  if (expect.tokenizer_sha256) check_tokenizer(m, *expect.tokenizer_sha256, manifest_path);

  const size_t cells = static_cast<size_t>(store.rows_ * store.row_tokens_);
  const std::string tokens_path = (root / kTokensFile).string(), mask_path = (root / kMaskFile).string();
  store.tokens_file_ = MappedFile(tokens_path);
  store.mask_file_ = MappedFile(mask_path);
  if (store.tokens_file_.size() != cells * sizeof(int32_t))
    throw_input_error(tokens_path, "size check failed: " + std::to_string(store.tokens_file_.size()) +
                                       " bytes, the manifest's " + std::to_string(store.rows_) + " rows × " +
                                       std::to_string(store.row_tokens_) + " tokens need " +
                                       std::to_string(cells * sizeof(int32_t)) + " (truncated or altered)");
  if (store.mask_file_.size() != cells)
    throw_input_error(mask_path, "size check failed: " + std::to_string(store.mask_file_.size()) +
                                     " bytes, expected " + std::to_string(cells) + " (truncated or altered)");
  store.tokens_ = reinterpret_cast<const int32_t*>(store.tokens_file_.data());
  store.loss_mask_ = store.mask_file_.data();
  if (isolated) store.read_samples((root / kSamplesFile).string());

  Sha256 sha;
  const size_t t = static_cast<size_t>(store.row_tokens_);
  for (int64_t r = 0; r < store.rows_; ++r) {
    const uint8_t* mask = store.row_mask_ptr(r);
    const int32_t* tokens = store.row_tokens_ptr(r);
    for (size_t k = 0; k < t; ++k) {
      if (mask[k] > 1)
        throw_input_error(mask_path, "mask check failed: row " + std::to_string(r) + " position " +
                                         std::to_string(k) + " is " + std::to_string(mask[k]) +
                                         ", expected 0 or 1");
      if (tokens[k] < 0 || (expect.vocab_size && tokens[k] >= *expect.vocab_size))
        throw_input_error(
            tokens_path,
            "token check failed: row " + std::to_string(r) + " position " + std::to_string(k) + " is " +
                std::to_string(tokens[k]) + ", outside the vocabulary" +
                (expect.vocab_size ? " [0, " + std::to_string(*expect.vocab_size) + ")" : std::string()));
    }
    if (expect.verify_rows_sha256) {
      sha.update(tokens, t * sizeof(int32_t));
      sha.update(mask, t);
      if (isolated) row_bounds_hash(sha, store.row_bounds(r));
    }
  }
  if (expect.verify_rows_sha256) {
    const std::string actual = sha.hex_digest();
    if (actual != m["rows_sha256"].get<std::string>())
      throw_input_error(dir, "rows_sha256 check failed: the rows hash to " + actual + ", the manifest says " +
                                 m["rows_sha256"].get<std::string>() + " (altered rows)");
  }
  return store;
}

void RowStore::read_samples(const std::string& path) {
  const MappedFile file(path);
  const size_t words = file.size() / sizeof(int32_t);
  if (file.size() % sizeof(int32_t) != 0)
    throw_input_error(path, "size check failed: " + std::to_string(file.size()) +
                                " bytes, not whole int32 values (truncated or altered)");
  std::vector<int32_t> data(words);
  if (words > 0) std::memcpy(data.data(), file.data(), words * sizeof(int32_t));
  sample_index_.assign(1, 0);
  size_t at = 0;
  for (int64_t r = 0; r < rows_; ++r) {
    const std::string where = "sample check failed: row " + std::to_string(r);
    if (at >= words) throw_input_error(path, "size check failed: no record for row " + std::to_string(r));
    const int64_t samples = data[at++];
    if (samples < 1 || samples > row_tokens_ || at + static_cast<size_t>(samples) + 1 > words)
      throw_input_error(path, where + " has " + std::to_string(samples) +
                                  " samples; expected 1 to row_tokens with their boundaries in the file");
    const int32_t* b = data.data() + at;
    for (int64_t k = 0; k <= samples; ++k) {
      const bool ok = k == 0 ? b[0] == 0 : b[k] > b[k - 1] && b[k] <= row_tokens_;
      if (!ok)
        throw_input_error(path,
                          where + " boundary " + std::to_string(k) + " is " + std::to_string(b[k]) +
                              "; expected b_0 = 0 < b_1 < ... ≤ row_tokens = " + std::to_string(row_tokens_));
    }
    const uint8_t* mask = row_mask_ptr(r);
    for (int64_t t = b[samples]; t < row_tokens_; ++t)
      if (mask[t] != 0)
        throw_input_error(
            path, where + " position " + std::to_string(t) + " is padding with loss mask 1; expected 0");
    sample_bounds_.insert(sample_bounds_.end(), b, b + samples + 1);
    sample_index_.push_back(static_cast<int64_t>(sample_bounds_.size()));
    at += static_cast<size_t>(samples) + 1;
  }
  if (at != words)
    throw_input_error(path, "size check failed: " + std::to_string(words - at) +
                                " int32 values after the last row's record (truncated or altered)");
}

ojson tokenizer_files_sha256(const std::string& path) {
  fs::path dir(path);
  if (!fs::is_directory(dir)) dir = dir.parent_path();
  ojson out = ojson::object();
  const fs::path tokenizer = dir / "tokenizer.json";
  if (!fs::exists(tokenizer)) throw_input_error(tokenizer.string(), "missing (expected a tokenizer folder)");
  out["tokenizer.json"] = sha256_file(tokenizer.string());
  const fs::path config = dir / "tokenizer_config.json";
  if (fs::exists(config)) out["tokenizer_config.json"] = sha256_file(config.string());
  return out;
}

}  // namespace loom
