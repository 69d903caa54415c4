// Test helpers for the safetensors reader tests: a temporary folder, and safetensors bytes
// written by hand (header json + data) so that tests can build both good and bad files.
// Test-only; never used by src/.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "temp_dir_util.h"

namespace vlac::testing {

// Made as vlac-io-test-XXXXXX.
class TempDir : public testutil::TempDir {
 public:
  TempDir() : testutil::TempDir("io-test") {}
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

/// 8-byte little-endian length `n` (as written, whatever the header's real size).
inline std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

/// A safetensors file from raw header text and data bytes (no padding added).
inline std::string st_bytes(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

struct StTensor {
  std::string name;
  std::string dtype;            // "F32", ...
  std::vector<int64_t> shape;
  uint32_t elem_size = 4;       // bytes per element of dtype
};

/// A valid file: tensors laid out back to back in the order given, data filled with a
/// byte pattern, header padded with spaces to a multiple of 8 (as writers do).
inline std::string good_st(const std::vector<StTensor>& tensors, const std::string& metadata_json = "") {
  std::string h = "{";
  bool first = true;
  if (!metadata_json.empty()) {
    h += "\"__metadata__\":" + metadata_json;
    first = false;
  }
  uint64_t off = 0;
  for (const auto& t : tensors) {
    uint64_t n = t.elem_size;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    if (!first) h += ",";
    first = false;
    h += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {  // appended: GCC 12 -Wrestrict misfires on "," + string&&
      if (i) h += ',';
      h += std::to_string(t.shape[i]);
    }
    h += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + n) + "]}";
    off += n;
  }
  h += "}";
  while ((8 + h.size()) % 8) h += ' ';
  std::string data(off, '\0');
  for (uint64_t i = 0; i < off; ++i) data[i] = static_cast<char>(i * 31 + 7);
  return st_bytes(h, data);
}

}  // namespace vlac::testing
