// safetensors files: read through a read-only mmap after a full validation of the header,
// and written atomically.
//
// The format (huggingface/safetensors):
//   bytes [0, 8)       N, the header length, little-endian uint64;
//   bytes [8, 8 + N)   the header: a UTF-8 JSON object that starts with '{' (the reference
//                      writer pads it with spaces to a multiple of 8 bytes), mapping each
//                      tensor name to {"dtype": "BF16", "shape": [d0, d1, ...],
//                      "data_offsets": [begin, end]}, plus an optional "__metadata__"
//                      object of string → string;
//   bytes [8 + N, EOF) the data section; a tensor's bytes are [begin, end) of it, row-major,
//                      little-endian.
//
// A header is accepted only if: N ≤ 100,000,000 (the reference reader's limit) and fits in
// the file; it is valid JSON with no NUL byte and no duplicate key; every dtype is one of
// F32, BF16, I32, I16, U8, I64, F64 (core/dtype.h); every shape is a list of non-negative
// integers; end − begin = numel · dtype_size; begin ≤ end ≤ the data section's length; no two
// tensors share a byte (gaps between tensors are accepted); and the largest end equals the
// data section's length (neither truncated nor followed by stray bytes). Each failure is an
// InputError naming the file and the tensor:
//   "model.safetensors: tensor 'x': data_offsets [a, b] past the end of the data section (n bytes)".
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace loom {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  // any rank; view() takes at most kMaxDims
  uint64_t begin = 0;          // byte offsets into the data section, [begin, end)
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
  std::string shape_str() const;  // "[2, 3]"
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in data order: by begin offset, then by name
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + N: where the data section starts in the file
  uint64_t data_size = 0;    // length of the data section in bytes
};

// Validates and parses the header of a whole safetensors file held in [data, data + size).
// `path` names the file in error messages. Throws InputError on any defect listed above.
SafetensorsHeader safetensors_parse_header(const uint8_t* data, size_t size, const std::string& path);

// A safetensors file mapped read-only. Move-only; the mapping lives as long as the object.
class SafetensorsFile {
 public:
  // Opens, maps and validates the file. A missing or unreadable file is an InputError.
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return header_.entries; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr when absent
  // The entry's nbytes() bytes. Their address is as aligned as the file's offsets make it
  // (the reference writer keeps it a multiple of the dtype size; other writers may not):
  // read them with memcpy, not through a typed pointer, unless the alignment is checked.
  const uint8_t* bytes(const SafetensorsEntry& entry) const;
  // A view into the mapping (read-only memory: a write through it faults). Throws
  // InputError when the entry has more than kMaxDims dims.
  Tensor view(const SafetensorsEntry& entry) const;

 private:
  SafetensorsFile() = default;
  void release();

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  SafetensorsHeader header_;
  std::unordered_map<std::string, size_t> index_;  // name → position in header_.entries
};

// One tensor to write. `data` holds numel values of `source`: either `dtype` itself (copied
// as is) or f32 when `dtype` is bf16 (rounded to nearest even while writing, so a bf16
// checkpoint of fp32 weights needs no second copy of the weights in memory).
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::f32;  // the stored dtype
  Shape shape;
  const void* data = nullptr;
  DType source = DType::f32;
};

// Writes a safetensors file to `path + ".tmp"`, fsyncs it and renames it to `path`. The
// header lists "__metadata__" first, then the tensors in the order given, whose data follow
// back to back in that order (the caller orders them by alignment if it mixes dtypes); the
// header is padded with spaces to a multiple of 8 bytes, as the reference writer does.
// Names must be unique. I/O failures throw RuntimeFailure.
void safetensors_write(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Values of a tensor asked for piece by piece: fill dst[0, count) with the fp32 values
// [first, first + count) of tensors[tensor], row-major.
using SafetensorsReadF32 = std::function<void(size_t tensor, int64_t first, int64_t count, float* dst)>;
// Elements per piece asked of a SafetensorsReadF32 (4 Mi: a 16 MiB buffer).
constexpr int64_t kSafetensorsPieceNumel = int64_t{1} << 22;

// The file safetensors_write writes for these tensors (the same bytes), of fp32 values that
// come from `read` instead of `data` (ignored, as `source`, which is f32 here): each tensor's
// in order, in pieces of at most kSafetensorsPieceNumel elements, so that the caller needs no
// array of them. `dtype` is f32 or bf16.
void safetensors_write_streamed(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                                const std::map<std::string, std::string>& metadata,
                                const SafetensorsReadF32& read);

}  // namespace loom
