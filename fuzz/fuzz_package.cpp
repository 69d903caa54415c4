// libFuzzer target: the strict .vlac reader (parse_package + segment verification) on
// arbitrary bytes. Must never crash, hang or read outside the input, whatever the bytes.
// Each input is parsed as is, then again with its checksums made right, so the fuzzer also
// reaches the layout and manifest rules behind the checksums.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "package/package.h"

namespace {

void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

void parse_and_verify(const uint8_t* data, size_t size) {
  auto layout = vlac::parse_package(data, size, "fuzz.vlac");
  if (!layout.is_ok()) return;
  (void)vlac::verify_package_segments(data, size, layout.value(), "fuzz.vlac", 4096, {});
  (void)layout->manifest.to_json().dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vlac::package;
  parse_and_verify(data, size);
  if (size < kHeaderSize) return 0;
  std::vector<uint8_t> b(data, data + size);
  Header h = decode_header(b.data(), nullptr);
  if (h.table_offset <= size && h.table_size <= size - h.table_offset)
    put_u64(b.data() + 56, checksum_bytes(b.data() + h.table_offset, h.table_size));
  if (h.manifest_offset <= size && h.manifest_size <= size - h.manifest_offset)
    put_u64(b.data() + 80, checksum_bytes(b.data() + h.manifest_offset, h.manifest_size));
  put_u64(b.data() + kHeaderChecksumOffset, checksum_bytes(b.data(), kHeaderChecksumOffset));
  parse_and_verify(b.data(), b.size());
  return 0;
}
