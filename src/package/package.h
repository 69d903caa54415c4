// Package: the strict .vlac reader (layout in format.h and docs/format.md; written by
// package_writer.h). Maps the file read-only and hands out segment bytes in place. Links only
// core (+ json, xxhash): the runtime uses it without the compiler side. Never asserts on bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "core/status.h"
#include "package/format.h"
#include "package/manifest.h"

namespace vlac {

/// One named data segment, as validated from the segment table.
struct PackageSegment {
  std::string name;
  package::SegmentKind kind = package::SegmentKind::Data;
  uint64_t offset = 0;  // absolute file offset, a multiple of `alignment`
  uint64_t size = 0;
  uint64_t checksum = 0;  // xxh64 (seed 0) of the bytes
  uint32_t alignment = package::kSegmentAlignment;
};

/// Everything parse_package() validated, without the bytes.
struct PackageLayout {
  package::Header header;
  std::vector<PackageSegment> segments;  // table (= file) order
  nlohmann::json manifest_json;
  PackageManifest manifest;
  uint64_t table_end = 0;     // first byte after the segment table
  uint64_t manifest_end = 0;  // first byte after the manifest
};

/// Validates a whole package held in [data, data+size) except the segment checksums (those
/// need every byte; see verify_package_segments). `path` names the file in messages. Rules:
/// magic, version == kFormatVersion, header size, header checksum, flags and reserved bytes
/// zero, file size exact, table and manifest in bounds with their checksums, records with
/// known kinds, power-of-two alignments, names valid and unique and packed in order, each
/// segment at exactly align_up(end of the previous region) (so nothing overlaps and no bytes
/// hide in gaps), the manifest strict JSON matching the schema. Errors are 1xx codes.
Result<PackageLayout> parse_package(const uint8_t* data, uint64_t size, const std::string& path);

/// Checks every segment's checksum and that every gap between regions is zero, streaming
/// through [data, data+size). After each chunk of up to `chunk_bytes`, calls `done(offset,
/// length)` (may be empty), which a mapped reader uses to drop the pages it just read.
Status verify_package_segments(const uint8_t* data, uint64_t size, const PackageLayout& layout,
                               const std::string& path, uint64_t chunk_bytes,
                               const std::function<void(uint64_t, uint64_t)>& done);

/// True when the file at `path` starts with the package magic (reads 8 bytes).
bool has_package_magic(const std::string& path);

/// A mapped, validated package. Move-only. Thread safety: const methods may run concurrently.
/// Lifetime: spans returned by data() point into the map and stay valid while this object
/// lives (moving the Package keeps them valid). A package replaced on disk by rename does not
/// change an open Package: the old file stays mapped until this object is destroyed.
class Package {
 public:
  /// Maps `path` read-only and validates it (parse_package); no segment byte is read.
  static Result<Package> open(const std::string& path);

  Package(Package&&) noexcept = default;
  Package& operator=(Package&&) noexcept = default;
  Package(const Package&) = delete;
  Package& operator=(const Package&) = delete;

  const std::string& path() const { return map_.path(); }
  uint32_t version() const { return layout_.header.version; }
  uint64_t file_size() const { return layout_.header.file_size; }
  const std::vector<PackageSegment>& segments() const { return layout_.segments; }
  const PackageManifest& manifest() const { return layout_.manifest; }
  const nlohmann::json& manifest_json() const { return layout_.manifest_json; }
  const PackageLayout& layout() const { return layout_; }

  /// nullptr if there is no segment of that name.
  const PackageSegment* find(std::string_view name) const;
  /// The segment's bytes inside the map, used in place (pages load on first touch). `s` comes
  /// from segments()/find() of this package (anything outside the map gives an empty span).
  std::span<const uint8_t> data(const PackageSegment& s) const;
  /// Same by name; NotFound "<path>: no segment 'NAME'" when absent.
  Result<std::span<const uint8_t>> data(std::string_view name) const;
  /// Gives the segment's pages back (MADV_DONTNEED + POSIX_FADV_DONTNEED); its bytes stay
  /// readable (they are paged in again on the next touch).
  void drop(const PackageSegment& s) const;
  /// Unmaps the segment's pages from this process only (the page cache keeps them): RSS falls,
  /// the next use costs minor faults.
  void release(const PackageSegment& s) const;
  /// Same for [offset, offset + length) of the segment only (clamped to it).
  void release(const PackageSegment& s, uint64_t offset, uint64_t length) const;
  /// The package's open file (segment s lies at s.offset in it).
  int fd() const { return map_.fd(); }

  /// Checks every segment checksum and zero gaps, reading through the map in bounded chunks
  /// and dropping each chunk's pages after; memory stays bounded whatever the package size.
  /// A mismatch is InvalidFormat "<path>: segment 'NAME': checksum mismatch ...".
  Status verify() const;
  /// Checks one segment's checksum (same streaming, but pages are only released, not dropped
  /// from the page cache: the runtime verifies a segment right before using it).
  Status verify(const PackageSegment& s) const;

  /// True when `path()` now names a different file than the one mapped (replaced by rename)
  /// or no longer exists.
  bool replaced_on_disk() const;
  /// Opens whatever `path()` names now (the new package after a replace); this one is unchanged.
  Result<Package> reopen() const { return open(path()); }

 private:
  Package(MappedFile map, PackageLayout layout);
  bool in_map(const PackageSegment& s) const;
  MappedFile map_;
  PackageLayout layout_;
  std::unordered_map<std::string, size_t> by_name_;
};

/// Streaming chunk used by verify (bounded memory).
inline constexpr uint64_t kVerifyChunkBytes = 8ull << 20;

}  // namespace vlac
