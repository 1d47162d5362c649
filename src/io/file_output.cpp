#include "io/file_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace loom {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

FileOutput::FileOutput(const std::string& path) : path_(path), tmp_path_(path + ".tmp") {
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_runtime_failure(tmp_path_, "cannot create: " + errno_text());
}

FileOutput::~FileOutput() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_path_.c_str());
}

void FileOutput::write(const void* data, size_t size) {
  LOOM_ASSERT(fd_ >= 0, "write after commit");
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw_runtime_failure(tmp_path_, "write failed: " + errno_text());
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void FileOutput::commit() {
  LOOM_ASSERT(fd_ >= 0, "commit twice");
  if (::fsync(fd_) != 0) throw_runtime_failure(tmp_path_, "fsync failed: " + errno_text());
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    ::unlink(tmp_path_.c_str());
    throw_runtime_failure(tmp_path_, "close failed: " + errno_text());
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    std::string why = errno_text();
    ::unlink(tmp_path_.c_str());
    throw_runtime_failure(path_, "cannot rename " + tmp_path_ + " into place: " + why);
  }
  std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  file_sync_dir(parent.empty() ? "." : parent.string());
}

void file_write_atomic(const std::string& path, const std::string& contents) {
  FileOutput out(path);
  out.write(contents.data(), contents.size());
  out.commit();
}

void file_sync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_runtime_failure(dir, "cannot open folder to sync: " + errno_text());
  int rc = ::fsync(fd);
  std::string why = rc != 0 ? errno_text() : "";
  ::close(fd);
  if (rc != 0) throw_runtime_failure(dir, "fsync of folder failed: " + why);
}

}  // namespace loom
