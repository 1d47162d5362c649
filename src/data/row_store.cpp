#include "data/row_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/file_output.h"

namespace loom {

static_assert(std::endian::native == std::endian::little, "tokens.bin is little-endian int32, read in place");

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

constexpr const char* kTokensFile = "tokens.bin";
constexpr const char* kMaskFile = "loss_mask.bin";
constexpr const char* kManifestFile = "manifest.json";

bool is_row_store(const fs::path& dir) { return fs::exists(dir / kManifestFile) && fs::exists(dir / kTokensFile); }

// Maps a whole file read-only; size 0 maps nothing.
void* map_file(const std::string& path, size_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_input_error(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw_runtime_failure(path, std::string("fstat failed: ") + std::strerror(errno));
  }
  *size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (*size > 0) {
    map = ::mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw_runtime_failure(path, "mmap failed: " + why);
    }
  }
  ::close(fd);
  return map;
}

int64_t manifest_int(const ojson& m, const char* key, const std::string& where) {
  if (!m.contains(key) || !m[key].is_number_integer() || m[key].get<int64_t>() < 0)
    throw_input_error(where, std::string("field ") + key + " is missing or not a non-negative integer");
  return m[key].get<int64_t>();
}

}  // namespace

RowStoreWriter::RowStoreWriter(const std::string& dir, int64_t row_tokens)
    : dir_(dir), tmp_dir_(dir + ".tmp"), row_tokens_(row_tokens) {
  if (row_tokens < 1) throw_input_error("row_tokens", std::to_string(row_tokens) + ", expected at least 1");
  if (fs::exists(dir_) && !(fs::is_directory(dir_) && (fs::is_empty(dir_) || is_row_store(dir_))))
    throw_input_error(dir_, "exists and is not a row store; refusing to replace it");
  std::error_code ec;
  fs::remove_all(tmp_dir_, ec);  // what a failed build left
  if (!fs::create_directories(tmp_dir_, ec) && ec)
    throw_runtime_failure(tmp_dir_, "cannot create the folder: " + ec.message());
  tokens_out_ = std::make_unique<FileOutput>((fs::path(tmp_dir_) / kTokensFile).string());
  mask_out_ = std::make_unique<FileOutput>((fs::path(tmp_dir_) / kMaskFile).string());
}

RowStoreWriter::~RowStoreWriter() {
  if (tokens_out_ == nullptr) return;  // committed
  tokens_out_.reset();
  mask_out_.reset();
  std::error_code ec;
  fs::remove_all(tmp_dir_, ec);
}

void RowStoreWriter::append(const int32_t* tokens, const uint8_t* loss_mask) {
  const size_t n = static_cast<size_t>(row_tokens_);
  tokens_out_->write(tokens, n * sizeof(int32_t));
  mask_out_->write(loss_mask, n);
  sha_.update(tokens, n * sizeof(int32_t));
  sha_.update(loss_mask, n);
  for (size_t t = 0; t < n; ++t) mask_ones_ += loss_mask[t];
  ++rows_;
}

ojson RowStoreWriter::commit(const ojson& fields) {
  if (rows_ == 0) throw_input_error(dir_, "no rows to write: the input does not fill one row with a supervised target");
  tokens_out_->commit();
  mask_out_->commit();
  tokens_out_.reset();
  mask_out_.reset();
  ojson manifest = {{"format", kRowStoreFormat}};
  for (const auto& [key, value] : fields.items()) manifest[key] = value;
  manifest["rows"] = rows_;
  manifest["row_tokens"] = row_tokens_;
  manifest["padding_tokens"] = 0;
  manifest["supervised_token_ratio"] = static_cast<double>(mask_ones_) / static_cast<double>(rows_ * row_tokens_);
  manifest["rows_sha256"] = sha_.hex_digest();
  manifest["files"] = {{"tokens", kTokensFile}, {"loss_mask", kMaskFile}};
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
  fs::remove_all(old_dir, ec);
  const fs::path parent = fs::absolute(dir_).parent_path();
  file_sync_dir(parent.string());
  return manifest;
}

RowStore RowStore::open(const std::string& dir, const RowStoreExpect& expect) {
  const fs::path root(dir);
  const std::string manifest_path = (root / kManifestFile).string();
  std::ifstream in(manifest_path);
  if (!in) throw_input_error(manifest_path, "cannot open: not a row store (expected a folder from loom data build)");
  std::stringstream text;
  text << in.rdbuf();
  RowStore store;
  try {
    store.manifest_ = ojson::parse(text.str());
  } catch (const ojson::parse_error& e) {
    throw_input_error(manifest_path, std::string("not valid JSON: ") + e.what());
  }
  const ojson& m = store.manifest_;
  if (!m.is_object() || !m.contains("format") || m["format"] != kRowStoreFormat)
    throw_input_error(manifest_path, "field format is " + (m.is_object() && m.contains("format") ? m["format"].dump() : "missing") +
                                         ", expected \"" + kRowStoreFormat + "\"");
  store.rows_ = manifest_int(m, "rows", manifest_path);
  store.row_tokens_ = manifest_int(m, "row_tokens", manifest_path);
  if (store.rows_ == 0 || store.row_tokens_ == 0) throw_input_error(manifest_path, "rows and row_tokens must be positive");
  if (!m.contains("rows_sha256") || !m["rows_sha256"].is_string())
    throw_input_error(manifest_path, "field rows_sha256 is missing");
  if (expect.row_tokens && *expect.row_tokens != store.row_tokens_)
    throw_input_error(manifest_path, "row_tokens is " + std::to_string(store.row_tokens_) + ", the run's is " +
                                         std::to_string(*expect.row_tokens));
  if (expect.tokenizer_sha256) {
    if (!m.contains("tokenizer_sha256") || m["tokenizer_sha256"] != *expect.tokenizer_sha256)
      throw_input_error(manifest_path, "tokenizer check failed: the store was built with tokenizer files " +
                                           (m.contains("tokenizer_sha256") ? m["tokenizer_sha256"].dump() : "(none recorded)") +
                                           ", the run's are " + expect.tokenizer_sha256->dump());
  }
  const size_t cells = static_cast<size_t>(store.rows_ * store.row_tokens_);
  const std::string tokens_path = (root / kTokensFile).string(), mask_path = (root / kMaskFile).string();
  store.tokens_map_ = map_file(tokens_path, &store.tokens_bytes_);
  store.mask_map_ = map_file(mask_path, &store.mask_bytes_);
  store.tokens_ = static_cast<const int32_t*>(store.tokens_map_);
  store.loss_mask_ = static_cast<const uint8_t*>(store.mask_map_);
  if (store.tokens_bytes_ != cells * sizeof(int32_t))
    throw_input_error(tokens_path, "size check failed: " + std::to_string(store.tokens_bytes_) + " bytes, the manifest's " +
                                       std::to_string(store.rows_) + " rows × " + std::to_string(store.row_tokens_) +
                                       " tokens need " + std::to_string(cells * sizeof(int32_t)) + " (truncated or altered)");
  if (store.mask_bytes_ != cells)
    throw_input_error(mask_path, "size check failed: " + std::to_string(store.mask_bytes_) + " bytes, expected " +
                                     std::to_string(cells) + " (truncated or altered)");
  Sha256 sha;
  const size_t t = static_cast<size_t>(store.row_tokens_);
  for (int64_t r = 0; r < store.rows_; ++r) {
    const uint8_t* mask = store.row_mask_ptr(r);
    const int32_t* tokens = store.row_tokens_ptr(r);
    for (size_t k = 0; k < t; ++k) {
      if (mask[k] > 1)
        throw_input_error(mask_path, "mask check failed: row " + std::to_string(r) + " position " + std::to_string(k) +
                                         " is " + std::to_string(mask[k]) + ", expected 0 or 1");
      if (tokens[k] < 0 || (expect.vocab_size && tokens[k] >= *expect.vocab_size))
        throw_input_error(tokens_path, "token check failed: row " + std::to_string(r) + " position " + std::to_string(k) +
                                           " is " + std::to_string(tokens[k]) + ", outside the vocabulary");
    }
    if (expect.verify_rows_sha256) {
      sha.update(tokens, t * sizeof(int32_t));
      sha.update(mask, t);
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

RowStore::~RowStore() {
  if (tokens_map_ != nullptr) ::munmap(tokens_map_, tokens_bytes_);
  if (mask_map_ != nullptr) ::munmap(mask_map_, mask_bytes_);
}

RowStore::RowStore(RowStore&& o) noexcept { *this = std::move(o); }

RowStore& RowStore::operator=(RowStore&& o) noexcept {
  if (this == &o) return *this;
  if (tokens_map_ != nullptr) ::munmap(tokens_map_, tokens_bytes_);
  if (mask_map_ != nullptr) ::munmap(mask_map_, mask_bytes_);
  manifest_ = std::move(o.manifest_);
  rows_ = o.rows_;
  row_tokens_ = o.row_tokens_;
  tokens_ = o.tokens_;
  loss_mask_ = o.loss_mask_;
  tokens_map_ = std::exchange(o.tokens_map_, nullptr);
  mask_map_ = std::exchange(o.mask_map_, nullptr);
  tokens_bytes_ = o.tokens_bytes_;
  mask_bytes_ = o.mask_bytes_;
  return *this;
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
