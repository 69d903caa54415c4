// libFuzzer target: the pickle reader on arbitrary bytes, then (when it decodes) the snapshot
// decoder, the analysis and all three renderers. Any crash, leak or UB is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "diag/pickle_reader.h"
#include "diag/snapshot_analysis.h"
#include "diag/snapshot_data.h"
#include "diag/snapshot_report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  vlac::PickleLimits lim;
  lim.max_objects = 1u << 20;  // keep each input cheap
  lim.max_memo = 1u << 16;
  lim.max_stack = 1u << 16;
  auto doc = vlac::read_pickle(std::span<const uint8_t>(data, size), lim);
  if (!doc.is_ok()) return 0;
  (void)doc->repr(doc->root(), 8, 16);
  auto snap = vlac::decode_snapshot(doc.value());
  if (!snap.is_ok()) return 0;
  auto a = vlac::analyze_snapshot(snap.value());
  if (!a.is_ok()) return 0;
  (void)vlac::snapshot_text(a.value(), "fuzz");
  (void)vlac::snapshot_json(a.value(), "fuzz").dump();
  (void)vlac::snapshot_html(a.value(), "fuzz");
  return 0;
}
