// Human-readable listing of a graph: one line per node in topological order, then totals.
// Read-only; never touches weight bytes (sizes come from the references).
#pragma once

#include <string>

#include "ir/graph.h"

namespace vlac::ir {

/// Every node in topological order:
///   `  12 linear        lm.0.q_proj  (%5, %11) -> %12 f32[968, 2048]  w 8.00 MiB`
/// (inputs by value id, output infos, bytes of the weights the node reads directly, attributes),
/// then totals: nodes, values, weights and their bytes, and the peak of live activation bytes
/// in that order. A graph with a cycle prints the error instead of the listing.
std::string print_graph(const Graph& g);

}  // namespace vlac::ir
