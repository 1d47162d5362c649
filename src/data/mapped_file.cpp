#include "data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace loom {

MappedFile::MappedFile(const std::string& path, Access access) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_input_error(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw_runtime_failure(path, "fstat failed: " + why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw_input_error(path, "not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* map = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw_runtime_failure(path, "mmap failed: " + why);
    }
    map_ = map;
    // A hint only: a failure changes nothing but read-ahead.
    ::madvise(map_, size_, access == Access::sequential ? MADV_SEQUENTIAL : MADV_RANDOM);
  }
  ::close(fd);  // the mapping keeps the file
}

MappedFile::~MappedFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) ::munmap(map_, size_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace loom
