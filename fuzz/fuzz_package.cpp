// libFuzzer target: the strict .vlac reader (parse_package + segment verification) on
// arbitrary bytes. Must never crash, hang or read outside the input, whatever the bytes.
#include <cstddef>
#include <cstdint>

#include "package/package.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto layout = vlac::parse_package(data, size, "fuzz.vlac");
  if (!layout.is_ok()) return 0;
  // Valid layout: the checksum pass must stay inside the bytes too.
  (void)vlac::verify_package_segments(data, size, layout.value(), "fuzz.vlac", 4096, {});
  for (const auto& s : layout->segments) (void)s.name.size();
  (void)layout->manifest.to_json().dump();
  return 0;
}
