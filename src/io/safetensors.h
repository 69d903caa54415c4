// safetensors reader over a read-only map, strict where a hostile file could do harm, and a
// logical tensor set over one file or a sharded checkpoint (model.safetensors.index.json).
// Nothing here copies tensor data: tensors are (file, offset, dtype, shape) plus a pointer
// into the map. Never asserts on file bytes; every problem is a Status naming file and tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/status.h"

namespace vlac {

/// Largest header accepted (the reference implementation's bound).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // row-major, outermost first
  uint64_t data_begin = 0;     // offsets relative to the start of the data section
  uint64_t data_end = 0;
  uint64_t nbytes() const { return data_end - data_begin; }
  uint64_t numel() const;      // product of shape (validated not to overflow)
};

/// A validated header: tensors sorted by data_begin, metadata, data-section offset.
struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;  // __metadata__
  uint64_t data_offset = 0;                     // 8 + header length
};

/// Validates the header of a safetensors file held in [data, data+size). `path` names the
/// file in error messages. Rules: 8-byte little-endian length <= 100 MB and within the file;
/// header starts with '{', is valid UTF-8 JSON, an object; __metadata__ only string->string;
/// each entry has a known dtype, a shape of non-negative integers, exactly two integer offsets;
/// shape x element size (overflow-checked) equals the span; spans in bounds, not overlapping,
/// covering the data section exactly; duplicate names rejected.
Result<SafetensorsHeader> parse_safetensors_header(const uint8_t* data, uint64_t size,
                                                   const std::string& path);

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return map_.path(); }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t data_offset() const { return header_.data_offset; }
  uint64_t file_size() const { return map_.size(); }
  /// nullptr if absent.
  const TensorInfo* find(std::string_view name) const;
  /// Pointer to the tensor's bytes inside the map (valid while this object lives).
  const uint8_t* data(const TensorInfo& t) const { return map_.data() + header_.data_offset + t.data_begin; }
  /// Drops the mapped pages of [begin, end) of a tensor's bytes (absolute to its data).
  void drop(const TensorInfo& t) const { map_.drop(header_.data_offset + t.data_begin, t.nbytes()); }
  const MappedFile& map() const { return map_; }

 private:
  SafetensorsFile(MappedFile map, SafetensorsHeader header)
      : map_(std::move(map)), header_(std::move(header)) {}
  MappedFile map_;
  SafetensorsHeader header_;
  std::vector<size_t> by_name_;  // indices into header_.tensors, sorted by name (for find)
};

/// One logical set of tensors over a single file or the shards named by an index json.
class TensorSet {
 public:
  struct Entry {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  /// `path`: a .safetensors file, a model.safetensors.index.json, or a folder holding
  /// model.safetensors or model.safetensors.index.json. The index's weight_map must name
  /// every tensor of every shard and nothing else; a name in two shards is an error.
  static Result<TensorSet> open(const std::string& path);

  /// All tensors, in file order, then data order within a file.
  const std::vector<Entry>& tensors() const { return entries_; }
  const Entry* find(std::string_view name) const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  /// __metadata__ of the first shard (plus the index's "metadata" values as strings).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The file or index json this set was opened from.
  const std::string& source() const { return source_; }
  uint64_t total_bytes() const;

 private:
  TensorSet() = default;
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace vlac
