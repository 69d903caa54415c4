// Streaming safetensors writer: every tensor is declared up front (so the header is written
// first), then bytes are appended in declaration order. Writes to a temporary name in the
// destination folder; finish() checks every byte arrived, fsyncs and renames into place.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/dtype.h"
#include "core/status.h"

namespace vlac {

struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
};

class SafetensorsWriter {
 public:
  static Result<SafetensorsWriter> create(const std::string& path, std::vector<TensorSpec> tensors,
                                          std::map<std::string, std::string> metadata = {});
  /// Appends data bytes (any split across calls; tensors are contiguous in declaration order).
  Status write(const void* data, size_t size);
  /// Fails if fewer or more bytes than declared were written; else commits atomically.
  Status finish();
  uint64_t data_bytes_expected() const { return expected_; }
  uint64_t data_bytes_written() const { return written_; }
  uint64_t header_bytes() const { return header_bytes_; }
  const std::string& path() const { return file_.final_path(); }

 private:
  explicit SafetensorsWriter(AtomicFile f) : file_(std::move(f)) {}
  AtomicFile file_;
  uint64_t expected_ = 0, written_ = 0, header_bytes_ = 0;
};

/// The exact header (8-byte length + JSON padded with spaces to a multiple of 8) the writer
/// produces for these tensors; useful for sizing shards.
Result<std::string> build_safetensors_header(const std::vector<TensorSpec>& tensors,
                                             const std::map<std::string, std::string>& metadata);

}  // namespace vlac
