// Atomic file writer: temporary name + fsync + rename.
#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>

namespace vlac {

std::string parent_dir(const std::string& path) {
  auto pos = path.find_last_of('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return path.substr(0, pos);
}

bool is_dir(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

static std::string base_name(const std::string& path) {
  auto pos = path.find_last_of('/');
  return pos == std::string::npos ? path : path.substr(pos + 1);
}

Result<AtomicFile> AtomicFile::create(const std::string& final_path) {
  if (final_path.empty() || final_path.back() == '/')
    return invalid_argument("output path '" + final_path + "' is not a file name");
  struct stat st {};
  if (stat(final_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    return invalid_argument(final_path + ": is a folder, expected a file path");
  AtomicFile f;
  f.final_path_ = final_path;
  std::string dir = parent_dir(final_path);
  // Same folder as the destination, so the final rename never crosses file systems.
  std::string tmpl;
  if (final_path.find('/') != std::string::npos) tmpl.append(dir == "/" ? "" : dir).append("/");
  tmpl.append(".").append(base_name(final_path)).append(".vlac-tmp-XXXXXX");
  f.fd_ = mkostemp(tmpl.data(), O_CLOEXEC);
  if (f.fd_ < 0) return errno_error(final_path + ": cannot create a temporary file in '" + dir + "'", errno);
  f.temp_path_ = tmpl;
  fchmod(f.fd_, 0644);
  return f;
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : final_path_(std::move(o.final_path_)), temp_path_(std::move(o.temp_path_)),
      fd_(std::exchange(o.fd_, -1)), end_(o.end_), committed_(std::exchange(o.committed_, true)) {}

AtomicFile& AtomicFile::operator=(AtomicFile&& o) noexcept {
  if (this != &o) {
    abandon();
    final_path_ = std::move(o.final_path_);
    temp_path_ = std::move(o.temp_path_);
    fd_ = std::exchange(o.fd_, -1);
    end_ = o.end_;
    committed_ = std::exchange(o.committed_, true);
  }
  return *this;
}

AtomicFile::~AtomicFile() { abandon(); }

Status AtomicFile::write(const void* data, size_t size) {
  VLAC_RETURN_IF_ERROR(pwrite(data, size, end_));
  return Status::ok();
}

Status AtomicFile::pwrite(const void* data, size_t size, uint64_t offset) {
  if (fd_ < 0) return internal_error(final_path_ + ": write after commit or abandon");
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pwrite(fd_, p + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error(final_path_ + ": write failed", errno);
    }
    done += static_cast<size_t>(n);
  }
  if (offset + size > end_) end_ = offset + size;
  return Status::ok();
}

Status AtomicFile::reserve(uint64_t bytes) {
  if (fd_ < 0) return internal_error(final_path_ + ": reserve after commit");
  int rc = posix_fallocate(fd_, 0, static_cast<off_t>(bytes));
  if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL)
    return errno_error(final_path_ + ": cannot reserve " + std::to_string(bytes) + " bytes", rc);
  return Status::ok();
}

Status AtomicFile::commit() {
  if (fd_ < 0) return internal_error(final_path_ + ": commit twice");
  // fallocate may have extended the file past what was written.
  if (ftruncate(fd_, static_cast<off_t>(end_)) != 0) return errno_error(final_path_ + ": truncate failed", errno);
  if (fsync(fd_) != 0) return errno_error(final_path_ + ": fsync failed", errno);
  if (::close(fd_) != 0) { fd_ = -1; return errno_error(final_path_ + ": close failed", errno); }
  fd_ = -1;
  if (std::rename(temp_path_.c_str(), final_path_.c_str()) != 0)
    return errno_error(final_path_ + ": rename from temporary failed", errno);
  committed_ = true;
  int dfd = ::open(parent_dir(final_path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) { fsync(dfd); ::close(dfd); }
  return Status::ok();
}

void AtomicFile::abandon() {
  if (fd_ >= 0) { ::close(fd_); fd_ = -1; }
  if (!committed_ && !temp_path_.empty()) unlink(temp_path_.c_str());
  committed_ = true;
}

}  // namespace vlac
