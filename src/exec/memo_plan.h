// Backend-neutral execution planning, part 2: the memo of nodes that depend only on a few small
// inputs (pi0.5's denoise time t). Which nodes are computed from those inputs, weights and
// constants alone, which of their results the rest of the graph reads, and the byte layout of
// one memo slot ([key: the memo inputs' bytes][results]). The executor owns the slots and the
// lookup; a CUDA executor reuses this plan unchanged (its slots in device memory).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace vlac::exec {

struct MemoPlan {
  std::vector<uint8_t> node;  // by node id: 1 when the memo covers it
  /// By node id: (value, offset in a slot) of each result kept (read outside the memo or a
  /// graph output).
  std::vector<std::vector<std::pair<ir::ValueId, uint64_t>>> results;
  std::vector<int> key_inputs;  // indices into graph().inputs(), in input order
  uint64_t key_bytes = 0;       // bytes of the key (the memo inputs, back to back)
  uint64_t slot_bytes = 0;      // bytes of one slot
  size_t node_count = 0;        // 0: the memo is off

  bool enabled() const { return node_count > 0; }
};

/// True when input node `name` is one of `memo_inputs`, also as a partitioned engine's boundary
/// input "%N:name".
bool is_memo_input(const std::string& name, const std::vector<std::string>& memo_inputs);

/// Plans the memo of `g` over `order` (root: exec::storage_roots). Off (an empty plan, sized by
/// node count) when no input matches, when the key exceeds `max_key_bytes` (keys are compared
/// on every run), or when no node depends on the memo inputs alone. Views (reshapes) of
/// weights, constants and inputs are static but never memo nodes: a hit never writes there.
MemoPlan plan_memo(const ir::Graph& g, const std::vector<ir::NodeId>& order, const std::vector<ir::ValueId>& root,
                   const std::vector<std::string>& memo_inputs, uint64_t max_key_bytes = 64 * 1024);

/// Names of the weights of `g` that only memo nodes read (pi0.5: the time MLP and every adaRMS
/// modulation matrix). Once the memo holds a key, nothing reads them for it again, so a backend
/// that copies weights may leave these in the file and read them at a memo miss
/// (WeightBinding::on_demand). Empty when the memo is off.
std::vector<std::string> memo_only_weights(const ir::Graph& g, const std::vector<std::string>& memo_inputs);

}  // namespace vlac::exec
