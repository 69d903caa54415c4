// libFuzzer target for the safetensors header reader: any bytes must give a header or a
// Status, never a crash; on success every tensor's span is checked against the file.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = vlac::parse_safetensors_header(data, size, "fuzz.safetensors");
  if (!r.is_ok()) {
    if (r.status().message().empty() || !r.status().is_bad_input()) std::abort();
    return 0;
  }
  const vlac::SafetensorsHeader& h = r.value();
  if (h.data_offset < 8 || h.data_offset > size) std::abort();
  uint64_t covered = 0;
  volatile uint8_t sink = 0;
  for (const vlac::TensorInfo& t : h.tensors) {
    if (t.data_begin > t.data_end || h.data_offset + t.data_end > size) std::abort();
    if (t.nbytes() != t.numel() * vlac::dtype_size(t.dtype)) std::abort();
    if (t.nbytes() > 0) {  // touch the first and last byte of the span (ASan checks the bounds)
      sink = sink + data[h.data_offset + t.data_begin];
      sink = sink + data[h.data_offset + t.data_end - 1];
    }
    covered += t.nbytes();
  }
  if (covered != size - h.data_offset) std::abort();
  (void)sink;
  return 0;
}
