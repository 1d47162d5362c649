// Files written atomically: into `path + ".tmp"`, flushed to disk, then renamed into place,
// so a reader never sees a half-written file under the final name (docs/interface.md: outputs are
// written to a temporary name and renamed).
#pragma once

#include <cstddef>
#include <string>

namespace loom {

// Writes `path + ".tmp"`; commit() fsyncs it, renames it to `path` and fsyncs the folder.
// Destroyed without commit() (an exception on the way), it removes the temporary file.
// Failures of the file system throw RuntimeFailure naming the path.
class FileOutput {
 public:
  explicit FileOutput(const std::string& path);
  ~FileOutput();
  FileOutput(const FileOutput&) = delete;
  FileOutput& operator=(const FileOutput&) = delete;

  void write(const void* data, size_t size);
  void commit();

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
};

// Writes a whole file atomically.
void file_write_atomic(const std::string& path, const std::string& contents);

// fsync of a folder, so that a rename inside it is on disk.
void file_sync_dir(const std::string& dir);

}  // namespace loom
