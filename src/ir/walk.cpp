// Iterative graph walks (explicit stacks, never recursion): topological order, reachability,
// use lists, liveness and input-only marking. Must not mutate the graph.
#include "ir/walk.h"

#include <algorithm>
#include <string>

namespace vlac::ir {
namespace {

std::string node_label(const Graph& g, NodeId n) {
  const Node& nd = g.node(n);
  return "node " + std::to_string(n) + (nd.name.empty() ? "" : " '" + nd.name + "'") + " (" +
         op_name(nd.op) + ")";
}

}  // namespace

UseLists build_use_lists(const Graph& g) {
  const size_t n_values = g.values().size();
  UseLists u;
  u.offsets.assign(n_values + 1, 0);
  for (const Node& nd : g.nodes())
    for (ValueId v : nd.inputs)
      if (v >= 0 && size_t(v) < n_values) ++u.offsets[size_t(v) + 1];
  for (size_t i = 0; i < n_values; ++i) u.offsets[i + 1] += u.offsets[i];
  u.node_ids.resize(size_t(u.offsets[n_values]));
  std::vector<int64_t> fill(u.offsets.begin(), u.offsets.end() - 1);
  for (size_t n = 0; n < g.nodes().size(); ++n)
    for (ValueId v : g.nodes()[n].inputs)
      if (v >= 0 && size_t(v) < n_values) u.node_ids[size_t(fill[size_t(v)]++)] = NodeId(n);
  return u;
}

// Depth-first post-order from `roots` (in order), over node inputs; explicit stack of
// (node, next input slot). Colors: 0 unvisited, 1 on the stack, 2 done.
static Status dfs_post_order(const Graph& g, const std::vector<NodeId>& roots,
                             std::vector<NodeId>* order) {
  const size_t n_nodes = g.nodes().size(), n_values = g.values().size();
  std::vector<uint8_t> color(n_nodes, 0);
  struct Frame { NodeId node; uint32_t next; };
  std::vector<Frame> stack;
  for (NodeId root : roots) {
    if (color[size_t(root)] != 0) continue;
    stack.push_back({root, 0});
    color[size_t(root)] = 1;
    while (!stack.empty()) {
      Frame& f = stack.back();
      const Node& nd = g.node(f.node);
      if (f.next < nd.inputs.size()) {
        ValueId v = nd.inputs[f.next++];
        if (v < 0 || size_t(v) >= n_values)
          return internal_error(node_label(g, f.node) + " reads unknown value " +
                                std::to_string(v));
        NodeId p = g.value(v).producer;
        if (p < 0 || size_t(p) >= n_nodes)
          return internal_error(node_label(g, f.node) + " reads value " + std::to_string(v) +
                                " that has no producer");
        if (color[size_t(p)] == 1)
          return internal_error("cycle through " + node_label(g, p));
        if (color[size_t(p)] == 0) {
          color[size_t(p)] = 1;
          stack.push_back({p, 0});  // invalidates f; re-read next iteration
        }
        continue;
      }
      color[size_t(f.node)] = 2;
      order->push_back(f.node);
      stack.pop_back();
    }
  }
  return Status::ok();
}

Result<std::vector<NodeId>> topo_order(const Graph& g) {
  std::vector<NodeId> roots(g.nodes().size());
  for (size_t i = 0; i < roots.size(); ++i) roots[i] = NodeId(i);
  std::vector<NodeId> order;
  order.reserve(roots.size());
  VLAC_RETURN_IF_ERROR(dfs_post_order(g, roots, &order));
  return order;
}

Result<std::vector<NodeId>> schedule(const Graph& g) {
  std::vector<NodeId> roots;
  roots.reserve(g.outputs().size());
  for (ValueId v : g.outputs()) {
    if (v < 0 || size_t(v) >= g.values().size() || g.value(v).producer < 0)
      return internal_error("graph output " + std::to_string(v) + " is not a defined value");
    roots.push_back(g.value(v).producer);
  }
  std::vector<NodeId> order;
  VLAC_RETURN_IF_ERROR(dfs_post_order(g, roots, &order));
  return order;
}

std::vector<bool> reachable_from_outputs(const Graph& g) {
  const size_t n_nodes = g.nodes().size(), n_values = g.values().size();
  std::vector<bool> seen(n_nodes, false);
  std::vector<NodeId> stack;
  auto push_value = [&](ValueId v) {
    if (v < 0 || size_t(v) >= n_values) return;
    NodeId p = g.value(v).producer;
    if (p >= 0 && size_t(p) < n_nodes && !seen[size_t(p)]) {
      seen[size_t(p)] = true;
      stack.push_back(p);
    }
  };
  for (ValueId v : g.outputs()) push_value(v);
  while (!stack.empty()) {
    NodeId n = stack.back();
    stack.pop_back();
    for (ValueId v : g.node(n).inputs) push_value(v);
  }
  return seen;
}

std::vector<LiveRange> liveness(const Graph& g, const std::vector<NodeId>& order) {
  std::vector<LiveRange> live(g.values().size());
  std::vector<int64_t> step(g.nodes().size(), -1);
  for (size_t i = 0; i < order.size(); ++i) step[size_t(order[i])] = int64_t(i);
  for (size_t i = 0; i < order.size(); ++i) {
    const Node& nd = g.node(order[i]);
    for (ValueId v : nd.outputs) live[size_t(v)] = {int64_t(i), int64_t(i)};
  }
  for (size_t i = 0; i < order.size(); ++i)
    for (ValueId v : g.node(order[i]).inputs) {
      LiveRange& r = live[size_t(v)];
      if (r.def >= 0) r.last_use = std::max(r.last_use, int64_t(i));
    }
  for (ValueId v : g.outputs())
    if (live[size_t(v)].def >= 0) live[size_t(v)].last_use = int64_t(order.size());
  return live;
}

uint64_t peak_live_bytes(const Graph& g, const std::vector<NodeId>& order,
                         const std::vector<LiveRange>& live) {
  // Sweep: +bytes at def, -bytes after last_use (graph outputs stay until the end).
  std::vector<int64_t> delta(order.size() + 2, 0);
  for (size_t v = 0; v < live.size(); ++v) {
    if (live[v].def < 0) continue;
    const Value& val = g.values()[v];
    if (g.node(val.producer).op == OpKind::Weight) continue;  // weights are not activations
    int64_t b = int64_t(val.info.bytes());
    delta[size_t(live[v].def)] += b;
    delta[size_t(live[v].last_use) + 1] -= b;
  }
  int64_t cur = 0, peak = 0;
  for (int64_t d : delta) peak = std::max(peak, cur += d);
  return uint64_t(peak);
}

std::vector<bool> input_only_values(const Graph& g, const std::vector<NodeId>& order) {
  std::vector<bool> only(g.values().size(), false);
  for (NodeId n : order) {
    const Node& nd = g.node(n);
    bool ok;
    if (nd.op == OpKind::Input || nd.op == OpKind::Constant) ok = true;
    else if (nd.op == OpKind::Weight) ok = false;
    else {
      ok = true;
      for (ValueId v : nd.inputs) ok = ok && only[size_t(v)];
    }
    for (ValueId v : nd.outputs) only[size_t(v)] = ok;
  }
  return only;
}

}  // namespace vlac::ir
