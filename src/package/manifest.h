// The .vlac manifest (format.h documents its keys): engines in run order with their I/O,
// crossing values, policy config, normalization/tokenizer references, free-form metadata.
// Strict JSON parse + schema check shared by the writer and the reader; never throws.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/status.h"
#include "package/format.h"

namespace vlac {

struct PackageTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // row-major, outermost first; every dim >= 0
};

struct PackageEngine {
  std::string name;     // unique among engines
  std::string segment;  // the segment (kind engine) holding its bytes
  std::string backend;  // "cpu", "cuda", "null", ...
  std::vector<PackageTensor> inputs;
  std::vector<PackageTensor> outputs;
  nlohmann::json extra = nlohmann::json::object();  // other keys, kept verbatim
};

/// A value produced by one engine and read by later ones (<= 64 KiB by DESIGN, not enforced here).
struct PackageCrossing {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;  // numel x dtype size (checked)
  std::string producer;                // an engine name
  std::vector<std::string> consumers;  // engine names
};

struct PackageManifest {
  std::vector<PackageEngine> engines;  // run order
  std::vector<PackageCrossing> crossing;
  nlohmann::json policy = nlohmann::json::object();
  std::optional<std::string> normalization_segment;  // kind stats
  std::optional<std::string> tokenizer_segment;      // kind tokenizer
  nlohmann::json metadata = nlohmann::json::object();
  /// Whole "normalization"/"tokenizer" objects (extra keys kept); null when absent.
  nlohmann::json normalization = nullptr;
  nlohmann::json tokenizer = nullptr;

  /// The manifest as JSON (keys sorted by nlohmann's std::map, so dumps are deterministic).
  nlohmann::json to_json() const;
};

/// Returns the kind of a segment by name, or nullopt if the package has no such segment.
using SegmentKindLookup = std::function<std::optional<package::SegmentKind>(const std::string&)>;

/// Parses manifest text strictly: no NUL byte, valid UTF-8 JSON, no duplicate keys, depth
/// <= kMaxManifestDepth, an object. Errors are InvalidFormat "<path>: manifest: ...".
Result<nlohmann::json> parse_manifest_json(const uint8_t* data, size_t size, const std::string& path);

/// Checks the schema (required keys and types, dtypes, shapes, unique engine names, crossing
/// bytes, references to segments of the right kind and to engines) and decodes it.
Result<PackageManifest> decode_manifest(const nlohmann::json& j, const std::string& path,
                                        const SegmentKindLookup& lookup);

/// "[1, 2, 3]".
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace vlac
