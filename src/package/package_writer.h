// PackageWriter: writes a .vlac package (layout in format.h and docs/format.md; read back by
// package.h). File segments are copied file to file in the kernel (copy_file_range, else
// sendfile), never through a user-space buffer; output is atomic (temporary name + rename).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "package/format.h"
#include "package/manifest.h"

namespace vlac {

struct PackageWriterOptions {
  /// Bytes copied/hashed per step; page cache of both files is dropped after each step, so the
  /// writer's memory (RSS and dirty page cache) stays O(window), whatever the segment sizes.
  uint64_t window_bytes = 32ull << 20;
  /// Tests: skip copy_file_range and use the sendfile fallback.
  bool force_sendfile = false;
  /// Called at fixed points of finish() ("layout", "segment:<name>", "table", "header",
  /// "commit"), before the step runs. Tests use it to kill the writer mid-write.
  std::function<void(const std::string& stage)> on_stage;
};

/// What finish() wrote.
struct PackageWriteSummary {
  std::string path;
  uint64_t file_size = 0;
  uint64_t manifest_bytes = 0;
  uint64_t bytes_from_files = 0;   // copied in the kernel
  uint64_t bytes_from_memory = 0;  // written from caller buffers
  bool used_sendfile = false;      // the copy_file_range fallback was taken
  struct Segment {
    std::string name;
    package::SegmentKind kind;
    uint64_t offset, size, checksum;
  };
  std::vector<Segment> segments;
};

/// Collects segments and a manifest, then finish() writes the package in one pass.
/// Output is deterministic: segments in the order added, manifest keys sorted, no timestamps;
/// the same inputs give byte-identical files. Not thread-safe. Move-only.
class PackageWriter {
 public:
  explicit PackageWriter(std::string out_path, PackageWriterOptions options = {});
  PackageWriter(PackageWriter&&) noexcept = default;
  PackageWriter& operator=(PackageWriter&&) noexcept = default;
  PackageWriter(const PackageWriter&) = delete;
  PackageWriter& operator=(const PackageWriter&) = delete;

  /// Adds a segment owning `bytes`. Name rules: format.h (printable ASCII, unique).
  /// `alignment`: a power of two >= kSegmentAlignment.
  Status add_bytes(std::string name, package::SegmentKind kind, std::vector<uint8_t> bytes,
                   uint32_t alignment = package::kSegmentAlignment);
  /// Adds a segment from caller memory; [data, data+size) must stay valid until finish() returns.
  Status add_view(std::string name, package::SegmentKind kind, const void* data, uint64_t size,
                  uint32_t alignment = package::kSegmentAlignment);
  /// Adds a segment whose bytes are the whole file at `file_path` when finish() runs (e.g. an
  /// engine file in the engine dir). The file must not change until finish() returns.
  Status add_file(std::string name, package::SegmentKind kind, std::string file_path,
                  uint32_t alignment = package::kSegmentAlignment);
  /// The manifest; its references (engine segments, stats, tokenizer) are checked in finish().
  void set_manifest(PackageManifest manifest) { manifest_ = std::move(manifest); }

  bool has_segment(std::string_view name) const;
  size_t segment_count() const { return segments_.size(); }

  /// Lays out, writes, checksums, fsyncs and renames into place. On any error nothing is left
  /// at the output path (and the temporary is removed). Call once.
  Result<PackageWriteSummary> finish();

 private:
  struct Pending {
    std::string name;
    package::SegmentKind kind;
    uint32_t alignment;
    std::vector<uint8_t> owned;
    const uint8_t* view = nullptr;
    uint64_t view_size = 0;
    std::string file_path;  // non-empty: a file segment
  };
  Status check_new(const std::string& name, package::SegmentKind kind, uint32_t alignment) const;

  std::string out_path_;
  PackageWriterOptions options_;
  std::vector<Pending> segments_;
  PackageManifest manifest_;
  bool finished_ = false;
};

}  // namespace vlac
