// Fused projections, a backend-neutral IR pass: the Linears of one module that read the same
// input (q/k/v, gate/up) become one Linear over their weights concatenated along axis 0 plus a
// Slice of the output per former Linear, so a GPU runs one GEMM where the graph had three. The
// result computes the same values on every backend. Meta only: the fused weight is a reference
// to its parts (WeightRef::parts); no weight byte is read here.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "ir/backend.h"
#include "ir/graph.h"

namespace vlac::ir {

/// One fusion rule: Linears whose weights are named `<module>.<role>.weight` (biases
/// `<module>.<role>.bias`) for every role of `roles` become `<module>.<fused>.weight` whose rows
/// are the roles' rows in this order.
struct FuseRule {
  std::string fused;
  std::vector<std::string> roles;
};

/// The rules fuse_linears applies, first match wins per module: q|k|v -> qkv_proj (the CUDA
/// kernels' [q heads | k | v] row), k|v -> kv_proj (a K/V-only layer), gate|up -> gate_up_proj
/// (GeGLU reads gate = p, up = p + F).
const std::vector<FuseRule>& default_fuse_rules();

struct FuseStats {
  int groups = 0;          // fused Linears written
  int linears_fused = 0;   // Linears they replace
};

/// Rewrites `g` by `rules`. A group fuses only when every member is a Linear of the same input
/// value whose weight (and bias, all or none) is a Weight node read by that Linear alone, of one
/// dtype, rank 2, with equal column counts; anything else is left as it was. Each member's output
/// becomes Slice(fused, axis -1, [start, end)) named as the member was, placed where the first
/// member was (so the order stays topological); the dropped weights leave the weight table.
/// Deterministic. The result passes verify().
Result<LoweredGraph> fuse_linears(const Graph& g, const std::vector<FuseRule>& rules = default_fuse_rules(),
                                  FuseStats* stats = nullptr);

}  // namespace vlac::ir
