// Resource partitioner (see partition.h). Cut placement by dynamic programming over the schedule;
// every decision depends on the graph and the options only, so the same graph gives the same plan
// on every run.
#include "partition/partition.h"

#include <algorithm>
#include <set>

#include "core/bytes.h"
#include "ir/walk.h"

namespace vlac::partition {

using ir::kNone;
using ir::NodeId;
using ir::OpKind;
using ir::ValueId;
using ir::WeightId;

namespace {

bool placeable(OpKind op) { return op != OpKind::Input && op != OpKind::Weight && op != OpKind::Constant; }

WeightId weight_of_value(const ir::Graph& g, ValueId v) {
  const ir::Node& p = g.node(g.value(v).producer);
  return p.op == OpKind::Weight ? p.weight : kNone;
}

}  // namespace

Result<Plan> partition_graph(const ir::Graph& g, const std::string& stage, const WeightBytes& weight_bytes,
                             const Options& options) {
  if (options.engine_cap == 0) return invalid_argument("partition: the engine cap must be positive");
  VLAC_ASSIGN_OR_RETURN(std::vector<NodeId> order, ir::schedule(g));
  const ir::UseLists uses = ir::build_use_lists(g);
  const std::vector<bool> input_only = ir::input_only_values(g, order);
  std::vector<int64_t> pos(g.nodes().size(), -1);
  for (size_t i = 0; i < order.size(); ++i) pos[size_t(order[i])] = int64_t(i);

  Plan plan;
  std::vector<int> engine_of(g.nodes().size(), -1);     // owning engine of placeable nodes
  std::vector<int> weight_home(g.weights().size(), -1);  // engine storing each weight
  std::vector<EnginePlan>& engines = plan.engines;
  auto new_engine = [&] {
    EnginePlan e;
    e.name = stage + "." + std::to_string(engines.size());
    engines.push_back(std::move(e));
  };

  // Weights read by a node that no engine stores yet.
  auto new_weights = [&](NodeId n, std::vector<WeightId>* out) {
    for (ValueId v : g.node(n).inputs) {
      const WeightId w = weight_of_value(g, v);
      if (w != kNone && weight_home[size_t(w)] < 0 && std::find(out->begin(), out->end(), w) == out->end())
        out->push_back(w);
    }
  };

  // 1. Groups in schedule order: each node with the multi-output nodes that feed it (placed with
  // their first consumer), the weights each group reads first and their bytes.
  std::vector<std::vector<NodeId>> groups;
  std::vector<NodeId> pending;  // multi-output nodes waiting for their first consumer
  for (NodeId n : order) {
    const ir::Node& node = g.node(n);
    if (!placeable(node.op)) continue;
    if (node.outputs.size() > 1) {
      pending.push_back(n);
      continue;
    }
    // The pending nodes feeding n, and (transitively) the pending nodes feeding those: a
    // multi-output node read only by another one must not land in a later engine.
    std::vector<NodeId> group{n};
    for (size_t gi = 0; gi < group.size(); ++gi) {
      const ir::Node& reader = g.node(group[gi]);
      for (size_t i = 0; i < pending.size();) {
        bool feeds = false;
        for (ValueId v : reader.inputs)
          if (g.value(v).producer == pending[i]) feeds = true;
        if (feeds) {
          group.push_back(pending[i]);
          pending.erase(pending.begin() + std::ptrdiff_t(i));
        } else {
          ++i;
        }
      }
    }
    std::rotate(group.begin(), group.begin() + 1, group.end());  // n last (names an over-cap group)
    groups.push_back(std::move(group));
  }
  for (NodeId n : pending) groups.push_back({n});  // read only as graph outputs
  const size_t ng = groups.size();
  std::vector<std::vector<WeightId>> fresh(ng);
  std::vector<uint64_t> nb(ng, 0);
  std::vector<int64_t> group_of(g.nodes().size(), -1);
  for (size_t gi = 0; gi < ng; ++gi) {
    for (NodeId n : groups[gi]) {
      group_of[size_t(n)] = int64_t(gi);
      new_weights(n, &fresh[gi]);
    }
    for (WeightId w : fresh[gi]) {
      weight_home[size_t(w)] = 0;  // (seen; the real homes are set when placing)
      nb[gi] += weight_bytes(g.weights()[size_t(w)]);
    }
  }
  std::fill(weight_home.begin(), weight_home.end(), -1);

  // 2. The values that could cross a cut: made in group d, last read in group l > d (large
  // input-only values are recomputed instead: free), by the group that makes them.
  struct Span {
    int64_t last;
    int64_t bytes;
  };
  std::vector<std::vector<Span>> made(ng);
  for (size_t gi = 0; gi < ng; ++gi)
    for (NodeId n : groups[gi])
      for (ValueId v : g.node(n).outputs) {
        if (input_only[size_t(v)] && g.info(v).bytes() > options.crossing_limit) continue;
        int64_t last = int64_t(gi);
        for (int64_t u = uses.offsets[size_t(v)]; u < uses.offsets[size_t(v) + 1]; ++u)
          last = std::max(last, group_of[size_t(uses.node_ids[size_t(u)])]);
        if (last > int64_t(gi)) made[gi].push_back({last, int64_t(g.info(v).bytes())});
      }

  // 3. Engines are runs of groups whose weights fit the cap (a group over the cap alone, with
  // weightless groups around it). Among those partitions, the one passing the fewest bytes between
  // engines, each engine past the first weighed as kEnginePenalty more (a cut is added only to
  // save more than that). A value crosses a cut at c when it is made before c and read at or
  // after c; crossing is an interval, so a cut at c whose engine starts at k adds exactly the
  // values made in [k, c) and read at or after c (those made earlier were counted at k). Hence
  // best[c] = min over valid k of best[k] + added(k, c). A greedy fill cuts wherever the cap
  // falls, e.g. inside an MLP with [tokens, 16384] fp32 in flight (45 MB at 712 tokens).
  constexpr int64_t kEnginePenalty = 1 << 20;
  constexpr size_t kMaxWindow = 8192;  // engines of at most this many groups (weightless giants)
  const int64_t kInf = INT64_MAX / 4;
  std::vector<int64_t> best(ng + 1, kInf);
  std::vector<size_t> from(ng + 1, 0);
  best[0] = 0;
  size_t lo = 0;
  uint64_t load = 0;  // clamped weight bytes of groups [lo, c)
  for (size_t c = 1; c <= ng; ++c) {
    load += std::min(nb[c - 1], options.engine_cap);
    while ((load > options.engine_cap || c - lo > kMaxWindow) && lo < c - 1) load -= std::min(nb[lo++], options.engine_cap);
    int64_t added = 0;
    for (size_t k = c; k-- > lo;) {  // the engine [k, c)
      if (c < ng)
        for (const Span& sp : made[k])
          if (sp.last >= int64_t(c)) added += sp.bytes;
      const int64_t cost = best[k] + (c < ng ? added + kEnginePenalty : 0);
      if (cost < best[c]) best[c] = cost, from[c] = k;
    }
  }
  std::vector<bool> starts(ng, false);
  for (size_t c = ng; c > 0; c = from[c]) starts[from[c]] = true;

  // 4. Placement.
  for (size_t gi = 0; gi < ng; ++gi) {
    if (engines.empty() || starts[gi]) new_engine();
    EnginePlan& e = engines.back();
    const int ei = int(engines.size() - 1);
    for (WeightId w : fresh[gi]) {
      weight_home[size_t(w)] = ei;
      e.owned.push_back(w);
    }
    e.weight_bytes += nb[gi];
    if (nb[gi] > options.engine_cap) {
      e.over_cap = true;
      e.over_cap_node = g.node(groups[gi].back()).name;
    }
    for (NodeId n : groups[gi]) {
      engine_of[size_t(n)] = ei;
      e.nodes.push_back(n);
    }
  }
  if (engines.empty()) new_engine();

  // Input-only values read in another engine: recompute when large, else they cross.
  std::vector<std::set<NodeId>> recompute(engines.size());
  for (NodeId n : order) {
    if (!placeable(g.node(n).op)) continue;
    const int ep = engine_of[size_t(n)];
    for (ValueId v : g.node(n).outputs) {
      if (!input_only[size_t(v)] || g.info(v).bytes() <= options.crossing_limit) continue;
      for (int64_t u = uses.offsets[size_t(v)]; u < uses.offsets[size_t(v) + 1]; ++u) {
        const int ec = engine_of[size_t(uses.node_ids[size_t(u)])];
        if (ec < 0 || ec == ep) continue;
        // n and every computed ancestor (all input-only) join engine ec.
        std::vector<NodeId> stack{n};
        while (!stack.empty()) {
          NodeId a = stack.back();
          stack.pop_back();
          if (!placeable(g.node(a).op) || engine_of[size_t(a)] == ec || !recompute[size_t(ec)].insert(a).second) continue;
          for (ValueId in : g.node(a).inputs) stack.push_back(g.value(in).producer);
        }
      }
    }
  }

  // Per engine: the node set, boundary values, weights.
  std::vector<bool> is_output(g.values().size(), false);
  for (ValueId v : g.outputs()) is_output[size_t(v)] = true;
  auto computed_in = [&](NodeId n, int e) {
    return engine_of[size_t(n)] == e || recompute[size_t(e)].count(n) > 0;
  };
  plan.weight_last_use.assign(g.weights().size(), -1);
  std::map<ValueId, Crossing> crossing;
  for (size_t ei = 0; ei < engines.size(); ++ei) {
    EnginePlan& e = engines[ei];
    const int eid = int(ei);
    std::vector<NodeId> all = e.nodes;
    for (NodeId n : recompute[ei]) {
      all.push_back(n);
      e.recomputed.push_back(n);
    }
    std::set<ValueId> inputs;
    std::set<NodeId> leaves;  // weight and constant nodes read here
    for (NodeId n : all)
      for (ValueId v : g.node(n).inputs) {
        const NodeId p = g.value(v).producer;
        const OpKind op = g.node(p).op;
        if (op == OpKind::Weight || op == OpKind::Constant) {
          leaves.insert(p);
          if (op == OpKind::Weight) {
            const WeightId w = g.node(p).weight;
            if (std::find(e.weights.begin(), e.weights.end(), w) == e.weights.end()) e.weights.push_back(w);
            plan.weight_last_use[size_t(w)] = std::max(plan.weight_last_use[size_t(w)], eid);
          }
        } else if (op == OpKind::Input || !computed_in(p, eid)) {
          inputs.insert(v);
          if (op != OpKind::Input) {
            Crossing& c = crossing[v];
            c.value = v;
            c.producer = engine_of[size_t(p)];
            c.bytes = g.info(v).bytes();
            if (std::find(c.consumers.begin(), c.consumers.end(), eid) == c.consumers.end()) c.consumers.push_back(eid);
          }
        }
      }
    all.insert(all.end(), leaves.begin(), leaves.end());
    std::sort(all.begin(), all.end(), [&](NodeId a, NodeId b) { return pos[size_t(a)] < pos[size_t(b)]; });
    e.nodes = std::move(all);
    std::sort(e.recomputed.begin(), e.recomputed.end(), [&](NodeId a, NodeId b) { return pos[size_t(a)] < pos[size_t(b)]; });
    e.inputs.assign(inputs.begin(), inputs.end());
  }
  for (auto& [v, c] : crossing) {
    std::sort(c.consumers.begin(), c.consumers.end());
    engines[size_t(c.producer)].outputs.push_back(v);
    plan.crossings.push_back(c);
  }
  for (ValueId v : g.outputs()) {
    const NodeId p = g.value(v).producer;
    if (!placeable(g.node(p).op)) continue;
    auto& outs = engines[size_t(engine_of[size_t(p)])].outputs;
    if (std::find(outs.begin(), outs.end(), v) == outs.end()) outs.push_back(v);
  }
  for (EnginePlan& e : engines) std::sort(e.outputs.begin(), e.outputs.end());
  for (ValueId v = 0; size_t(v) < g.values().size(); ++v) {
    const NodeId p = g.value(v).producer;
    if (!placeable(g.node(p).op) || !input_only[size_t(v)] || g.info(v).bytes() <= options.crossing_limit) continue;
    for (size_t ei = 0; ei < engines.size(); ++ei)
      if (recompute[ei].count(p)) plan.recomputed_bytes += g.info(v).bytes();
  }
  (void)is_output;
  return plan;
}

std::string boundary_name(const ir::Graph& g, ValueId v, const std::map<ValueId, std::string>& named) {
  if (auto it = named.find(v); it != named.end()) return it->second;
  const ir::Node& p = g.node(g.value(v).producer);
  if (p.op == OpKind::Input) return p.name;
  // Appended piece by piece: GCC 12's -Wrestrict misfires on `"literal" + std::string&&`
  // (GCC PR 105651), and the release build prints no warnings.
  std::string name = "%";
  name += std::to_string(v);
  name += ":";
  name += p.name;
  if (p.outputs.size() > 1) {
    name += "#";
    name += std::to_string(g.value(v).output_index);
  }
  return name;
}

Result<ir::Graph> extract_engine(const ir::Graph& g, const Plan& plan, size_t engine,
                                 const std::map<ValueId, std::string>& named) {
  if (engine >= plan.engines.size()) return internal_error("extract_engine: no engine " + std::to_string(engine));
  const EnginePlan& e = plan.engines[engine];
  ir::Graph out;
  std::map<ValueId, ValueId> map;
  for (ValueId v : e.inputs) map[v] = out.add_input(boundary_name(g, v, named), g.info(v));
  for (NodeId n : e.nodes) {
    const ir::Node& node = g.node(n);
    if (node.op == OpKind::Weight) {
      map[node.outputs[0]] = out.weight(g.weights()[size_t(node.weight)]);
      continue;
    }
    std::vector<ValueId> ins;
    for (ValueId v : node.inputs) {
      auto it = map.find(v);
      if (it == map.end()) return internal_error("extract_engine: " + e.name + ": value " + std::to_string(v) + " undefined");
      ins.push_back(it->second);
    }
    std::vector<ir::ValueInfo> infos;
    for (ValueId v : node.outputs) infos.push_back(g.info(v));
    const NodeId nn = out.add_node_unchecked(node.op, std::move(ins), std::move(infos), node.attrs, node.name);
    for (size_t i = 0; i < node.outputs.size(); ++i) map[node.outputs[i]] = out.node(nn).outputs[i];
  }
  for (ValueId v : e.outputs) out.mark_output(map.at(v));
  VLAC_RETURN_IF_ERROR(ir::verify(out));
  return out;
}

std::string plan_summary(const ir::Graph& g, const Plan& plan, const std::map<ValueId, std::string>& named) {
  std::string s;
  for (size_t i = 0; i < plan.engines.size(); ++i) {
    const EnginePlan& e = plan.engines[i];
    size_t compute = 0;
    for (NodeId n : e.nodes)
      if (placeable(g.node(n).op)) ++compute;
    s += e.name + ": " + std::to_string(compute) + " nodes (" + std::to_string(e.recomputed.size()) +
         " recomputed), " + std::to_string(e.owned.size()) + " weights stored, " + format_bytes(e.weight_bytes) +
         (e.over_cap ? " (over the cap: '" + e.over_cap_node + "' alone)" : "") + "\n";
    auto add = [&](ValueId v) {  // appended, not `" " + ...`: see boundary_name
      s += " ";
      s += boundary_name(g, v, named);
      s += " ";
      s += ir::to_string(g.info(v));
    };
    s += "  in:";
    for (ValueId v : e.inputs) add(v);
    s += "\n  out:";
    for (ValueId v : e.outputs) add(v);
    s += "\n";
  }
  uint64_t cross = 0;
  for (const Crossing& c : plan.crossings) cross += c.bytes;
  s += "crossing: " + std::to_string(plan.crossings.size()) + " values, " + format_bytes(cross) + "; recomputed " +
       format_bytes(plan.recomputed_bytes) + "\n";
  return s;
}

}  // namespace vlac::partition
