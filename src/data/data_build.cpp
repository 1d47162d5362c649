#include "data/data_build.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

#include "core/error.h"
#include "data/chat.h"
#include "data/chat_formats.h"
#include "data/input_formats.h"
#include "data/packer.h"
#include "data/parquet_records.h"
#include "data/row_store.h"
#include "data/sha256.h"
#include "data/unicode.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

constexpr std::array kProblems = {ChatProblem::invalid_utf8,       ChatProblem::malformed_json,
                                  ChatProblem::empty_conversation, ChatProblem::unknown_role,
                                  ChatProblem::non_string_content, ChatProblem::bad_tool_call};

// Whole lines of input file `file` (JSONL lines, or a Parquet file's rows written as JSON
// lines), read as `format`; first_line numbers its first line from 1.
struct Chunk {
  size_t file = 0;
  InputFormat format = InputFormat::messages;
  int64_t first_line = 0;
  std::string text;
  size_t input_bytes = 0;  // of the input file it stands for (the progress)
};

struct LineProblem {
  size_t file;
  int64_t line;
  ChatProblem kind;
  std::string detail;
};

struct ChunkResult {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;
  std::vector<uint64_t> lengths;  // of each usable conversation, in line order
  std::vector<LineProblem> problems;
  int64_t lines = 0;
  size_t bytes = 0;
};

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

ChunkResult tokenize_chunk(const Chunk& chunk, const ChatMasker& masker) {
  ChunkResult r;
  r.bytes = chunk.input_bytes;
  const std::string_view text = chunk.text;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(begin, end - begin);
    const int64_t line_number = chunk.first_line + r.lines++;
    begin = end + 1;
    if (is_blank(line)) continue;
    ParsedConversation parsed = input_line_parse(chunk.format, line);
    if (parsed.problem != ChatProblem::none) {
      r.problems.push_back({chunk.file, line_number, parsed.problem, std::move(parsed.detail)});
      continue;
    }
    std::string unsupported = masker.unsupported(parsed.conversation);
    if (!unsupported.empty()) {
      r.problems.push_back(
          {chunk.file, line_number, ChatProblem::tools_not_in_format, std::move(unsupported)});
      continue;
    }
    const TokenizedConversation t = masker.tokenize(parsed.conversation);
    r.tokens.insert(r.tokens.end(), t.tokens.begin(), t.tokens.end());
    r.loss_mask.insert(r.loss_mask.end(), t.loss_mask.begin(), t.loss_mask.end());
    r.lengths.push_back(t.tokens.size());
  }
  return r;
}

// Chunks go to `threads` workers; results come back in submission order. At most
// `max_in_flight` chunks are queued, being worked on or waiting to be taken, which bounds
// the memory. The destructor stops the workers (an exception on the way out).
class ChunkPipeline {
 public:
  ChunkPipeline(int threads, const ChatMasker& masker) : masker_(masker) {
    max_in_flight_ = static_cast<size_t>(2 * threads + 2);
    workers_.reserve(static_cast<size_t>(threads));  // so starting a thread is all that can fail below
    try {
      for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {
      // The destructor does not run for a constructor that throws, and a joinable thread
      // destroyed unjoined terminates the process: the started ones are stopped here, so the
      // error unwinds like any other and the scratch and .tmp folders are removed.
      stop();
      throw_runtime_failure("--threads " + std::to_string(threads),
                            "cannot start tokenizing thread " + std::to_string(workers_.size() + 1) + ": " +
                                e.what() + " (try fewer threads)");
    }
  }
  ~ChunkPipeline() { stop(); }
  ChunkPipeline(const ChunkPipeline&) = delete;
  ChunkPipeline& operator=(const ChunkPipeline&) = delete;

  bool full() const { return submitted_ - taken_ >= max_in_flight_; }
  bool empty() const { return submitted_ == taken_; }

  void submit(Chunk chunk) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back({submitted_, std::move(chunk)});
    }
    ++submitted_;
    work_ready_.notify_one();
  }

  // The next result in order: waits for it when `wait`, else nullopt when it is not done.
  std::optional<ChunkResult> take(bool wait) {
    std::unique_lock lock(mu_);
    if (wait) result_ready_.wait(lock, [this] { return error_ || done_.contains(taken_); });
    if (error_) std::rethrow_exception(error_);
    auto it = done_.find(taken_);
    if (it == done_.end()) return std::nullopt;
    ChunkResult r = std::move(it->second);
    done_.erase(it);
    ++taken_;
    return r;
  }

 private:
  void stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    work_ready_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void work() {
    for (;;) {
      std::pair<size_t, Chunk> job;
      {
        std::unique_lock lock(mu_);
        work_ready_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        ChunkResult r = tokenize_chunk(job.second, masker_);
        std::lock_guard lock(mu_);
        done_.emplace(job.first, std::move(r));
      } catch (...) {
        std::lock_guard lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
      result_ready_.notify_all();
    }
  }

  const ChatMasker& masker_;
  size_t max_in_flight_;
  size_t submitted_ = 0, taken_ = 0;  // touched by the submitting thread only
  std::mutex mu_;
  std::condition_variable work_ready_, result_ready_;
  std::deque<std::pair<size_t, Chunk>> queue_;
  std::map<size_t, ChunkResult> done_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Chunks of one input file, hashing every byte of it on the way (into its own digest and
// `total`, the digest of all the inputs in order).
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // The next chunk; nullopt at the end of the input.
  virtual std::optional<Chunk> next() = 0;
  virtual size_t bytes() const = 0;
  virtual int64_t lines() const = 0;  // JSONL lines, or Parquet rows
  virtual std::string hex_digest() = 0;
};

// Reads a JSONL file in chunks of whole lines (a line longer than a chunk makes its chunk
// longer).
class LineChunker final : public ChunkSource {
 public:
  LineChunker(const std::string& path, size_t chunk_bytes, Sha256& total)
      : path_(path), chunk_bytes_(chunk_bytes), total_(total) {
    file_ = std::fopen(path.c_str(), "rb");
    if (file_ == nullptr)
      throw_input_error(path, std::string("cannot open the input: ") + std::strerror(errno));
  }
  ~LineChunker() { std::fclose(file_); }
  LineChunker(const LineChunker&) = delete;
  LineChunker& operator=(const LineChunker&) = delete;

  std::optional<Chunk> next() override {
    std::string text = std::move(carry_);
    carry_.clear();
    for (;;) {
      if (eof_) break;
      const size_t old = text.size();
      text.resize(old + chunk_bytes_);
      const size_t n = std::fread(text.data() + old, 1, chunk_bytes_, file_);
      text.resize(old + n);
      sha_.update(text.data() + old, n);
      total_.update(text.data() + old, n);
      bytes_ += n;
      if (n < chunk_bytes_) {
        if (std::ferror(file_)) throw_runtime_failure(path_, "read failed");
        eof_ = true;
        break;
      }
      // The carry holds no newline, so the last one is in what was just read, if any.
      const size_t last = text.rfind('\n');
      if (last != std::string::npos) {
        carry_.assign(text, last + 1);
        text.resize(last + 1);
        break;
      }
    }
    if (text.empty()) return std::nullopt;
    Chunk chunk{0, InputFormat::messages, next_line_, std::move(text), 0};
    chunk.input_bytes = chunk.text.size();
    next_line_ += static_cast<int64_t>(std::count(chunk.text.begin(), chunk.text.end(), '\n'));
    if (chunk.text.back() != '\n') ++next_line_;
    return chunk;
  }

  size_t bytes() const override { return bytes_; }
  int64_t lines() const override { return next_line_ - 1; }
  std::string hex_digest() override { return sha_.hex_digest(); }

 private:
  std::string path_;
  size_t chunk_bytes_;
  Sha256& total_;
  std::FILE* file_ = nullptr;
  std::string carry_;
  bool eof_ = false;
  int64_t next_line_ = 1;
  size_t bytes_ = 0;
  Sha256 sha_;
};

// Reads a Parquet file's rows as chunks of JSON lines, one row a line, numbered from 1.
class ParquetChunker final : public ChunkSource {
 public:
  ParquetChunker(const std::string& path, size_t chunk_bytes, Sha256& total)
      : records_(path), chunk_bytes_(chunk_bytes) {
    // The digest is of the file's bytes, as a JSONL input's is.
    std::FILE* file = std::fopen(path.c_str(), "rb");
    if (file == nullptr)
      throw_input_error(path, std::string("cannot open the input: ") + std::strerror(errno));
    std::vector<char> buffer(size_t{1} << 20);
    while (const size_t n = std::fread(buffer.data(), 1, buffer.size(), file)) {
      sha_.update(buffer.data(), n);
      total.update(buffer.data(), n);
      bytes_ += n;
    }
    const bool failed = std::ferror(file) != 0;
    std::fclose(file);
    if (failed) throw_runtime_failure(path, "read failed");
  }

  std::optional<Chunk> next() override {
    Chunk chunk{0, InputFormat::messages, next_line_, {}, 0};
    ojson record;
    while (chunk.text.size() < chunk_bytes_ && records_.next(&record)) {
      try {
        chunk.text += record.dump(-1, ' ', false, ojson::error_handler_t::strict);
      } catch (const ojson::type_error&) {
        // A string that is not UTF-8 (Parquet's strings should be, a writer may not have
        // checked): a line of one byte that is never UTF-8, so that the row is skipped as
        // invalid_utf8 (or stops --strict) as a JSONL line with such bytes is.
        chunk.text += '\xFF';
      }
      chunk.text += '\n';
      ++next_line_;
    }
    if (chunk.text.empty()) return std::nullopt;
    // The file's bytes in proportion to the rows read, for the progress.
    const auto rows_total = static_cast<double>(std::max<int64_t>(records_.rows(), 1));
    const auto done =
        static_cast<size_t>(static_cast<double>(bytes_) * static_cast<double>(next_line_ - 1) / rows_total);
    chunk.input_bytes = std::min(done, bytes_) - progress_bytes_;
    progress_bytes_ += chunk.input_bytes;
    return chunk;
  }
  size_t bytes() const override { return bytes_; }
  int64_t lines() const override { return next_line_ - 1; }
  std::string hex_digest() override { return sha_.hex_digest(); }

 private:
  ParquetRecords records_;
  size_t chunk_bytes_;
  Sha256 sha_;
  size_t bytes_ = 0, progress_bytes_ = 0;
  int64_t next_line_ = 1;
};

// A scratch file written through stdio's buffer; errors become RuntimeFailure.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "wb");
    if (file_ == nullptr) throw_runtime_failure(path, std::string("cannot create: ") + std::strerror(errno));
  }
  ~ScratchFile() {
    if (file_ != nullptr) std::fclose(file_);
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  void write(const void* data, size_t size) {
    if (size > 0 && std::fwrite(data, 1, size, file_) != size)
      throw_runtime_failure(path_, std::string("write failed: ") + std::strerror(errno));
  }
  void close() {
    const int rc = std::fclose(file_);
    file_ = nullptr;
    if (rc != 0) throw_runtime_failure(path_, std::string("write failed: ") + std::strerror(errno));
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Reads byte ranges of a scratch file.
class ScratchReader {
 public:
  explicit ScratchReader(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw_runtime_failure(path, std::string("cannot open: ") + std::strerror(errno));
  }
  ~ScratchReader() { ::close(fd_); }
  ScratchReader(const ScratchReader&) = delete;
  ScratchReader& operator=(const ScratchReader&) = delete;
  void read(size_t offset, size_t size, void* out) const {
    auto* p = static_cast<char*>(out);
    while (size > 0) {
      const ssize_t n = ::pread(fd_, p, size, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw_runtime_failure(path_, "read failed or the file is shorter than its conversations");
      p += n;
      offset += static_cast<size_t>(n);
      size -= static_cast<size_t>(n);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// Removes a folder when it goes out of scope.
struct ScratchDir {
  explicit ScratchDir(std::string p) : path(std::move(p)) {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (!fs::create_directories(path, ec) && ec)
      throw_runtime_failure(path, "cannot create the scratch folder: " + ec.message());
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

struct SkipCounts {
  struct Kind {
    int64_t count = 0;
    std::vector<int64_t> first_lines;
    std::vector<size_t> first_files;
    std::string first_detail;
  };
  std::map<ChatProblem, Kind> kinds;
  int64_t total = 0;
  std::vector<std::string> files;  // several inputs: first_lines name "FILE:LINE"

  void add(const LineProblem& p) {
    Kind& k = kinds[p.kind];
    if (k.count == 0)
      k.first_detail =
          (files.size() > 1 ? files[p.file] + ":" + std::to_string(p.line) + ": " : "") + p.detail;
    if (k.first_lines.size() < kSkippedFirstLines) {
      k.first_lines.push_back(p.line);
      k.first_files.push_back(p.file);
    }
    ++k.count;
    ++total;
  }
  ojson to_json() const {
    ojson out = ojson::object();
    // tools_not_in_format only where it happened: the qwen3 format (every store written
    // before the other formats) never has it.
    std::vector<ChatProblem> listed(kProblems.begin(), kProblems.end());
    if (kinds.contains(ChatProblem::tools_not_in_format)) listed.push_back(ChatProblem::tools_not_in_format);
    for (ChatProblem problem : listed) {
      auto it = kinds.find(problem);
      ojson kind = {{"count", 0}, {"first_lines", ojson::array()}};
      if (it != kinds.end()) {
        kind["count"] = it->second.count;
        if (files.size() > 1) {
          for (size_t i = 0; i < it->second.first_lines.size(); ++i)
            kind["first_lines"].push_back(files[it->second.first_files[i]] + ":" +
                                          std::to_string(it->second.first_lines[i]));
        } else {
          kind["first_lines"] = it->second.first_lines;
        }
        kind["first_detail"] = it->second.first_detail;
      }
      out[chat_problem_name(problem)] = std::move(kind);
    }
    return out;
  }
};

// The cores this process may run on (its affinity mask, which a container's cpuset limits).
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

double file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  return static_cast<double>(st.st_size);
}

// The tokenized conversations of pass 1: conversation c spans [offsets[c], offsets[c + 1])
// of the scratch files.
struct Conversations {
  const std::vector<uint64_t>& offsets;
  const ScratchReader& tokens;
  const ScratchReader& mask;

  uint64_t length(uint64_t c) const { return offsets[c + 1] - offsets[c]; }
  // Its first `length` tokens and mask bytes, appended.
  void append(uint64_t c, uint64_t length, std::vector<int32_t>& t, std::vector<uint8_t>& m) const {
    const size_t at = t.size();
    t.resize(at + length);
    m.resize(at + length);
    tokens.read(offsets[c] * sizeof(int32_t), length * sizeof(int32_t), t.data() + at);
    mask.read(offsets[c], length, m.data() + at);
  }
};

struct PackResult {
  ojson fields;  // the manifest's counts of this store
};

// Packs `chosen` (conversation indices, in permutation order) into `writer` by o.packing.
PackResult pack(const DataBuildOptions& o, int32_t eos_id, const Conversations& source,
                std::span<const uint64_t> chosen, RowStoreWriter& writer) {
  PackResult result;
  uint64_t tokens_total = 0;
  for (uint64_t c : chosen) tokens_total += source.length(c);
  result.fields["conversations"] = chosen.size();
  result.fields["conversation_tokens"] = tokens_total;
  Progress progress("packing", static_cast<double>(chosen.size()), "conversations", o.progress);
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  if (o.packing == RowPacking::rows) {
    RowPacker packer(o.row_tokens, eos_id,
                     [&writer](const int32_t* t, const uint8_t* m) { writer.append(t, m); });
    for (size_t k = 0; k < chosen.size(); ++k) {
      tokens.clear();
      mask.clear();
      source.append(chosen[k], source.length(chosen[k]), tokens, mask);
      packer.add(tokens, mask);
      if ((k & 1023) == 0) progress.update(static_cast<double>(k));
    }
    const PackStats stats = packer.finish();
    result.fields["rows_without_target"] = stats.rows_without_target;
    result.fields["tail_tokens_dropped"] = stats.tail_tokens_dropped;
  } else {
    std::vector<uint64_t> lengths;
    for (uint64_t c : chosen) lengths.push_back(source.length(c));
    const IsolatedPlan plan = isolated_pack_plan(lengths, o.row_tokens, o.too_long, o.seed);
    const auto row_tokens = static_cast<size_t>(o.row_tokens);
    std::vector<int32_t> bounds;
    int64_t without_target = 0, placed = 0;
    for (const std::vector<uint64_t>& row : plan.rows) {
      tokens.clear();
      mask.clear();
      bounds.assign(1, 0);
      bool has_target = false;
      for (uint64_t i : row) {
        const size_t begin = tokens.size();
        source.append(chosen[i], std::min<uint64_t>(lengths[i], row_tokens), tokens, mask);
        // A sample's first token is no target.
        for (size_t t = begin + 1; t < tokens.size(); ++t) has_target = has_target || mask[t];
        bounds.push_back(static_cast<int32_t>(tokens.size()));
      }
      if (!has_target) {
        ++without_target;
        continue;
      }
      tokens.resize(row_tokens, eos_id);
      mask.resize(row_tokens, 0);
      writer.append(tokens.data(), mask.data(), bounds);
      placed += static_cast<int64_t>(row.size());
      progress.update(static_cast<double>(placed));
    }
    result.fields["rows_without_target"] = without_target;
    result.fields["too_long"] = o.too_long == TooLong::drop ? "drop" : "truncate";
    result.fields["too_long_dropped"] = plan.too_long_dropped;
    result.fields["too_long_truncated"] = plan.too_long_truncated;
  }
  progress.finish(static_cast<double>(chosen.size()));
  return result;
}

}  // namespace

std::vector<std::string> data_input_files(const std::vector<std::string>& inputs) {
  if (inputs.empty())
    throw_input_error("--input", "missing; expected a JSONL or Parquet file, or a folder of them");
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    if (fs::is_directory(input)) {
      std::vector<std::string> shards;
      for (const fs::directory_entry& e : fs::directory_iterator(input)) {
        const fs::path ext = e.path().extension();
        if (e.is_regular_file() && (ext == ".jsonl" || ext == ".parquet"))
          shards.push_back(e.path().string());
      }
      if (shards.empty())
        throw_input_error(input,
                          "a folder with no *.jsonl or *.parquet file; expected shards of conversations");
      std::sort(shards.begin(), shards.end());
      files.insert(files.end(), shards.begin(), shards.end());
    } else if (fs::is_regular_file(input)) {
      files.push_back(input);
    } else {
      throw_input_error(
          input,
          "not a file or folder (expected a JSONL or Parquet file of conversations, or a folder of them)");
    }
  }
  return files;
}

std::string data_eval_out(const DataBuildOptions& o) {
  return o.eval_out.empty() ? o.out + "-eval" : o.eval_out;
}

EosToken data_eos_token(const Tokenizer& tokenizer, const std::string& tokenizer_dir,
                        const std::string& override_content) {
  EosToken eos;
  std::string where = "--eos";
  if (!override_content.empty()) {
    eos.content = override_content;
  } else {
    fs::path dir(tokenizer_dir);
    if (!fs::is_directory(dir)) dir = dir.parent_path();
    where = (dir / "tokenizer_config.json").string();
    std::ifstream in(where);
    if (!in) throw_input_error(where, "cannot open it to read eos_token; pass --eos TOKEN");
    const ojson config = ojson::parse(in, nullptr, false);
    if (config.is_discarded() || !config.is_object()) throw_input_error(where, "not a JSON object");
    const ojson* value = config.contains("eos_token") ? &config["eos_token"] : nullptr;
    if (value != nullptr && value->is_object() && value->contains("content")) value = &(*value)["content"];
    if (value == nullptr || !value->is_string() || value->get<std::string>().empty())
      throw_input_error(where, "field eos_token is missing or not a string; pass --eos TOKEN");
    eos.content = value->get<std::string>();
    where += ": eos_token";
  }
  const std::optional<int32_t> id = tokenizer.token_to_id(eos.content);
  if (!id) throw_input_error(where, "\"" + eos.content + "\" is not a token of the tokenizer");
  eos.id = *id;
  return eos;
}

namespace {

struct InputFile {
  std::string path;
  bool parquet = false;
  InputFormat format = InputFormat::messages;
};

// The format of a Parquet file: --format's, else what its first row's columns say.
InputFormat parquet_format(const std::string& path, std::optional<InputFormat> given) {
  if (given) return *given;
  ParquetRecords records(path);
  ojson record;
  if (!records.next(&record))
    throw_input_error(path, "no rows, so its format cannot be detected (pass --format)");
  const std::optional<InputFormat> format = input_format_detect(record);
  if (!format) {
    std::string keys;
    for (const auto& [key, value] : record.items()) keys += (keys.empty() ? "\"" : ", \"") + key + "\"";
    throw_input_error(path + ":1",
                      "the first row's columns (" + (keys.empty() ? std::string("none") : keys) +
                          ") match no format; expected \"messages\", \"conversations\", \"instruction\" and "
                          "\"output\", or \"prompt\" and \"completion\" (or pass --format)");
  }
  std::fprintf(stderr, "loom: data build: %s: format %s (row 1's columns)\n", path.c_str(),
               input_format_name(*format));
  return *format;
}

// The format of a JSONL file: --format's, else what its first record's keys say (the first
// line that is a JSON object), announced on stderr.
InputFormat jsonl_format(const std::string& path, std::optional<InputFormat> given) {
  if (given) return *given;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_input_error(path, std::string("cannot open the input: ") + std::strerror(errno));
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (is_blank(line) || utf8_valid_prefix(line) != line.size()) continue;
    const ojson record = ojson::parse(line, nullptr, false);
    if (record.is_discarded() || !record.is_object()) continue;
    const std::optional<InputFormat> format = input_format_detect(record);
    if (!format) {
      std::string keys;
      for (const auto& [key, value] : record.items()) keys += (keys.empty() ? "\"" : ", \"") + key + "\"";
      throw_input_error(
          path + ":" + std::to_string(n),
          "the first record's keys (" + (keys.empty() ? std::string("none") : keys) +
              ") match no format; expected \"messages\", \"conversations\", \"instruction\" and "
              "\"output\", or \"prompt\" and \"completion\" (or pass --format)");
    }
    std::fprintf(stderr, "loom: data build: %s: format %s (line %lld's keys)\n", path.c_str(),
                 input_format_name(*format), static_cast<long long>(n));
    return *format;
  }
  throw_input_error(path, "no line is a JSON object, so its format cannot be detected (pass --format)");
}

// The inputs as an error names them.
std::string input_names(const std::vector<InputFile>& files) {
  return files.size() == 1 ? files[0].path
                           : files[0].path + " and " + std::to_string(files.size() - 1) + " more inputs";
}

// A path as compared with another: absolute, normalized, links resolved where they exist.
fs::path comparable(const std::string& path) {
  fs::path p = fs::weakly_canonical(fs::absolute(path));
  return p.has_filename() ? p : p.parent_path();  // "out/" is "out"
}

// Whether `a` is `b` or lies inside it.
bool same_or_inside(const fs::path& a, const fs::path& b) {
  return std::mismatch(b.begin(), b.end(), a.begin(), a.end()).first == b.end();
}

// An output that is, holds or lies in another input or output would overwrite it or be
// removed with it (an eval store inside --out went when the train store took its place):
// refused before anything is written.
void check_paths_apart(const DataBuildOptions& o) {
  std::vector<std::pair<std::string, std::string>> named = {{"--out", o.out}};
  for (const std::string& input : o.inputs) named.emplace_back("--input", input);
  named.emplace_back("--tokenizer", o.tokenizer);
  if (o.eval_fraction > 0) named.insert(named.begin() + 1, {"--eval-out", data_eval_out(o)});
  const size_t outputs = o.eval_fraction > 0 ? 2 : 1;
  for (size_t i = 0; i < outputs; ++i)
    for (size_t k = i + 1; k < named.size(); ++k) {
      const fs::path a = comparable(named[i].second), b = comparable(named[k].second);
      if (same_or_inside(a, b) || same_or_inside(b, a))
        throw_input_error(named[i].first + " " + named[i].second,
                          std::string(a == b                 ? "is"
                                      : same_or_inside(a, b) ? "lies inside"
                                                             : "contains") +
                              " " + named[k].first + " " + named[k].second +
                              "; expected an output apart from the command's other inputs and outputs");
    }
}

// What can be refused before the tokenizer is read.
void check_options(const DataBuildOptions& o) {
  const ChatFormat format = chat_format_parse(o.chat_format, "--chat-format");
  if ((format == ChatFormat::qwen3) != (o.loss_mask == "qwen3") ||
      (o.loss_mask != "qwen3" && o.loss_mask != "assistant"))
    throw_input_error("--loss-mask", "\"" + o.loss_mask + "\", expected " +
                                         (format == ChatFormat::qwen3 ? "qwen3" : "assistant") + " for the " +
                                         o.chat_format + " chat format");
  if (o.row_tokens < 2 || o.row_tokens > kMaxRowTokens)
    throw_input_error("--row-tokens", std::to_string(o.row_tokens) + ", expected 2 to " +
                                          std::to_string(kMaxRowTokens) + " (2^24)");
  if (o.threads < 0 || o.threads > kDataBuildMaxThreads)
    throw_input_error("--threads", std::to_string(o.threads) + ", expected 1 to " +
                                       std::to_string(kDataBuildMaxThreads) + " (or 0: one per core)");
  LOOM_ASSERT(o.chunk_bytes > 0, "chunk_bytes must be positive");
  if (!(o.eval_fraction >= 0 && o.eval_fraction < 1))
    throw_input_error("--eval-fraction", std::to_string(o.eval_fraction) + ", expected a fraction in [0, 1)");
  input_format_parse(o.format, "--format");
  data_input_files(o.inputs);
  check_paths_apart(o);
  row_store_check_replaceable(o.out);
  if (o.eval_fraction > 0) row_store_check_replaceable(data_eval_out(o));
}

}  // namespace

ojson data_build(const DataBuildOptions& o) {
  check_options(o);
  return data_build(o, Tokenizer::load(o.tokenizer));
}

ojson data_build(const DataBuildOptions& o, const Tokenizer& tokenizer) {
  check_options(o);
  const std::optional<InputFormat> given_format = input_format_parse(o.format, "--format");
  std::vector<InputFile> files;
  double input_size = 0;
  for (const std::string& path : data_input_files(o.inputs)) {
    InputFile f{path, fs::path(path).extension() == ".parquet"};
    f.format = f.parquet ? parquet_format(path, given_format) : jsonl_format(path, given_format);
    input_size += file_size(path);
    files.push_back(std::move(f));
  }
  const ojson tokenizer_sha = tokenizer_files_sha256(o.tokenizer);
  const EosToken eos = data_eos_token(tokenizer, o.tokenizer, o.eos);
  const std::unique_ptr<ChatMasker> masker =
      chat_masker_make(tokenizer, chat_format_parse(o.chat_format, "--chat-format"), o.loss_mask);
  const int threads = o.threads > 0 ? o.threads : std::min(usable_cores(), kDataBuildMaxThreads);

  RowStoreWriter writer(o.out, o.row_tokens, o.packing);
  const std::string eval_out = data_eval_out(o);
  const ScratchDir scratch(o.out + ".scratch");
  const std::string tokens_path = scratch.path + "/tokens.bin", mask_path = scratch.path + "/loss_mask.bin";

  // Pass 1: tokenize, in input order, into the scratch files.
  std::vector<uint64_t> offsets{0};  // conversation k spans [offsets[k], offsets[k + 1])
  SkipCounts skipped;
  for (const InputFile& f : files) skipped.files.push_back(f.path);
  Sha256 total_sha;
  ojson inputs = ojson::array();
  int64_t lines = 0;
  size_t input_bytes = 0;
  {
    ScratchFile tokens_out(tokens_path), mask_out(mask_path);
    Progress progress("tokenizing", input_size, "MB", o.progress);
    double bytes_done = 0;
    ChunkPipeline pipeline(threads, *masker);
    auto consume = [&](ChunkResult r) {
      for (const LineProblem& p : r.problems) {
        if (o.strict)
          throw_input_error(files[p.file].path + ":" + std::to_string(p.line),
                            std::string(chat_problem_name(p.kind)) + ": " + p.detail +
                                " (--strict stops at the first line that is not a usable conversation)");
        skipped.add(p);
      }
      tokens_out.write(r.tokens.data(), r.tokens.size() * sizeof(int32_t));
      mask_out.write(r.loss_mask.data(), r.loss_mask.size());
      for (uint64_t length : r.lengths) offsets.push_back(offsets.back() + length);
      bytes_done += static_cast<double>(r.bytes);
      progress.update(bytes_done);
    };
    for (size_t f = 0; f < files.size(); ++f) {
      const std::unique_ptr<ChunkSource> source =
          files[f].parquet
              ? std::unique_ptr<ChunkSource>(new ParquetChunker(files[f].path, o.chunk_bytes, total_sha))
              : std::make_unique<LineChunker>(files[f].path, o.chunk_bytes, total_sha);
      while (std::optional<Chunk> chunk = source->next()) {
        chunk->file = f;
        chunk->format = files[f].format;
        while (pipeline.full()) consume(*pipeline.take(/*wait=*/true));
        pipeline.submit(std::move(*chunk));
        while (std::optional<ChunkResult> r = pipeline.take(/*wait=*/false)) consume(std::move(*r));
      }
      inputs.push_back({{"path", files[f].path},
                        {"format", input_format_name(files[f].format)},
                        {"sha256", source->hex_digest()},
                        {"bytes", source->bytes()},
                        {files[f].parquet ? "rows" : "lines", source->lines()}});
      lines += source->lines();
      input_bytes += source->bytes();
    }
    while (!pipeline.empty()) consume(*pipeline.take(/*wait=*/true));
    progress.finish(bytes_done);
    tokens_out.close();
    mask_out.close();
  }
  const uint64_t conversations = offsets.size() - 1;
  if (conversations == 0)
    throw_input_error(input_names(files), "no usable conversation in " + std::to_string(lines) + " lines (" +
                                              std::to_string(skipped.total) + " skipped)");

  // Pass 2: pack in the seeded permutation. The scratch files are read with pread, not
  // mapped: a mapping would grow the resident set to their size as the permutation touches
  // every page, where pread keeps it at one conversation. With an eval fraction, the first
  // conversations of the permutation are held out (docs/data.md).
  const ScratchReader tokens_in(tokens_path), mask_in(mask_path);
  const std::vector<uint64_t> order = data_permutation(conversations, o.seed);
  const auto held_out =
      static_cast<uint64_t>(std::llround(o.eval_fraction * static_cast<double>(conversations)));
  const Conversations source{offsets, tokens_in, mask_in};
  const std::span<const uint64_t> train_part = std::span<const uint64_t>(order).subspan(held_out);
  const PackResult packed = pack(o, eos.id, source, train_part, writer);

  ojson fields = {
      {"seed", o.seed},
      {"permutation", "splitmix64-fisher-yates (docs/data.md)"},
      {"loss_mask", o.loss_mask},
      {"eos_token", {{"content", eos.content}, {"id", eos.id}}},
      {"input", files.size() == 1 ? ojson(files[0].path) : ojson(skipped.files)},
      {"input_sha256", files.size() == 1 ? inputs[0]["sha256"].get<std::string>() : total_sha.hex_digest()},
      {"input_bytes", input_bytes},
      {"input_lines", lines},
      {"inputs", inputs},
      {"tokenizer", o.tokenizer},
      {"tokenizer_sha256", tokenizer_sha}};
  // Absent: qwen3, as in the stores written before the other formats.
  if (o.chat_format != "qwen3") fields["chat_format"] = o.chat_format;
  auto commit = [&](RowStoreWriter& w, const PackResult& result, const char* part, ojson f) {
    if (o.eval_fraction > 0) {
      f["eval_fraction"] = o.eval_fraction;
      f["part"] = part;
    }
    for (const auto& [key, value] : result.fields.items()) f[key] = value;
    f["skipped_conversations"] = skipped.total;
    f["skipped"] = skipped.to_json();
    if (w.rows() == 0)
      throw_input_error(input_names(files),
                        std::to_string(result.fields["conversations"].get<uint64_t>()) + " conversations (" +
                            std::to_string(result.fields["conversation_tokens"].get<uint64_t>()) +
                            " tokens) fill no row of " + std::to_string(o.row_tokens) +
                            " tokens with a supervised target" +
                            (std::string(part) == "eval" ? " (the eval part)" : ""));
    return w.commit(f);
  };
  if (held_out == 0) return commit(writer, packed, "train", fields);
  const std::span<const uint64_t> eval_part = std::span<const uint64_t>(order).first(held_out);
  RowStoreWriter eval_writer(eval_out, o.row_tokens, o.packing);
  const PackResult eval_packed = pack(o, eos.id, source, eval_part, eval_writer);
  const ojson eval_manifest = commit(eval_writer, eval_packed, "eval", fields);
  ojson train_fields = fields;
  train_fields["eval_store"] = {{"path", eval_out}, {"rows", eval_manifest["rows"]}};
  return commit(writer, packed, "train", train_fields);
}

}  // namespace loom
