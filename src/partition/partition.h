// Resource partitioner: cuts one graph into engines whose weight bytes stay under a fixed cap.
// Deterministic: depends only on the graph and the options (no free memory, timing or hashing).
// Works on meta only; never reads weight bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"

namespace vlac::partition {

struct Options {
  uint64_t engine_cap = 512ull << 20;  // weight bytes per engine (after packing)
  uint64_t crossing_limit = 64ull << 10;  // input-only values larger than this are recomputed
};

/// Bytes a weight occupies once packed for the backend (e.g. bf16 = half of fp32).
using WeightBytes = std::function<uint64_t(const ir::WeightRef&)>;

struct EnginePlan {
  std::string name;                      // "<stage>.<index>"
  std::vector<ir::NodeId> nodes;         // schedule order; includes Weight/Constant nodes it reads
  std::vector<ir::NodeId> recomputed;    // input-only nodes also computed by an earlier engine
  std::vector<ir::ValueId> inputs;       // read from outside: graph inputs, earlier engines (by id)
  std::vector<ir::ValueId> outputs;      // read by later engines or graph outputs (by id)
  std::vector<ir::WeightId> weights;     // every weight it reads
  std::vector<ir::WeightId> owned;       // weights stored with this engine (first reader)
  uint64_t weight_bytes = 0;             // packed bytes of `owned`
  bool over_cap = false;                 // one node's weights alone exceed the cap
  std::string over_cap_node;             // that node's name
};

/// A value that leaves one engine for later ones.
struct Crossing {
  ir::ValueId value = ir::kNone;
  int producer = -1;                     // engine index
  std::vector<int> consumers;            // engine indices (ascending)
  uint64_t bytes = 0;
};

struct Plan {
  std::vector<EnginePlan> engines;       // run order
  std::vector<Crossing> crossings;       // by value id
  std::vector<int> weight_last_use;      // by WeightId: the last engine reading it (-1: unused)
  uint64_t recomputed_bytes = 0;         // bytes of input-only values recomputed instead of passed
};

/// Cuts `g` (nodes reachable from its outputs) into engines named "<stage>.<i>": contiguous runs
/// of the schedule whose stored weights fit the cap (a node whose own weights exceed the cap gets
/// an engine of its own, flagged over_cap). Among those cuts, the ones that pass the fewest bytes
/// between engines (each engine past the first weighed as 1 MiB more), so cuts land where little
/// is in flight (a layer's residual stream, not an MLP's [tokens, 16384]); a node with several
/// outputs is placed with its first consumer; input-only values over crossing_limit read by
/// another engine are recomputed there.
Result<Plan> partition_graph(const ir::Graph& g, const std::string& stage, const WeightBytes& weight_bytes,
                             const Options& options = {});

/// Name of a value at an engine boundary: the graph input's name, the name in `named` (e.g. the
/// stage's outputs "prefix.k.0"), else "%<id>:<producer node name>".
std::string boundary_name(const ir::Graph& g, ir::ValueId v, const std::map<ir::ValueId, std::string>& named);

/// The engine's own graph: one Input per plan input (named by boundary_name), its nodes,
/// outputs in plan order. Verified.
Result<ir::Graph> extract_engine(const ir::Graph& g, const Plan& plan, size_t engine,
                                 const std::map<ir::ValueId, std::string>& named);

/// Human-readable plan: one line per engine (weights, inputs, outputs, crossing bytes).
std::string plan_summary(const ir::Graph& g, const Plan& plan, const std::map<ir::ValueId, std::string>& named);

}  // namespace vlac::partition
