// Graph walks: topological order, reachability, use lists, liveness, input-only marking.
// All walks are iterative (explicit stacks): a chain of millions of nodes must not recurse.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"

namespace vlac::ir {

/// Consumers of every value in compressed form: uses of value v are
/// node_ids[offsets[v] .. offsets[v+1]) (a node appears once per input slot that reads v).
struct UseLists {
  std::vector<int64_t> offsets;  // [n_values + 1]
  std::vector<NodeId> node_ids;  // [n_uses]

  int64_t count(ValueId v) const { return offsets[size_t(v) + 1] - offsets[size_t(v)]; }
};
UseLists build_use_lists(const Graph& g);

/// Every node in a topological order (producers before consumers). Deterministic: a
/// depth-first post-order over the nodes in id order, each node's inputs visited in order.
/// Returns Internal naming a node on a cycle, or on a dangling value id.
Result<std::vector<NodeId>> topo_order(const Graph& g);

/// Nodes the graph outputs depend on (walking backwards from the outputs): flags by node id.
std::vector<bool> reachable_from_outputs(const Graph& g);

/// Only the nodes reachable from the outputs, in topological order (the schedule passes and
/// partitioner work on; dead nodes drop out).
Result<std::vector<NodeId>> schedule(const Graph& g);

/// Live range of one value in a given order: defined at step `def`, last read at step
/// `last_use` (== def when never read; == order size when it is a graph output).
struct LiveRange {
  int64_t def = -1;       // -1: the producer is not in the order
  int64_t last_use = -1;
};
/// Live ranges of every value (indexed by value id) for `order` (a topological order of a subset
/// of nodes). Uses by nodes outside `order` are ignored.
std::vector<LiveRange> liveness(const Graph& g, const std::vector<NodeId>& order);
/// Largest sum of bytes of values live at once over `order` (a value occupies [def, last_use]).
uint64_t peak_live_bytes(const Graph& g, const std::vector<NodeId>& order,
                         const std::vector<LiveRange>& live);

/// Flags by value id: true when the value depends only on graph inputs and constants (no
/// weight reaches it). The partitioner may recompute such values (masks, rotary positions) in
/// each engine instead of passing them across. Needs a topological order.
std::vector<bool> input_only_values(const Graph& g, const std::vector<NodeId>& order);

}  // namespace vlac::ir
