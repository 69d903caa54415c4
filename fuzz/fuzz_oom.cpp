// libFuzzer target for the PyTorch OOM message reader: any bytes must give a message or a
// bad-input Status, never a crash; a parsed message must explain and render without one.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "diag/oom_explain.h"
#include "diag/oom_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = vlac::diag::parse_oom(text, "fuzz.log");
  if (!r.is_ok()) {
    if (r.status().message().empty() || !r.status().is_bad_input()) std::abort();
    return 0;
  }
  const vlac::diag::OomMessage& m = r.value();
  if (m.n_messages == 0) std::abort();
  vlac::diag::OomExplanation ex = vlac::diag::explain_oom(m);
  if (ex.levers.empty()) std::abort();
  if (ex.request_min_bytes && ex.request_max_bytes && *ex.request_min_bytes > *ex.request_max_bytes) std::abort();
  if (ex.fragmentation_ratio && (*ex.fragmentation_ratio < 0 || *ex.fragmentation_ratio > 1.0 + 1e-9)) std::abort();
  volatile size_t sink = vlac::diag::oom_report_json(m, ex).size() + vlac::diag::oom_report_text(m, ex).size();
  (void)sink;
  return 0;
}
