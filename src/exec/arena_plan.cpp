// Arena planning (see arena_plan.h).
#include "exec/arena_plan.h"

#include <algorithm>

#include "ir/walk.h"

namespace vlac::exec {

using ir::NodeId;
using ir::OpKind;
using ir::ValueId;

std::vector<ValueId> storage_roots(const ir::Graph& g, const std::vector<NodeId>& order) {
  std::vector<ValueId> root(g.values().size());
  for (size_t v = 0; v < root.size(); ++v) root[v] = ValueId(v);
  for (NodeId id : order) {
    const ir::Node& n = g.node(id);
    if (n.op == OpKind::Reshape) root[size_t(n.outputs[0])] = root[size_t(n.inputs[0])];
  }
  return root;
}

ArenaPlan plan_arena(const ir::Graph& g, const std::vector<NodeId>& order, const std::vector<ValueId>& root,
                     const std::vector<uint8_t>& outside, const std::vector<int64_t>& last_use_at_least,
                     const std::vector<uint64_t>& stored_bytes) {
  const size_t nv = g.values().size();
  std::vector<ir::LiveRange> live = ir::liveness(g, order);
  std::vector<int64_t> first(nv, -1), lastu(nv, -1);
  for (size_t v = 0; v < nv; ++v) {
    if (live[v].def < 0) continue;
    const size_t r = size_t(root[v]);
    if (first[r] < 0 || live[v].def < first[r]) first[r] = live[v].def;
    lastu[r] = std::max(lastu[r], live[v].last_use);
    if (v < last_use_at_least.size()) lastu[r] = std::max(lastu[r], last_use_at_least[v]);
  }
  struct Block { ValueId v; uint64_t bytes; int64_t a, b; uint64_t off; };
  std::vector<Block> blocks;
  for (size_t v = 0; v < nv; ++v) {
    if (root[v] != ValueId(v) || first[v] < 0) continue;
    if (v < outside.size() && outside[v]) continue;
    const OpKind op = g.node(g.value(ValueId(v)).producer).op;
    if (op == OpKind::Weight || op == OpKind::Input || op == OpKind::Constant) continue;
    const uint64_t bytes = v < stored_bytes.size() && stored_bytes[v] ? stored_bytes[v] : g.info(ValueId(v)).bytes();
    blocks.push_back({ValueId(v), align_up(std::max<uint64_t>(bytes, 1)), first[v], lastu[v], 0});
  }
  std::vector<size_t> by_size(blocks.size());
  for (size_t i = 0; i < by_size.size(); ++i) by_size[i] = i;
  std::stable_sort(by_size.begin(), by_size.end(), [&](size_t x, size_t y) { return blocks[x].bytes > blocks[y].bytes; });
  ArenaPlan plan;
  std::vector<size_t> placed;
  std::vector<std::pair<uint64_t, uint64_t>> busy;
  for (size_t bi : by_size) {
    Block& b = blocks[bi];
    busy.clear();
    for (size_t pi : placed) {
      const Block& p = blocks[pi];
      if (p.a <= b.b && b.a <= p.b) busy.emplace_back(p.off, p.off + p.bytes);
    }
    std::sort(busy.begin(), busy.end());
    uint64_t off = 0;
    for (const auto& [s, e] : busy) {
      if (off + b.bytes <= s) break;
      off = std::max(off, e);
    }
    b.off = off;
    plan.bytes = std::max(plan.bytes, off + b.bytes);
    placed.push_back(bi);
  }
  for (const Block& b : blocks) plan.blocks.emplace_back(b.v, b.off);
  return plan;
}

}  // namespace vlac::exec
