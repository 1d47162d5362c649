#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/parallel.h"
#include "io/file_output.h"

namespace loom {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; loom maps it without byte swapping");

using nlohmann::json;

// The reference reader's limit (safetensors MAX_HEADER_SIZE): a corrupt length must not make
// us parse gigabytes of tensor data as JSON.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string num(uint64_t v) {
  return std::to_string(v);
}

std::string offsets_str(uint64_t begin, uint64_t end) {
  return "[" + num(begin) + ", " + num(end) + "]";
}

[[noreturn]] void tensor_error(const std::string& path, const std::string& name, const std::string& what) {
  throw_input_error(path, "tensor '" + name + "': " + what);
}

// A JSON integer that is >= 0 and fits in int64 (nlohmann parses non-negative literals as
// unsigned, negative ones as signed, anything else as a float).
bool json_non_negative(const json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return *out <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
}

std::string supported_dtypes() {
  return "F32, BF16, I32, I16, U8, I64, F64";
}

SafetensorsEntry parse_entry(const std::string& name, const json& v, uint64_t data_size,
                             const std::string& path) {
  if (!v.is_object())
    tensor_error(
        path, name,
        std::string("is a JSON ") + v.type_name() + ", expected an object with dtype, shape, data_offsets");
  SafetensorsEntry e;
  e.name = name;
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!v.contains(field)) tensor_error(path, name, std::string("missing field '") + field + "'");

  const json& dtype = v.at("dtype");
  if (!dtype.is_string())
    tensor_error(path, name,
                 std::string("field 'dtype' is a JSON ") + dtype.type_name() + ", expected a string");
  if (!dtype_from_name(dtype.get<std::string>(), &e.dtype))
    tensor_error(path, name,
                 "dtype " + dtype.dump() + " is not supported (expected one of " + supported_dtypes() + ")");

  const json& shape = v.at("shape");
  if (!shape.is_array())
    tensor_error(path, name,
                 std::string("field 'shape' is a JSON ") + shape.type_name() + ", expected a list");
  // numel in uint64 with overflow checks; a zero dim makes it 0 whatever the others are.
  uint64_t numel = 1;
  bool overflow = false, has_zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    uint64_t d = 0;
    if (!json_non_negative(shape[i], &d))
      tensor_error(path, name,
                   "shape " + shape.dump() + ": dim " + num(i) + " is not a non-negative integer");
    e.shape.push_back(static_cast<int64_t>(d));
    if (d == 0) has_zero = true;
    if (__builtin_mul_overflow(numel, d, &numel)) overflow = true;
  }
  uint64_t need = 0;
  if (has_zero) {
    need = 0;
  } else if (overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e.dtype)), &need)) {
    tensor_error(path, name, "shape " + shape.dump() + " has more bytes than any file can hold");
  }

  const json& offsets = v.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !json_non_negative(offsets[0], &e.begin) ||
      !json_non_negative(offsets[1], &e.end))
    tensor_error(path, name,
                 "data_offsets " + offsets.dump() + " is not a list of two non-negative integers");
  if (e.begin > e.end)
    tensor_error(path, name, "data_offsets " + offsets_str(e.begin, e.end) + " end before they begin");
  if (e.end > data_size)
    tensor_error(path, name,
                 "data_offsets " + offsets_str(e.begin, e.end) + " past the end of the data section (" +
                     num(data_size) + " bytes)");
  if (e.end - e.begin != need)
    tensor_error(path, name,
                 "data_offsets " + offsets_str(e.begin, e.end) + " hold " + num(e.end - e.begin) +
                     " bytes, but dtype " + dtype_name(e.dtype) + " and shape " + e.shape_str() + " need " +
                     num(need));
  return e;
}

// Parses JSON text, refusing duplicate keys at any depth (nlohmann would keep the last one
// silently; two entries for one tensor name are a defect of the file, not a choice to make).
json parse_json_strict(const uint8_t* begin, const uint8_t* end, const std::string& path) {
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  json::parser_callback_t callback = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (event == json::parse_event_t::key && !keys.empty() && parsed.is_string()) {
      if (!keys.back().insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json j;
  try {
    j = json::parse(begin, end, callback, /*allow_exceptions=*/true);
  } catch (const json::exception& error) {
    // what() reads "[json.exception.parse_error.101] parse error at line 1, column 7: ...".
    std::string what = error.what();
    size_t bracket = what.find("] ");
    throw_input_error(path, "header is not valid JSON: " +
                                (bracket == std::string::npos ? what : what.substr(bracket + 2)));
  }
  if (!duplicate.empty()) throw_input_error(path, "header has the key '" + duplicate + "' twice");
  return j;
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  // A zero dim first: the product of the other dims alone may overflow.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsEntry::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsHeader safetensors_parse_header(const uint8_t* data, size_t size, const std::string& path) {
  if (size < 8)
    throw_input_error(path, "file is " + num(size) + " bytes, too short to hold the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  if (n > size - 8)
    throw_input_error(path,
                      "header length " + num(n) + " past the end of the file (" + num(size) + " bytes)");
  if (n > kMaxHeaderBytes)
    throw_input_error(path,
                      "header length " + num(n) + " exceeds the limit of " + num(kMaxHeaderBytes) + " bytes");
  const uint8_t* text = data + 8;
  if (n == 0 || text[0] != '{') throw_input_error(path, "header does not start with '{'");
  // A NUL would end nlohmann's input early and hide what follows; JSON text has none.
  if (const void* nul = std::memchr(text, 0, n))
    throw_input_error(path, "header has a NUL byte at file offset " +
                                num(static_cast<uint64_t>(static_cast<const uint8_t*>(nul) - data)));
  json j = parse_json_strict(text, text + n, path);
  if (!j.is_object()) throw_input_error(path, "header is not a JSON object");

  SafetensorsHeader header;
  header.data_offset = 8 + n;
  header.data_size = size - header.data_offset;
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        throw_input_error(
            path, std::string("__metadata__ is a JSON ") + value.type_name() + ", expected an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          throw_input_error(path,
                            "__metadata__ '" + mk + "' is a JSON " + mv.type_name() + ", expected a string");
        header.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    header.entries.push_back(parse_entry(key, value, header.data_size, path));
  }

  std::sort(header.entries.begin(), header.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
            });
  // Sorted by begin, a tensor overlaps an earlier one iff it begins before the furthest end
  // seen so far. Empty tensors own no bytes and overlap nothing.
  const SafetensorsEntry* furthest = nullptr;
  uint64_t max_end = 0;
  for (const SafetensorsEntry& e : header.entries) {
    max_end = std::max(max_end, e.end);
    if (e.begin == e.end) continue;
    if (furthest && e.begin < furthest->end)
      tensor_error(path, e.name,
                   "data_offsets " + offsets_str(e.begin, e.end) + " overlap tensor '" + furthest->name +
                       "' " + offsets_str(furthest->begin, furthest->end));
    if (!furthest || e.end > furthest->end) furthest = &e;
  }
  if (max_end != header.data_size)
    throw_input_error(path, "the data section is " + num(header.data_size) +
                                " bytes but the tensors end at byte " + num(max_end) + " of it: " +
                                num(header.data_size - max_end) + " stray bytes after the last tensor");
  return header;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_input_error(path, std::string("cannot open safetensors file: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string why = std::strerror(errno);
    ::close(fd);
    throw_runtime_failure(path, "fstat failed: " + why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw_input_error(path, "not a regular file");
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    safetensors_parse_header(nullptr, 0, path);  // throws: too short
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  std::string why = map == MAP_FAILED ? std::strerror(errno) : "";
  ::close(fd);  // the mapping keeps the file open
  if (map == MAP_FAILED) throw_runtime_failure(path, "mmap failed: " + why);
  file.map_ = map;
  file.map_size_ = size;
  file.header_ = safetensors_parse_header(static_cast<const uint8_t*>(map), size, path);
  for (size_t i = 0; i < file.header_.entries.size(); ++i) file.index_[file.header_.entries[i].name] = i;
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept {
  *this = std::move(other);
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    header_ = std::move(other.header_);
    index_ = std::move(other.index_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  release();
}

void SafetensorsFile::release() {
  if (map_) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.entries[it->second];
}

const uint8_t* SafetensorsFile::bytes(const SafetensorsEntry& entry) const {
  return static_cast<const uint8_t*>(map_) + header_.data_offset + entry.begin;
}

Tensor SafetensorsFile::view(const SafetensorsEntry& entry) const {
  if (entry.shape.size() > static_cast<size_t>(kMaxDims))
    tensor_error(path_, entry.name,
                 "shape " + entry.shape_str() + " has " + num(entry.shape.size()) +
                     " dims; loom handles at most " + num(kMaxDims));
  return Tensor{const_cast<uint8_t*>(bytes(entry)), Shape(entry.shape), entry.dtype, Device::cpu};
}

namespace {

// The 8-byte length and the header of a file of `tensors`, their data back to back in order.
std::string header_bytes(const std::vector<SafetensorsTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    LOOM_ASSERT(t.name != "__metadata__" && !header.contains(t.name),
                "tensor name reserved or repeated: " + t.name);
    uint64_t nbytes = static_cast<uint64_t>(t.shape.numel()) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape.vec()},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t n = text.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &n, 8);
  return bytes + text;
}

// src[0, count) rounded to bf16 (nearest even) and written, through `staging`.
void write_as_bf16(FileOutput& out, const float* src, int64_t count, std::vector<bf16>& staging) {
  staging.resize(static_cast<size_t>(count));
  parallel_for(count, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) staging[static_cast<size_t>(i)] = float_to_bf16(src[i]);
  });
  out.write(staging.data(), static_cast<size_t>(count) * sizeof(bf16));
}

}  // namespace

void safetensors_write(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  for (const SafetensorsTensor& t : tensors)
    LOOM_ASSERT(t.source == t.dtype || (t.source == DType::f32 && t.dtype == DType::bf16),
                "safetensors_write converts only f32 to bf16");
  const std::string header = header_bytes(tensors, metadata);
  FileOutput out(path);
  out.write(header.data(), header.size());
  // Converting kSafetensorsPieceNumel values at a time bounds the staging buffer to 8 MiB.
  std::vector<bf16> staging;
  for (const SafetensorsTensor& t : tensors) {
    int64_t count = t.shape.numel();
    if (t.source == t.dtype) {
      out.write(t.data, static_cast<size_t>(count) * dtype_size(t.dtype));
      continue;
    }
    const float* src = static_cast<const float*>(t.data);
    for (int64_t done = 0; done < count; done += kSafetensorsPieceNumel)
      write_as_bf16(out, src + done, std::min(kSafetensorsPieceNumel, count - done), staging);
  }
  out.commit();
}

void safetensors_write_streamed(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                                const std::map<std::string, std::string>& metadata,
                                const SafetensorsReadF32& read) {
  for (const SafetensorsTensor& t : tensors)
    LOOM_ASSERT(t.dtype == DType::f32 || t.dtype == DType::bf16,
                "safetensors_write_streamed stores f32 or bf16");
  const std::string header = header_bytes(tensors, metadata);
  FileOutput out(path);
  out.write(header.data(), header.size());
  std::vector<float> piece;
  std::vector<bf16> staging;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t count = tensors[i].shape.numel();
    for (int64_t done = 0; done < count; done += kSafetensorsPieceNumel) {
      const int64_t m = std::min(kSafetensorsPieceNumel, count - done);
      piece.resize(static_cast<size_t>(m));
      read(i, done, m, piece.data());
      if (tensors[i].dtype == DType::f32)
        out.write(piece.data(), static_cast<size_t>(m) * 4);
      else
        write_as_bf16(out, piece.data(), m, staging);
    }
  }
  out.commit();
}

}  // namespace loom
