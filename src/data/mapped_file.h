// A whole file mapped read-only (mmap), unmapped when the value dies: the row store's
// tokens and loss masks, and the tokenized conversations `loom data build` packs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom {

class MappedFile {
 public:
  enum class Access { sequential, random };  // the madvise hint

  MappedFile() = default;
  // InputError naming the path when it cannot be opened; RuntimeFailure when mmap fails.
  // An empty file maps nothing (data() is nullptr, size() 0).
  explicit MappedFile(const std::string& path, Access access = Access::sequential);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return static_cast<const uint8_t*>(map_); }
  size_t size() const { return size_; }

 private:
  void* map_ = nullptr;
  size_t size_ = 0;
};

}  // namespace loom
