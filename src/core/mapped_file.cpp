// Read-only file mapping.
#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace vlac {

bool read_at(int fd, void* dst, uint64_t n, uint64_t offset) {
  auto* d = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, d, size_t(n), off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = 0;
      return false;
    }
    d += r, n -= uint64_t(r), offset += uint64_t(r);
  }
  return true;
}

namespace {
uint64_t page_size() {
  static const uint64_t p = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return p;
}
}  // namespace

Result<MappedFile> MappedFile::open(const std::string& path) {
  MappedFile f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) {
    int err = errno;
    if (err == ENOENT) return not_found(path + ": no such file");
    return errno_error(path + ": cannot open", err);
  }
  struct stat st {};
  if (fstat(f.fd_, &st) != 0) return errno_error(path + ": cannot stat", errno);
  if (!S_ISREG(st.st_mode)) return invalid_argument(path + ": not a regular file");
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = mmap(nullptr, f.size_, PROT_READ, MAP_SHARED, f.fd_, 0);
    if (p == MAP_FAILED) return errno_error(path + ": cannot map", errno);
    f.data_ = static_cast<const uint8_t*>(p);
  }
  return f;
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)),
      data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { release(); }

void MappedFile::release() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
  size_ = 0;
}

void MappedFile::drop(uint64_t offset, uint64_t length) const {
  if (data_ == nullptr || length == 0 || offset >= size_) return;
  if (length > size_ - offset) length = size_ - offset;
  const uint64_t p = page_size();
  uint64_t begin = offset / p * p;
  uint64_t end = offset + length;
  // Only whole pages inside the range are dropped from the page cache; the map may drop
  // partially covered pages too (they are re-read from the file on the next touch).
  madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_DONTNEED);
  posix_fadvise(fd_, static_cast<off_t>(begin), static_cast<off_t>(end - begin), POSIX_FADV_DONTNEED);
}

void MappedFile::release(uint64_t offset, uint64_t length) const {
  if (data_ == nullptr || length == 0 || offset >= size_) return;
  if (length > size_ - offset) length = size_ - offset;
  const uint64_t p = page_size();
  const uint64_t begin = offset / p * p;
  madvise(const_cast<uint8_t*>(data_) + begin, offset + length - begin, MADV_DONTNEED);
}

void MappedFile::advise_sequential(uint64_t offset, uint64_t length) const {
  if (data_ == nullptr || length == 0 || offset >= size_) return;
  if (length > size_ - offset) length = size_ - offset;
  const uint64_t p = page_size();
  uint64_t begin = offset / p * p;
  madvise(const_cast<uint8_t*>(data_) + begin, offset + length - begin, MADV_SEQUENTIAL);
  posix_fadvise(fd_, static_cast<off_t>(begin), static_cast<off_t>(offset + length - begin),
                POSIX_FADV_SEQUENTIAL);
}

}  // namespace vlac
