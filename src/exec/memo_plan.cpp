// Memo planning (see memo_plan.h).
#include "exec/memo_plan.h"

#include "exec/arena_plan.h"
#include "ir/walk.h"

namespace vlac::exec {

using ir::Node;
using ir::NodeId;
using ir::OpKind;
using ir::ValueId;

bool is_memo_input(const std::string& name, const std::vector<std::string>& memo_inputs) {
  for (const std::string& m : memo_inputs) {
    if (name == m) return true;
    const size_t colon = name.rfind(':');
    if (!name.empty() && name[0] == '%' && colon != std::string::npos && name.compare(colon + 1, std::string::npos, m) == 0)
      return true;
  }
  return false;
}

MemoPlan plan_memo(const ir::Graph& g, const std::vector<NodeId>& order, const std::vector<ValueId>& root,
                   const std::vector<std::string>& memo_inputs, uint64_t max_key_bytes) {
  MemoPlan p;
  p.node.assign(g.nodes().size(), 0);
  p.results.assign(g.nodes().size(), {});
  if (memo_inputs.empty()) return p;
  // "static" values: weights, constants, memo inputs, and the outputs of nodes reading only those.
  std::vector<uint8_t> fixed(g.values().size(), 0);
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const ValueId v = g.inputs()[i];
    if (!is_memo_input(g.node(g.value(v).producer).name, memo_inputs)) continue;
    p.key_inputs.push_back(int(i));
    p.key_bytes += g.info(v).bytes();
    fixed[size_t(v)] = 1;
  }
  auto off_plan = [&] {
    MemoPlan none;
    none.node.assign(g.nodes().size(), 0);
    none.results.assign(g.nodes().size(), {});
    return none;
  };
  if (p.key_inputs.empty() || p.key_bytes > max_key_bytes) return off_plan();
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if (n.op == OpKind::Weight || n.op == OpKind::Constant) {
      for (ValueId o : n.outputs) fixed[size_t(o)] = 1;
      continue;
    }
    if (n.op == OpKind::Input || n.inputs.empty()) continue;
    bool all = true;
    for (ValueId v : n.inputs) all = all && fixed[size_t(v)];
    if (!all) continue;
    if (n.op == OpKind::Reshape) {
      // A view of a weight, constant or input: static, but its bytes are not ours to write back.
      const OpKind root_op = g.node(g.value(root[size_t(n.inputs[0])]).producer).op;
      if (root_op == OpKind::Weight || root_op == OpKind::Constant || root_op == OpKind::Input) {
        for (ValueId o : n.outputs) fixed[size_t(o)] = 1;
        continue;
      }
    }
    p.node[size_t(id)] = 1;
    ++p.node_count;
    for (ValueId o : n.outputs) fixed[size_t(o)] = 1;
  }
  if (p.node_count == 0) return off_plan();
  // Results kept: memo values read by a node outside the memo, or graph outputs.
  std::vector<uint8_t> kept(g.values().size(), 0);
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if (p.node[size_t(id)] || n.op == OpKind::Weight || n.op == OpKind::Constant || n.op == OpKind::Input) continue;
    for (ValueId v : n.inputs)
      if (p.node[size_t(g.value(v).producer)]) kept[size_t(v)] = 1;
  }
  for (ValueId v : g.outputs())
    if (p.node[size_t(g.value(v).producer)]) kept[size_t(v)] = 1;
  uint64_t off = align_up(p.key_bytes);
  for (NodeId id : order) {
    if (!p.node[size_t(id)]) continue;
    for (ValueId o : g.node(id).outputs) {
      if (!kept[size_t(o)]) continue;
      p.results[size_t(id)].emplace_back(o, off);
      off += align_up(g.info(o).bytes());
    }
  }
  p.slot_bytes = off;
  return p;
}

std::vector<std::string> memo_only_weights(const ir::Graph& g, const std::vector<std::string>& memo_inputs) {
  if (memo_inputs.empty()) return {};
  auto order = ir::schedule(g);
  if (!order.is_ok()) return {};
  const std::vector<ValueId> root = storage_roots(g, *order);
  const MemoPlan p = plan_memo(g, *order, root, memo_inputs);
  if (!p.enabled()) return {};
  // By weight value: read by a memo node / by anything else (a Reshape is looked through: its
  // readers count, through the root).
  std::vector<uint8_t> memo_read(g.values().size(), 0), other_read(g.values().size(), 0);
  auto weight_root = [&](ValueId v) -> int64_t {
    const ValueId r = root[size_t(v)];
    return g.node(g.value(r).producer).op == OpKind::Weight ? int64_t(r) : -1;
  };
  for (NodeId id : *order) {
    const Node& n = g.node(id);
    if (n.op == OpKind::Weight || n.op == OpKind::Reshape) continue;
    for (ValueId v : n.inputs)
      if (const int64_t r = weight_root(v); r >= 0) (p.node[size_t(id)] ? memo_read : other_read)[size_t(r)] = 1;
  }
  for (ValueId v : g.outputs())
    if (const int64_t r = weight_root(v); r >= 0) other_read[size_t(r)] = 1;
  std::vector<std::string> names;
  for (NodeId id : *order) {
    const Node& n = g.node(id);
    if (n.op != OpKind::Weight || n.outputs.empty()) continue;
    const size_t v = size_t(n.outputs[0]);
    if (memo_read[v] && !other_read[v]) names.push_back(g.weights()[size_t(n.weight)].name);
  }
  return names;
}

}  // namespace vlac::exec
