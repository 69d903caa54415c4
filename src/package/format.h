// The .vlac package byte layout (version 1): the one place the bytes are documented in code
// (docs/format.md says the same for people). Written by package_writer.cpp, read by package.cpp.
// Pure layout: encode/decode of fixed records, no I/O, no allocation beyond strings.
//
// A package is one file, little-endian, explicit widths, no implicit padding:
//
//   [0, 128)                 fixed header
//   [128, 128 + T)           segment table: N records of 48 bytes, then the name pool
//   [M, M + S)               manifest: JSON, UTF-8 (M = T-end rounded up to 8; gap is zero)
//   [o_0, o_0 + s_0) ...     segments, in table order; o_i = align_up(end of the previous
//                            region, alignment_i); the gaps are zero bytes
//   file size = end of the last segment (or of the manifest when there is none)
//
// Fixed header (128 bytes):
//   off size field
//     0    8 magic              "VLACPKG\0"
//     8    4 version            u32 = 1 (this reader accepts exactly kFormatVersion)
//    12    4 header_size        u32 = 128
//    16    8 flags              u64 = 0 (no flag is defined; any set bit is rejected)
//    24    8 file_size          u64, the exact size of the file
//    32    8 table_offset       u64 = header_size
//    40    8 table_size         u64 = N * 48 + name pool bytes
//    48    8 segment_count      u64 = N (<= kMaxSegments)
//    56    8 table_checksum     u64, xxh64 (seed 0) of the table bytes
//    64    8 manifest_offset    u64 = align_up(table_offset + table_size, 8)
//    72    8 manifest_size      u64 (1 .. kMaxManifestBytes)
//    80    8 manifest_checksum  u64, xxh64 (seed 0) of the manifest bytes
//    88    4 segment_alignment  u32 = 65536: every segment's alignment is at least this
//    92   28 reserved           zero
//   120    8 header_checksum    u64, xxh64 (seed 0) of bytes [0, 120)
//
// Segment record (48 bytes, N of them, in file order):
//     0    8 offset             u64, absolute, a multiple of alignment
//     8    8 size               u64 (0 allowed)
//    16    8 checksum           u64, xxh64 (seed 0) of the segment's bytes
//    24    4 name_offset        u32, into the name pool; names are stored back to back in
//                               record order, so name_offset_i = sum of earlier name_size
//    28    4 name_size          u32, 1 .. kMaxNameBytes; bytes 0x21..0x7E; unique
//    32    4 kind               u32, SegmentKind (unknown values rejected)
//    36    4 alignment          u32, power of two, segment_alignment .. kMaxAlignment
//    40    8 reserved           zero
// The name pool follows the records and is exactly the sum of name sizes.
//
// Manifest (JSON object; required keys, others kept as free-form):
//   "engines":       [ {"name", "segment" (a segment of kind engine), "backend",
//                       "inputs": [tensor], "outputs": [tensor], ...} ] in run order
//   "crossing":      [ {"name", "dtype", "shape", "bytes", "producer", "consumers": [..]} ]
//   "policy":        object (the policy config)
//   "normalization": null or {"segment": name of a stats segment, ...}
//   "tokenizer":     null or {"segment": name of a tokenizer segment, ...}
//   "metadata":      object (free-form)
//   tensor = {"name": string, "dtype": safetensors dtype name, "shape": [int >= 0]}
//
// Compatibility rule: add fields at the end, bump the version, never reuse a field.
// The reader rejects any version other than its own with a message naming both.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace vlac::package {

inline constexpr char kMagic[8] = {'V', 'L', 'A', 'C', 'P', 'K', 'G', '\0'};
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr uint32_t kHeaderSize = 128;
inline constexpr uint32_t kHeaderChecksumOffset = 120;
inline constexpr uint32_t kRecordSize = 48;
/// DESIGN rule 4: the largest arm64 page size, so segments map in place on Jetson too.
inline constexpr uint32_t kSegmentAlignment = 65536;
inline constexpr uint32_t kMaxAlignment = 1u << 30;
inline constexpr uint64_t kMaxSegments = 65536;
inline constexpr uint32_t kMaxNameBytes = 1024;
inline constexpr uint64_t kMaxManifestBytes = 64ull << 20;
inline constexpr int kMaxManifestDepth = 64;

enum class SegmentKind : uint32_t {
  Engine = 1,     // a compiled engine file (backend-specific bytes)
  Weights = 2,    // weights used in place (e.g. an embedding table)
  Stats = 3,      // normalization statistics
  Tokenizer = 4,  // tokenizer model
  Config = 5,     // a side file kept verbatim (e.g. a processor config)
  Data = 6,       // any other named bytes
};

/// "engine", "weights", ...; nullptr for an unknown value.
const char* kind_name(SegmentKind kind);
/// Parses a kind name; nullopt if unknown.
std::optional<SegmentKind> kind_from_name(std::string_view name);
bool is_known_kind(uint32_t value);

/// The fixed header, decoded. Field order and meaning as in the table above.
struct Header {
  uint32_t version = kFormatVersion;
  uint32_t header_size = kHeaderSize;
  uint64_t flags = 0;
  uint64_t file_size = 0;
  uint64_t table_offset = kHeaderSize;
  uint64_t table_size = 0;
  uint64_t segment_count = 0;
  uint64_t table_checksum = 0;
  uint64_t manifest_offset = 0;
  uint64_t manifest_size = 0;
  uint64_t manifest_checksum = 0;
  uint32_t segment_alignment = kSegmentAlignment;
  uint64_t header_checksum = 0;  // as stored (decode) / computed (encode)
};

/// One segment record, decoded.
struct Record {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  uint32_t name_offset = 0;
  uint32_t name_size = 0;
  uint32_t kind = 0;
  uint32_t alignment = kSegmentAlignment;
  uint64_t reserved = 0;
};

/// Writes the 128 header bytes into `out`, computing header_checksum.
void encode_header(const Header& h, uint8_t out[kHeaderSize]);
/// Reads the fields of a header (no validation; `in` must hold kHeaderSize bytes).
/// `reserved_nonzero` is set when any reserved byte is not zero.
Header decode_header(const uint8_t in[kHeaderSize], bool* reserved_nonzero);
void encode_record(const Record& r, uint8_t out[kRecordSize]);
Record decode_record(const uint8_t in[kRecordSize]);

/// xxh64 with seed 0 (the checksum used everywhere in the format).
uint64_t checksum_bytes(const void* data, size_t size);

/// Rounds `v` up to a multiple of the power of two `a`; false on overflow.
inline bool align_up(uint64_t v, uint64_t a, uint64_t* out) {
  uint64_t t;
  if (__builtin_add_overflow(v, a - 1, &t)) return false;
  *out = t & ~(a - 1);
  return true;
}
inline bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

/// A segment name is 1..kMaxNameBytes bytes in 0x21..0x7E (printable ASCII, no space).
bool is_valid_name(std::string_view name);
/// An untrusted name made safe for a one-line message (bad bytes as \xNN, cut at 80 bytes).
std::string printable_name(std::string_view name);
/// "0x" + 16 hex digits.
std::string hex64(uint64_t v);

}  // namespace vlac::package
