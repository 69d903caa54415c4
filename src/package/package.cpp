// Strict .vlac reader: validates the layout of format.h (written by package_writer.cpp)
// before handing out a single pointer. Every check is on untrusted bytes: no assert, no
// unchecked arithmetic; each failure is one line naming the file (and segment).
#include "package/package.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <memory>
#include <unordered_set>

#include "core/bytes.h"

namespace vlac {

using package::hex64;
using package::printable_name;

namespace {

Status bad(const std::string& path, const std::string& what) { return invalid_format(path + ": " + what); }

Status bad_segment(const std::string& path, size_t index, const std::string& name, const std::string& what) {
  std::string who = name.empty() ? "segment #" + std::to_string(index)
                                 : "segment '" + printable_name(name) + "'";
  return invalid_format(path + ": " + who + ": " + what);
}

bool all_zero(const uint8_t* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

}  // namespace

Result<PackageLayout> parse_package(const uint8_t* data, uint64_t size, const std::string& path) {
  using namespace package;
  if (size < sizeof kMagic)
    return bad(path, "file is " + std::to_string(size) + " bytes, too short to be a vlac package");
  if (std::memcmp(data, kMagic, sizeof kMagic) != 0)
    return bad(path, "not a vlac package (magic \"" +
                         printable_name(std::string_view(reinterpret_cast<const char*>(data), 8)) +
                         "\", expected \"VLACPKG\\x00\")");
  if (size < kHeaderSize)
    return bad(path, "truncated: " + std::to_string(size) + " bytes, shorter than the " +
                         std::to_string(kHeaderSize) + "-byte package header");
  PackageLayout L;
  bool reserved_nonzero = false;
  Header& h = L.header;
  h = decode_header(data, &reserved_nonzero);
  if (h.version > kFormatVersion)
    return unsupported(path + ": package format version " + std::to_string(h.version) +
                       " is newer than this vlac reads (" + std::to_string(kFormatVersion) + "); use a newer vlac");
  if (h.version < kFormatVersion)
    return unsupported(path + ": package format version " + std::to_string(h.version) +
                       " is older than this vlac reads (" + std::to_string(kFormatVersion) +
                       "); compile the package again");
  if (h.header_size != kHeaderSize)
    return bad(path, "header size " + std::to_string(h.header_size) + ", expected " + std::to_string(kHeaderSize));
  uint64_t hsum = checksum_bytes(data, kHeaderChecksumOffset);
  if (hsum != h.header_checksum)
    return bad(path, "header checksum mismatch (stored " + hex64(h.header_checksum) + ", computed " + hex64(hsum) +
                         "): the header is corrupt");
  if (h.flags != 0) return bad(path, "unknown header flags " + hex64(h.flags));
  if (reserved_nonzero) return bad(path, "reserved header bytes are not zero");
  if (h.file_size != size) {
    if (size < h.file_size)
      return bad(path, "truncated: the header says " + std::to_string(h.file_size) + " bytes, the file has " +
                           std::to_string(size));
    return bad(path, std::to_string(size - h.file_size) + " unexpected bytes after the declared end (" +
                         std::to_string(h.file_size) + " bytes)");
  }
  if (h.segment_alignment != kSegmentAlignment)
    return bad(path, "segment alignment " + std::to_string(h.segment_alignment) + ", expected " +
                         std::to_string(kSegmentAlignment));

  // Segment table.
  if (h.table_offset != kHeaderSize)
    return bad(path, "segment table at offset " + std::to_string(h.table_offset) + ", expected " +
                         std::to_string(kHeaderSize));
  if (h.segment_count > kMaxSegments)
    return bad(path, std::to_string(h.segment_count) + " segments, more than the limit " + std::to_string(kMaxSegments));
  const uint64_t records_bytes = h.segment_count * kRecordSize;  // <= 65536 * 48: no overflow
  if (h.table_size < records_bytes)
    return bad(path, "segment table of " + std::to_string(h.table_size) + " bytes cannot hold " +
                         std::to_string(h.segment_count) + " records");
  if (h.table_size > size - h.table_offset)
    return bad(path, "segment table (" + std::to_string(h.table_size) + " bytes at offset " +
                         std::to_string(h.table_offset) + ") extends past the end of the file");
  L.table_end = h.table_offset + h.table_size;
  uint64_t tsum = checksum_bytes(data + h.table_offset, h.table_size);
  if (tsum != h.table_checksum)
    return bad(path, "segment table checksum mismatch (stored " + hex64(h.table_checksum) + ", computed " +
                         hex64(tsum) + ")");

  // Manifest region.
  uint64_t want_manifest = 0;
  if (!align_up(L.table_end, 8, &want_manifest) || h.manifest_offset != want_manifest)
    return bad(path, "manifest at offset " + std::to_string(h.manifest_offset) + ", expected " +
                         std::to_string(want_manifest) + " (right after the segment table)");
  if (h.manifest_size == 0 || h.manifest_size > kMaxManifestBytes)
    return bad(path, "manifest size " + std::to_string(h.manifest_size) + " is outside 1.." +
                         std::to_string(kMaxManifestBytes));
  if (h.manifest_offset > size || h.manifest_size > size - h.manifest_offset)
    return bad(path, "manifest (" + std::to_string(h.manifest_size) + " bytes at offset " +
                         std::to_string(h.manifest_offset) + ") extends past the end of the file");
  L.manifest_end = h.manifest_offset + h.manifest_size;
  if (!all_zero(data + L.table_end, h.manifest_offset - L.table_end))
    return bad(path, "padding before the manifest is not zero");
  uint64_t msum = checksum_bytes(data + h.manifest_offset, h.manifest_size);
  if (msum != h.manifest_checksum)
    return bad(path, "manifest checksum mismatch (stored " + hex64(h.manifest_checksum) + ", computed " +
                         hex64(msum) + ")");

  // Records, in file order: names packed back to back, offsets at exactly the next aligned place.
  const uint8_t* pool = data + h.table_offset + records_bytes;
  const uint64_t pool_size = h.table_size - records_bytes;
  uint64_t name_cursor = 0;
  uint64_t prev_end = L.manifest_end;
  std::string prev_what = "the manifest";
  std::unordered_set<std::string_view> names;
  L.segments.reserve(h.segment_count);
  for (uint64_t i = 0; i < h.segment_count; ++i) {
    Record r = decode_record(data + h.table_offset + i * kRecordSize);
    if (r.name_offset != name_cursor)
      return bad_segment(path, i, "", "name offset " + std::to_string(r.name_offset) + ", expected " +
                                          std::to_string(name_cursor) + " (names are packed in order)");
    if (r.name_size == 0 || r.name_size > kMaxNameBytes)
      return bad_segment(path, i, "", "name size " + std::to_string(r.name_size) + " is outside 1.." +
                                          std::to_string(kMaxNameBytes));
    if (r.name_size > pool_size - name_cursor)
      return bad_segment(path, i, "", "name runs past the end of the segment table");
    std::string_view name(reinterpret_cast<const char*>(pool + name_cursor), r.name_size);
    name_cursor += r.name_size;
    if (!is_valid_name(name))
      return bad_segment(path, i, "", "name \"" + printable_name(name) + "\" has bytes outside printable ASCII");
    std::string nm(name);
    if (!names.insert(name).second) return bad_segment(path, i, nm, "duplicate segment name");
    if (r.reserved != 0) return bad_segment(path, i, nm, "reserved record bytes are not zero");
    if (!is_known_kind(r.kind)) return bad_segment(path, i, nm, "unknown kind " + std::to_string(r.kind));
    if (!is_pow2(r.alignment) || r.alignment < h.segment_alignment || r.alignment > kMaxAlignment)
      return bad_segment(path, i, nm, "alignment " + std::to_string(r.alignment) + " is not a power of two in " +
                                          std::to_string(h.segment_alignment) + ".." + std::to_string(kMaxAlignment));
    if (r.offset % r.alignment != 0)
      return bad_segment(path, i, nm, "offset " + std::to_string(r.offset) + " is not a multiple of its alignment " +
                                          std::to_string(r.alignment));
    uint64_t end = 0;
    if (add_overflow(r.offset, r.size, &end))
      return bad_segment(path, i, nm, "offset " + std::to_string(r.offset) + " + size " + std::to_string(r.size) +
                                          " overflows");
    if (end > size)
      return bad_segment(path, i, nm, "bytes [" + std::to_string(r.offset) + ", " + std::to_string(end) +
                                          ") extend past the end of the file (" + std::to_string(size) + " bytes)");
    if (r.offset < prev_end)
      return bad_segment(path, i, nm, "offset " + std::to_string(r.offset) + " overlaps " + prev_what +
                                          " (which ends at " + std::to_string(prev_end) + ")");
    uint64_t want = 0;
    if (!align_up(prev_end, r.alignment, &want) || r.offset != want)
      return bad_segment(path, i, nm, "offset " + std::to_string(r.offset) + " leaves a gap after " + prev_what +
                                          " (expected " + std::to_string(want) + ")");
    PackageSegment s;
    s.name = std::move(nm);
    s.kind = static_cast<SegmentKind>(r.kind);
    s.offset = r.offset;
    s.size = r.size;
    s.checksum = r.checksum;
    s.alignment = r.alignment;
    prev_what = "segment '" + printable_name(s.name) + "'";
    prev_end = end;
    L.segments.push_back(std::move(s));
  }
  if (name_cursor != pool_size)
    return bad(path, "segment table has " + std::to_string(pool_size - name_cursor) + " unused name bytes");
  if (prev_end != size)
    return bad(path, std::to_string(size - prev_end) + " bytes after the end of " + prev_what +
                         " belong to no segment");

  // Manifest: strict JSON, then the schema, with segment references checked against the table.
  VLAC_ASSIGN_OR_RETURN(L.manifest_json, parse_manifest_json(data + h.manifest_offset, h.manifest_size, path));
  std::unordered_map<std::string, SegmentKind> kinds;
  for (const auto& s : L.segments) kinds.emplace(s.name, s.kind);
  auto lookup = [&](const std::string& n) -> std::optional<SegmentKind> {
    auto it = kinds.find(n);
    if (it == kinds.end()) return std::nullopt;
    return it->second;
  };
  VLAC_ASSIGN_OR_RETURN(L.manifest, decode_manifest(L.manifest_json, path, lookup));
  return L;
}

Status verify_package_segments(const uint8_t* data, uint64_t size, const PackageLayout& layout,
                               const std::string& path, uint64_t chunk_bytes,
                               const std::function<void(uint64_t, uint64_t)>& done) {
  if (chunk_bytes == 0) chunk_bytes = kVerifyChunkBytes;
  if (layout.header.file_size != size) return bad(path, "file size changed since it was opened");
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> st(XXH64_createState(), &XXH64_freeState);
  if (!st) return internal_error(path + ": cannot allocate a hash state");
  uint64_t prev_end = layout.manifest_end;
  for (size_t i = 0; i < layout.segments.size(); ++i) {
    const PackageSegment& s = layout.segments[i];
    // Gap before the segment (< its alignment): must be zero, so no bytes hide in the file.
    for (uint64_t off = prev_end; off < s.offset;) {
      uint64_t n = std::min(chunk_bytes, s.offset - off);
      if (!all_zero(data + off, n))
        return bad_segment(path, i, s.name, "padding before the segment is not zero");
      if (done) done(off, n);
      off += n;
    }
    XXH64_reset(st.get(), 0);
    for (uint64_t off = 0; off < s.size;) {
      uint64_t n = std::min(chunk_bytes, s.size - off);
      XXH64_update(st.get(), data + s.offset + off, n);
      if (done) done(s.offset + off, n);
      off += n;
    }
    uint64_t sum = XXH64_digest(st.get());
    if (sum != s.checksum)
      return bad_segment(path, i, s.name, "checksum mismatch (stored " + hex64(s.checksum) + ", computed " +
                                              hex64(sum) + "): the segment's bytes are corrupt");
    prev_end = s.offset + s.size;
  }
  return Status::ok();
}

bool has_package_magic(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[8];
  ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  ::close(fd);
  return n == static_cast<ssize_t>(sizeof buf) && std::memcmp(buf, package::kMagic, sizeof buf) == 0;
}

Package::Package(MappedFile map, PackageLayout layout) : map_(std::move(map)), layout_(std::move(layout)) {
  for (size_t i = 0; i < layout_.segments.size(); ++i) by_name_.emplace(layout_.segments[i].name, i);
}

Result<Package> Package::open(const std::string& path) {
  VLAC_ASSIGN_OR_RETURN(MappedFile map, MappedFile::open(path));
  VLAC_ASSIGN_OR_RETURN(PackageLayout layout, parse_package(map.data(), map.size(), path));
  // The header, table and manifest were read; give those pages back too.
  map.drop(0, layout.manifest_end);
  return Package(std::move(map), std::move(layout));
}

const PackageSegment* Package::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &layout_.segments[it->second];
}

bool Package::in_map(const PackageSegment& s) const {
  uint64_t end = 0;
  return !add_overflow(s.offset, s.size, &end) && end <= map_.size();
}

std::span<const uint8_t> Package::data(const PackageSegment& s) const {
  if (!in_map(s) || s.size == 0) return {};  // a segment from another package: nothing
  return {map_.data() + s.offset, static_cast<size_t>(s.size)};
}

Result<std::span<const uint8_t>> Package::data(std::string_view name) const {
  const PackageSegment* s = find(name);
  if (s == nullptr) return not_found(path() + ": no segment '" + printable_name(name) + "'");
  return data(*s);
}

void Package::drop(const PackageSegment& s) const {
  if (in_map(s)) map_.drop(s.offset, s.size);
}

void Package::release(const PackageSegment& s) const {
  if (in_map(s)) map_.release(s.offset, s.size);
}

void Package::release(const PackageSegment& s, uint64_t offset, uint64_t length) const {
  if (!in_map(s) || offset >= s.size) return;
  map_.release(s.offset + offset, std::min(length, s.size - offset));
}

Status Package::verify() const {
  map_.advise_sequential(layout_.manifest_end, map_.size() - layout_.manifest_end);
  return verify_package_segments(map_.data(), map_.size(), layout_, path(), kVerifyChunkBytes,
                                 [this](uint64_t off, uint64_t n) { map_.drop(off, n); });
}

Status Package::verify(const PackageSegment& s) const {
  if (!in_map(s)) return invalid_argument(path() + ": segment '" + printable_name(s.name) + "' is not in this package");
  PackageLayout one;
  one.header = layout_.header;
  one.segments.push_back(s);
  one.manifest_end = s.offset;  // no gap check for a single segment
  Status st = verify_package_segments(map_.data(), map_.size(), one, path(), kVerifyChunkBytes,
                                      [this](uint64_t off, uint64_t n) { map_.release(off, n); });
  return st;
}

bool Package::replaced_on_disk() const {
  struct stat now {}, mine {};
  if (::stat(path().c_str(), &now) != 0) return true;
  if (::fstat(map_.fd(), &mine) != 0) return true;
  return now.st_dev != mine.st_dev || now.st_ino != mine.st_ino;
}

}  // namespace vlac
