// Encode/decode of the fixed .vlac records documented in format.h (explicit little-endian,
// independent of the host's byte order). No I/O here.
#include "package/format.h"

#include <xxhash.h>

#include <cstdio>

namespace vlac::package {

namespace {

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct KindName {
  SegmentKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {SegmentKind::Engine, "engine"},       {SegmentKind::Weights, "weights"},
    {SegmentKind::Stats, "stats"},         {SegmentKind::Tokenizer, "tokenizer"},
    {SegmentKind::Config, "config"},       {SegmentKind::Data, "data"},
};

}  // namespace

const char* kind_name(SegmentKind kind) {
  for (const auto& k : kKinds)
    if (k.kind == kind) return k.name;
  return nullptr;
}

std::optional<SegmentKind> kind_from_name(std::string_view name) {
  for (const auto& k : kKinds)
    if (name == k.name) return k.kind;
  return std::nullopt;
}

bool is_known_kind(uint32_t value) { return kind_name(static_cast<SegmentKind>(value)) != nullptr; }

void encode_header(const Header& h, uint8_t out[kHeaderSize]) {
  std::memset(out, 0, kHeaderSize);
  std::memcpy(out, kMagic, 8);
  put_u32(out + 8, h.version);
  put_u32(out + 12, h.header_size);
  put_u64(out + 16, h.flags);
  put_u64(out + 24, h.file_size);
  put_u64(out + 32, h.table_offset);
  put_u64(out + 40, h.table_size);
  put_u64(out + 48, h.segment_count);
  put_u64(out + 56, h.table_checksum);
  put_u64(out + 64, h.manifest_offset);
  put_u64(out + 72, h.manifest_size);
  put_u64(out + 80, h.manifest_checksum);
  put_u32(out + 88, h.segment_alignment);
  // [92, 120) reserved, zero.
  put_u64(out + kHeaderChecksumOffset, checksum_bytes(out, kHeaderChecksumOffset));
}

Header decode_header(const uint8_t in[kHeaderSize], bool* reserved_nonzero) {
  Header h;
  h.version = get_u32(in + 8);
  h.header_size = get_u32(in + 12);
  h.flags = get_u64(in + 16);
  h.file_size = get_u64(in + 24);
  h.table_offset = get_u64(in + 32);
  h.table_size = get_u64(in + 40);
  h.segment_count = get_u64(in + 48);
  h.table_checksum = get_u64(in + 56);
  h.manifest_offset = get_u64(in + 64);
  h.manifest_size = get_u64(in + 72);
  h.manifest_checksum = get_u64(in + 80);
  h.segment_alignment = get_u32(in + 88);
  h.header_checksum = get_u64(in + kHeaderChecksumOffset);
  bool nz = false;
  for (uint32_t i = 92; i < kHeaderChecksumOffset; ++i) nz = nz || in[i] != 0;
  if (reserved_nonzero != nullptr) *reserved_nonzero = nz;
  return h;
}

void encode_record(const Record& r, uint8_t out[kRecordSize]) {
  std::memset(out, 0, kRecordSize);
  put_u64(out + 0, r.offset);
  put_u64(out + 8, r.size);
  put_u64(out + 16, r.checksum);
  put_u32(out + 24, r.name_offset);
  put_u32(out + 28, r.name_size);
  put_u32(out + 32, r.kind);
  put_u32(out + 36, r.alignment);
  put_u64(out + 40, r.reserved);
}

Record decode_record(const uint8_t in[kRecordSize]) {
  Record r;
  r.offset = get_u64(in + 0);
  r.size = get_u64(in + 8);
  r.checksum = get_u64(in + 16);
  r.name_offset = get_u32(in + 24);
  r.name_size = get_u32(in + 28);
  r.kind = get_u32(in + 32);
  r.alignment = get_u32(in + 36);
  r.reserved = get_u64(in + 40);
  return r;
}

uint64_t checksum_bytes(const void* data, size_t size) {
  return XXH64(size ? data : "", size, 0);
}

bool is_valid_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x21 || u > 0x7E) return false;
  }
  return true;
}

std::string printable_name(std::string_view name) {
  std::string out;
  size_t n = 0;
  for (char c : name) {
    if (++n > 80) {
      out += "...";
      break;
    }
    auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u <= 0x7E && u != '\\') {
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", u);
      out += buf;
    }
  }
  return out;
}

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace vlac::package
