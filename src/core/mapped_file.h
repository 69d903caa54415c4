// A read-only memory map of a whole file. Pages are touched only when read; drop() gives
// touched pages back (MADV_DONTNEED on the map + POSIX_FADV_DONTNEED on the fd).
// Must not be used to write: the map is PROT_READ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace vlac {

/// Reads exactly `n` bytes at `offset` of an open file into `dst` with pread (retrying short
/// reads and EINTR): maps nothing, so no page of the file becomes resident in the process.
/// False on an error (errno set) or end of file.
bool read_at(int fd, void* dst, uint64_t n, uint64_t offset);

class MappedFile {
 public:
  /// Maps `path` read-only. An empty file maps to size 0 with data() == nullptr.
  static Result<MappedFile> open(const std::string& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

  /// Drops the pages of [offset, offset+length) from this process and, where clean, from the
  /// page cache. Rounds inward to page boundaries is not needed: the range is widened to pages.
  void drop(uint64_t offset, uint64_t length) const;
  /// Unmaps the pages of [offset, offset+length) from this process only (MADV_DONTNEED): RSS
  /// falls, the page cache keeps them, so the next touch is a minor fault, not a disk read.
  void release(uint64_t offset, uint64_t length) const;
  /// Hints sequential reading of [offset, offset+length) (MADV_SEQUENTIAL + WILLNEED).
  void advise_sequential(uint64_t offset, uint64_t length) const;
  /// Unmaps and closes; idempotent.
  void release();

 private:
  MappedFile() = default;
  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace vlac
