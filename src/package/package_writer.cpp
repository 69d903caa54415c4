// .vlac writer (layout: format.h; reader: package.cpp). File segments move file to file in the
// kernel; checksums are read back through a bounded map window whose pages are dropped after.
// Must not buffer a file segment in user space, nor leave anything at the output on failure.
#include "package/package_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "core/atomic_file.h"
#include "core/bytes.h"

namespace vlac {

using namespace package;

namespace {

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

/// Write-behind for the output: start writeback of window k, wait for window k-1 and drop its
/// pages, so dirty page cache stays about two windows whatever the package size.
class Flusher {
 public:
  explicit Flusher(int fd) : fd_(fd) {}
  void push(uint64_t off, uint64_t len) {
    sync_file_range(fd_, static_cast<off_t>(off), static_cast<off_t>(len), SYNC_FILE_RANGE_WRITE);
    if (has_prev_) settle(prev_off_, prev_len_);
    has_prev_ = true;
    prev_off_ = off;
    prev_len_ = len;
  }
  void finish() {
    if (has_prev_) settle(prev_off_, prev_len_);
    has_prev_ = false;
  }

 private:
  void settle(uint64_t off, uint64_t len) {
    sync_file_range(fd_, static_cast<off_t>(off), static_cast<off_t>(len),
                    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    posix_fadvise(fd_, static_cast<off_t>(off), static_cast<off_t>(len), POSIX_FADV_DONTNEED);
  }
  int fd_;
  bool has_prev_ = false;
  uint64_t prev_off_ = 0, prev_len_ = 0;
};

/// Copies `len` bytes from in_fd@in_off to out_fd@out_off inside the kernel.
Status kernel_copy(int in_fd, uint64_t in_off, int out_fd, uint64_t out_off, uint64_t len, bool* use_sendfile,
                   const std::string& what) {
  while (len > 0 && !*use_sendfile) {
    loff_t io = static_cast<loff_t>(in_off), oo = static_cast<loff_t>(out_off);
    ssize_t n = copy_file_range(in_fd, &io, out_fd, &oo, len, 0);
    if (n < 0) {
      int err = errno;
      if (err == EINTR) continue;
      if (err == EXDEV || err == ENOSYS || err == EOPNOTSUPP || err == EINVAL || err == EBADF) {
        *use_sendfile = true;  // different file systems or no support: sendfile below
        break;
      }
      return errno_error(what + ": copy_file_range failed", err);
    }
    if (n == 0) return invalid_argument(what + ": file became shorter while being packaged");
    in_off += static_cast<uint64_t>(n);
    out_off += static_cast<uint64_t>(n);
    len -= static_cast<uint64_t>(n);
  }
  if (len == 0) return Status::ok();
  if (::lseek(out_fd, static_cast<off_t>(out_off), SEEK_SET) < 0) return errno_error(what + ": seek failed", errno);
  off_t io = static_cast<off_t>(in_off);
  while (len > 0) {
    size_t step = len > 0x40000000ull ? 0x40000000ull : static_cast<size_t>(len);
    ssize_t n = ::sendfile(out_fd, in_fd, &io, step);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error(what + ": sendfile failed", errno);
    }
    if (n == 0) return invalid_argument(what + ": file became shorter while being packaged");
    len -= static_cast<uint64_t>(n);
  }
  return Status::ok();
}

/// Hashes [off, off+len) of `fd` through a read-only map of just that window, then unmaps.
/// `off` must be page-aligned (segments are 64 KiB aligned, windows multiples of 64 KiB).
Status hash_window(int fd, uint64_t off, uint64_t len, XXH64_state_t* st, const std::string& what) {
  if (len == 0) return Status::ok();
  void* p = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(off));
  if (p == MAP_FAILED) return errno_error(what + ": cannot map the written bytes to checksum them", errno);
  madvise(p, len, MADV_SEQUENTIAL);
  XXH64_update(st, p, len);
  munmap(p, len);
  return Status::ok();
}

}  // namespace

PackageWriter::PackageWriter(std::string out_path, PackageWriterOptions options)
    : out_path_(std::move(out_path)), options_(std::move(options)) {
  // Windows start on 64 KiB boundaries inside 64 KiB-aligned segments (mmap needs page offsets).
  uint64_t w = options_.window_bytes < kSegmentAlignment ? kSegmentAlignment : options_.window_bytes;
  options_.window_bytes = w / kSegmentAlignment * kSegmentAlignment;
}

Status PackageWriter::check_new(const std::string& name, SegmentKind kind, uint32_t alignment) const {
  const std::string who = out_path_ + ": segment '" + printable_name(name) + "'";
  if (finished_) return invalid_argument(who + ": the package was already written");
  if (!is_valid_name(name))
    return invalid_argument(who + ": a segment name is 1.." + std::to_string(kMaxNameBytes) +
                            " printable ASCII bytes without spaces");
  if (has_segment(name)) return invalid_argument(who + ": duplicate segment name");
  if (!is_known_kind(static_cast<uint32_t>(kind))) return invalid_argument(who + ": unknown segment kind");
  if (!is_pow2(alignment) || alignment < kSegmentAlignment || alignment > kMaxAlignment)
    return invalid_argument(who + ": alignment " + std::to_string(alignment) + " is not a power of two in " +
                            std::to_string(kSegmentAlignment) + ".." + std::to_string(kMaxAlignment));
  if (segments_.size() >= kMaxSegments)
    return invalid_argument(out_path_ + ": more than " + std::to_string(kMaxSegments) + " segments");
  return Status::ok();
}

bool PackageWriter::has_segment(std::string_view name) const {
  for (const auto& s : segments_)
    if (s.name == name) return true;
  return false;
}

Status PackageWriter::add_bytes(std::string name, SegmentKind kind, std::vector<uint8_t> bytes, uint32_t alignment) {
  VLAC_RETURN_IF_ERROR(check_new(name, kind, alignment));
  Pending p{std::move(name), kind, alignment, std::move(bytes), nullptr, 0, {}};
  segments_.push_back(std::move(p));
  return Status::ok();
}

Status PackageWriter::add_view(std::string name, SegmentKind kind, const void* data, uint64_t size,
                               uint32_t alignment) {
  VLAC_RETURN_IF_ERROR(check_new(name, kind, alignment));
  if (data == nullptr && size != 0)
    return invalid_argument(out_path_ + ": segment '" + printable_name(name) + "': null data");
  Pending p{std::move(name), kind, alignment, {}, static_cast<const uint8_t*>(data), size, {}};
  segments_.push_back(std::move(p));
  return Status::ok();
}

Status PackageWriter::add_file(std::string name, SegmentKind kind, std::string file_path, uint32_t alignment) {
  VLAC_RETURN_IF_ERROR(check_new(name, kind, alignment));
  if (file_path.empty())
    return invalid_argument(out_path_ + ": segment '" + printable_name(name) + "': empty file path");
  Pending p{std::move(name), kind, alignment, {}, nullptr, 0, std::move(file_path)};
  segments_.push_back(std::move(p));
  return Status::ok();
}

Result<PackageWriteSummary> PackageWriter::finish() {
  if (finished_) return invalid_argument(out_path_ + ": finish() called twice");
  finished_ = true;
  auto stage = [&](const std::string& s) {
    if (options_.on_stage) options_.on_stage(s);
  };

  // Open the file segments now and keep them open, so sizes cannot drift between layout and copy.
  const size_t n = segments_.size();
  std::vector<Fd> fds(n);
  std::vector<uint64_t> sizes(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const Pending& p = segments_[i];
    if (p.file_path.empty()) {
      sizes[i] = p.view ? p.view_size : p.owned.size();
      continue;
    }
    int fd = ::open(p.file_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == ENOENT) return not_found(p.file_path + ": no such file (segment '" + p.name + "')");
      return errno_error(p.file_path + ": cannot open (segment '" + p.name + "')", err);
    }
    fds[i] = Fd(fd);
    struct stat st {};
    if (fstat(fd, &st) != 0) return errno_error(p.file_path + ": cannot stat", errno);
    if (!S_ISREG(st.st_mode)) return invalid_argument(p.file_path + ": not a regular file (segment '" + p.name + "')");
    sizes[i] = static_cast<uint64_t>(st.st_size);
  }

  // Manifest: serialize (sorted keys), then run the reader's own checks on those exact bytes.
  std::string manifest_text;
  try {
    manifest_text = manifest_.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const std::exception& ex) {
    return invalid_argument(out_path_ + ": manifest cannot be written as JSON: " + printable_name(ex.what()));
  }
  if (manifest_text.size() > kMaxManifestBytes)
    return invalid_argument(out_path_ + ": manifest is " + std::to_string(manifest_text.size()) +
                            " bytes, more than the limit " + std::to_string(kMaxManifestBytes));
  {
    std::unordered_map<std::string, SegmentKind> kinds;
    for (const auto& s : segments_) kinds.emplace(s.name, s.kind);
    auto lookup = [&](const std::string& nm) -> std::optional<SegmentKind> {
      auto it = kinds.find(nm);
      if (it == kinds.end()) return std::nullopt;
      return it->second;
    };
    VLAC_ASSIGN_OR_RETURN(nlohmann::json parsed, parse_manifest_json(reinterpret_cast<const uint8_t*>(manifest_text.data()),
                                                                     manifest_text.size(), out_path_));
    Result<PackageManifest> m = decode_manifest(parsed, out_path_, lookup);
    if (!m.is_ok()) return invalid_argument(m.status().message());
  }

  // Layout (format.h): header, table, manifest at the next 8, segments each at the next aligned place.
  stage("layout");
  Header h;
  uint64_t names_bytes = 0;
  for (const auto& s : segments_) names_bytes += s.name.size();
  h.segment_count = n;
  h.table_size = n * kRecordSize + names_bytes;
  uint64_t table_end = h.table_offset + h.table_size;
  align_up(table_end, 8, &h.manifest_offset);
  h.manifest_size = manifest_text.size();
  h.manifest_checksum = checksum_bytes(manifest_text.data(), manifest_text.size());
  std::vector<Record> recs(n);
  uint64_t end = h.manifest_offset + h.manifest_size;
  uint32_t name_cursor = 0;
  for (size_t i = 0; i < n; ++i) {
    Record& r = recs[i];
    if (!align_up(end, segments_[i].alignment, &r.offset) || add_overflow(r.offset, sizes[i], &end))
      return invalid_argument(out_path_ + ": package would be larger than 2^64 bytes");
    r.size = sizes[i];
    r.kind = static_cast<uint32_t>(segments_[i].kind);
    r.alignment = segments_[i].alignment;
    r.name_offset = name_cursor;
    r.name_size = static_cast<uint32_t>(segments_[i].name.size());
    name_cursor += r.name_size;
  }
  h.file_size = end;

  VLAC_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(out_path_));
  // Size the file up front (gaps stay holes that read as zero) and tell AtomicFile where the
  // end is, since bytes copied in the kernel bypass its write() accounting.
  if (ftruncate(out.fd(), static_cast<off_t>(h.file_size)) != 0)
    return errno_error(out_path_ + ": cannot size the temporary file", errno);
  static const uint8_t kNothing = 0;
  VLAC_RETURN_IF_ERROR(out.pwrite(&kNothing, 0, h.file_size));

  PackageWriteSummary sum;
  sum.path = out_path_;
  sum.file_size = h.file_size;
  sum.manifest_bytes = h.manifest_size;
  bool use_sendfile = options_.force_sendfile;
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> st(XXH64_createState(), &XXH64_freeState);
  if (!st) return internal_error(out_path_ + ": cannot allocate a hash state");
  Flusher flusher(out.fd());
  const uint64_t window = options_.window_bytes;
  for (size_t i = 0; i < n; ++i) {
    const Pending& p = segments_[i];
    Record& r = recs[i];
    stage("segment:" + p.name);
    const std::string what = out_path_ + ": segment '" + p.name + "'";
    XXH64_reset(st.get(), 0);
    if (p.file_path.empty()) {
      const uint8_t* src = p.view ? p.view : p.owned.data();
      for (uint64_t off = 0; off < r.size; off += window) {
        uint64_t len = std::min(window, r.size - off);
        VLAC_RETURN_IF_ERROR(out.pwrite(src + off, len, r.offset + off));
        XXH64_update(st.get(), src + off, len);
        flusher.push(r.offset + off, len);
      }
      sum.bytes_from_memory += r.size;
    } else {
      const int in_fd = fds[i].fd;
      const std::string src_what = p.file_path + " (segment '" + p.name + "')";
      for (uint64_t off = 0; off < r.size; off += window) {
        uint64_t len = std::min(window, r.size - off);
        VLAC_RETURN_IF_ERROR(kernel_copy(in_fd, off, out.fd(), r.offset + off, len, &use_sendfile, src_what));
        VLAC_RETURN_IF_ERROR(hash_window(out.fd(), r.offset + off, len, st.get(), what));
        posix_fadvise(in_fd, static_cast<off_t>(off), static_cast<off_t>(len), POSIX_FADV_DONTNEED);
        flusher.push(r.offset + off, len);
      }
      struct stat after {};
      if (fstat(in_fd, &after) != 0 || static_cast<uint64_t>(after.st_size) != r.size)
        return invalid_argument(src_what + ": file changed size while being packaged");
      sum.bytes_from_files += r.size;
    }
    r.checksum = XXH64_digest(st.get());
    sum.segments.push_back({p.name, p.kind, r.offset, r.size, r.checksum});
  }
  flusher.finish();
  sum.used_sendfile = use_sendfile && sum.bytes_from_files > 0;

  // Segment table and manifest, then the header last (it covers both through their checksums).
  stage("table");
  std::string table(h.table_size, '\0');
  for (size_t i = 0; i < n; ++i) encode_record(recs[i], reinterpret_cast<uint8_t*>(table.data()) + i * kRecordSize);
  size_t pos = n * kRecordSize;
  for (const auto& s : segments_) {
    std::memcpy(table.data() + pos, s.name.data(), s.name.size());
    pos += s.name.size();
  }
  h.table_checksum = checksum_bytes(table.data(), table.size());
  VLAC_RETURN_IF_ERROR(out.pwrite(table.data(), table.size(), h.table_offset));
  VLAC_RETURN_IF_ERROR(out.pwrite(manifest_text.data(), manifest_text.size(), h.manifest_offset));
  stage("header");
  uint8_t hdr[kHeaderSize];
  encode_header(h, hdr);
  VLAC_RETURN_IF_ERROR(out.pwrite(hdr, kHeaderSize, 0));
  stage("commit");
  VLAC_RETURN_IF_ERROR(out.commit());
  return sum;
}

}  // namespace vlac
