// Test helpers for the .vlac package tests: a temporary folder, file helpers, a small valid
// manifest, and a raw encoder (independent of PackageWriter) that lays out format.h by hand so
// tests can produce packages that lie. Test-only; never used by src/.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "package/format.h"
#include "package/manifest.h"
#include "temp_dir_util.h"

namespace vlac::pkgtest {

// Made as vlac-pkg-test-XXXXXX.
class TempDir : public testutil::TempDir {
 public:
  TempDir() : testutil::TempDir("pkg-test") {}
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

/// Deterministic pseudo-random bytes.
inline std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v[i] = static_cast<uint8_t>(x);
  }
  return v;
}

/// A sparse file of `size` bytes with a few marked bytes (so its checksum is not all-zero's).
inline void make_sparse(const std::string& path, uint64_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  for (uint64_t off : {uint64_t{0}, size / 3, size / 2 + 7, size - 1}) {
    char c = static_cast<char>('A' + off % 26);
    ASSERT_EQ(pwrite(fd, &c, 1, static_cast<off_t>(off)), 1);
  }
  ::close(fd);
}

inline PackageTensor tensor(const std::string& name, DType dt, std::vector<int64_t> shape) {
  PackageTensor t;
  t.name = name;
  t.dtype = dt;
  t.shape = std::move(shape);
  return t;
}

/// Two engines over segments "engine/0" and "engine/1"; normalization/tokenizer optional.
inline PackageManifest two_engine_manifest(const char* stats = nullptr, const char* tok = nullptr) {
  PackageManifest m;
  PackageEngine e0;
  e0.name = "prefix";
  e0.segment = "engine/0";
  e0.backend = "cpu";
  e0.inputs = {tensor("images", DType::F32, {1, 3, 224, 224}), tensor("tokens", DType::I64, {1, 48})};
  e0.outputs = {tensor("kv", DType::BF16, {18, 2, 1, 304, 256})};
  PackageEngine e1 = e0;
  e1.name = "expert";
  e1.segment = "engine/1";
  e1.inputs = {tensor("kv", DType::BF16, {18, 2, 1, 304, 256}), tensor("noise", DType::F32, {1, 50, 32})};
  e1.outputs = {tensor("actions", DType::F32, {1, 50, 32})};
  e1.extra["weight_bytes"] = 123;
  m.engines = {e0, e1};
  PackageCrossing c;
  c.name = "state_emb";
  c.dtype = DType::F32;
  c.shape = {1, 1024};
  c.bytes = 4096;
  c.producer = "prefix";
  c.consumers = {"expert"};
  m.crossing = {c};
  m.policy = {{"type", "pi05"}, {"chunk_size", 50}};
  m.metadata = {{"vlac", "test"}};
  if (stats) m.normalization_segment = stats;
  if (tok) {
    m.tokenizer_segment = tok;
    m.tokenizer = {{"type", "sentencepiece"}};
  }
  return m;
}

/// A package laid out by hand (format.h), with hooks to make it lie. Mirrors the writer's
/// layout rules so an unmodified RawPackage is valid.
struct RawSegment {
  std::string name;
  uint32_t kind = 1;
  std::string bytes;
  uint32_t alignment = package::kSegmentAlignment;
};

struct RawPackage {
  std::string manifest;
  std::vector<RawSegment> segments;
  /// Called after the layout is computed and before encoding (checksums are then recomputed
  /// unless the hook sets keep_checksums).
  std::function<void(package::Header&, std::vector<package::Record>&, std::string& names)> lie;
  bool keep_table_checksum = false;
  bool keep_header_checksum = false;

  std::string encode() const {
    using namespace package;
    Header h;
    std::string names;
    for (const auto& s : segments) names += s.name;
    h.segment_count = segments.size();
    h.table_size = segments.size() * kRecordSize + names.size();
    align_up(h.table_offset + h.table_size, 8, &h.manifest_offset);
    h.manifest_size = manifest.size();
    h.manifest_checksum = checksum_bytes(manifest.data(), manifest.size());
    std::vector<Record> recs(segments.size());
    uint64_t end = h.manifest_offset + h.manifest_size;
    uint32_t cursor = 0;
    for (size_t i = 0; i < segments.size(); ++i) {
      align_up(end, segments[i].alignment, &recs[i].offset);
      recs[i].size = segments[i].bytes.size();
      recs[i].checksum = checksum_bytes(segments[i].bytes.data(), segments[i].bytes.size());
      recs[i].name_offset = cursor;
      recs[i].name_size = static_cast<uint32_t>(segments[i].name.size());
      recs[i].kind = segments[i].kind;
      recs[i].alignment = segments[i].alignment;
      cursor += recs[i].name_size;
      end = recs[i].offset + recs[i].size;
    }
    h.file_size = end;
    // Bytes are placed where the honest layout says, before any lie.
    std::vector<uint64_t> honest_offsets;
    for (const auto& r : recs) honest_offsets.push_back(r.offset);
    uint64_t honest_size = h.file_size;
    uint64_t honest_manifest = h.manifest_offset;
    if (lie) lie(h, recs, names);
    std::string table(segments.size() * kRecordSize, '\0');
    for (size_t i = 0; i < recs.size(); ++i) encode_record(recs[i], reinterpret_cast<uint8_t*>(table.data()) + i * kRecordSize);
    table += names;
    if (!keep_table_checksum) h.table_checksum = checksum_bytes(table.data(), table.size());
    std::string out(honest_size, '\0');
    uint8_t hdr[kHeaderSize];
    uint64_t stored = h.header_checksum;
    encode_header(h, hdr);
    if (keep_header_checksum) {
      for (int i = 0; i < 8; ++i) hdr[kHeaderChecksumOffset + i] = static_cast<uint8_t>(stored >> (8 * i));
    }
    out.replace(0, kHeaderSize, reinterpret_cast<const char*>(hdr), kHeaderSize);
    auto put = [&](uint64_t off, const std::string& b) {
      if (off + b.size() > out.size()) out.resize(off + b.size(), '\0');
      out.replace(off, b.size(), b);
    };
    put(kHeaderSize, table);
    // Lies may move where the header says the manifest is; place it where the honest layout says.
    put(honest_manifest, manifest);
    for (size_t i = 0; i < segments.size(); ++i) put(honest_offsets[i], segments[i].bytes);
    return out;
  }
};

/// A valid manifest text for RawPackage with engine segments "engine/0" and "engine/1".
inline std::string raw_manifest() { return two_engine_manifest().to_json().dump(); }

inline RawPackage raw_good() {
  RawPackage p;
  p.manifest = raw_manifest();
  auto a = pattern(3000, 1), b = pattern(70000, 2);
  p.segments = {{"engine/0", 1, std::string(a.begin(), a.end())}, {"engine/1", 1, std::string(b.begin(), b.end())}};
  return p;
}

}  // namespace vlac::pkgtest
