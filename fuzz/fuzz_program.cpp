// Fuzz target: an engine program (graph JSON from a package manifest) through the strict reader,
// then re-specialization of its first input; neither may crash or trip a sanitizer.
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "ir/serialize.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  auto g = vlac::ir::graph_from_json(j, "fuzz");
  if (!g.is_ok()) return 0;
  (void)vlac::ir::graph_to_json(*g).dump();
  if (!g->inputs().empty()) {
    const vlac::ir::ValueId v = g->inputs()[0];
    std::vector<int64_t> shape = g->info(v).shape;
    if (!shape.empty()) shape[0] = shape[0] + 1;
    (void)vlac::ir::respecialize(*g, {{vlac::ir::input_name(*g, v), shape}});
  }
  return 0;
}
