// AtomicFile: a writer that never lets a reader see half a file. Bytes go to a hidden
// temporary name in the destination folder; commit() fsyncs, renames into place and fsyncs
// the folder. Destroyed without commit() (error, exception, early return) it unlinks the
// temporary. A process killed mid-write leaves only a ".NAME.vlac-tmp-*" file, never NAME.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace vlac {

class AtomicFile {
 public:
  static Result<AtomicFile> create(const std::string& final_path);

  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&& other) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  /// Writes all of [data, data+size) at the current end.
  Status write(const void* data, size_t size);
  /// Writes at an absolute offset (for headers patched after the body).
  Status pwrite(const void* data, size_t size, uint64_t offset);
  /// Reserves space (posix_fallocate); optional.
  Status reserve(uint64_t bytes);
  uint64_t bytes_written() const { return end_; }
  int fd() const { return fd_; }
  const std::string& temp_path() const { return temp_path_; }
  const std::string& final_path() const { return final_path_; }
  /// fsync, rename to the final path, fsync the folder.
  Status commit();
  /// Unlinks the temporary; idempotent. Called by the destructor when not committed.
  void abandon();

 private:
  AtomicFile() = default;
  std::string final_path_;
  std::string temp_path_;
  int fd_ = -1;
  uint64_t end_ = 0;
  bool committed_ = false;
};

/// The folder part of a path ("." if none).
std::string parent_dir(const std::string& path);
/// Whether `path` names an existing folder (following links).
bool is_dir(const std::string& path);

}  // namespace vlac
