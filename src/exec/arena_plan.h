// Backend-neutral execution planning, part 1: where every activation of a graph lives in one
// arena. Storage roots (a reshape's output aliases its input), liveness per root over a
// schedule, then greedy placement. The CPU executor uses it; a CUDA executor reuses it unchanged
// (its arena is one device allocation at the same offsets).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace vlac::exec {

/// Alignment of every arena block (a cache line; also enough for any GPU vector load).
inline constexpr uint64_t kArenaAlign = 64;
inline uint64_t align_up(uint64_t v, uint64_t a = kArenaAlign) { return (v + a - 1) / a * a; }

/// Storage root of every value (by value id): a Reshape's output shares its input's storage,
/// transitively; every other value is its own root. `order` is a topological schedule.
std::vector<ir::ValueId> storage_roots(const ir::Graph& g, const std::vector<ir::NodeId>& order);

struct ArenaPlan {
  /// (storage root, byte offset) of every activation placed in the arena. Weights, inputs and
  /// constants are not in the arena (they live where the backend binds them).
  std::vector<std::pair<ir::ValueId, uint64_t>> blocks;
  uint64_t bytes = 0;  // arena size: the end of the highest block
};

/// Places every activation root of `order` in one arena: live range per root (earliest def,
/// latest use over the values sharing it), then largest first at the lowest offset whose time
/// range collides with no block placed so far. Deterministic; blocks in value-id order.
/// Engines that run one after another may share one arena of the largest plan's size.
/// Roots flagged in `outside` (by value id, may be empty) are left out: the backend keeps them in
/// buffers of their own (e.g. values that must persist between runs). `last_use_at_least` (by
/// value id, positions in `order`, may be empty; -1 = none) keeps a value's root alive at least
/// that long: a backend that fuses later nodes into one kernel reading it there (CUDA's
/// residual + norm) needs it not to share storage with what those nodes write. `stored_bytes`
/// (by value id, may be empty; 0 = the value's own size) gives a root's block size where the
/// backend stores it narrower than its graph dtype (CUDA's bf16 copies of f32 values).
ArenaPlan plan_arena(const ir::Graph& g, const std::vector<ir::NodeId>& order, const std::vector<ir::ValueId>& root,
                     const std::vector<uint8_t>& outside = {}, const std::vector<int64_t>& last_use_at_least = {},
                     const std::vector<uint64_t>& stored_bytes = {});

}  // namespace vlac::exec
