// Fused projections (see fuse.h): find the groups, then copy the graph once, writing each group's
// fused Linear and its Slices where the group's first Linear stood.
#include "ir/fuse.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "ir/walk.h"

namespace vlac::ir {

const std::vector<FuseRule>& default_fuse_rules() {
  static const std::vector<FuseRule> rules = {
      {"qkv_proj", {"q_proj", "k_proj", "v_proj"}},
      {"kv_proj", {"k_proj", "v_proj"}},
      {"gate_up_proj", {"gate_proj", "up_proj"}},
  };
  return rules;
}

namespace {

// "<module>.<role>.<leaf>" -> (module, role); false when the name has fewer parts.
bool split_name(const std::string& name, const std::string& leaf, std::string* module, std::string* role) {
  const std::string tail = "." + leaf;
  if (name.size() <= tail.size() || name.compare(name.size() - tail.size(), tail.size(), tail) != 0) return false;
  const std::string head = name.substr(0, name.size() - tail.size());
  const size_t dot = head.rfind('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == head.size()) return false;
  *module = head.substr(0, dot);
  *role = head.substr(dot + 1);
  return true;
}

// A Linear that may join a group: its weight/bias nodes and what identifies its group.
struct Member {
  NodeId linear = kNone;
  NodeId weight_node = kNone, bias_node = kNone;
  std::string role;
};

struct Group {
  const FuseRule* rule = nullptr;
  std::string module;
  std::vector<Member> members;  // in rule order
  NodeId first = kNone;         // lowest Linear node id: where the fused nodes go
};

// The Weight node producing `v` when it is read by exactly one input slot (and is no graph output).
NodeId sole_weight_node(const Graph& g, const UseLists& uses, const std::vector<bool>& is_output, ValueId v) {
  const NodeId p = g.value(v).producer;
  if (g.node(p).op != OpKind::Weight || uses.count(v) != 1 || is_output[size_t(v)]) return kNone;
  return p;
}

WeightRef concat_refs(const std::string& name, const std::vector<const WeightRef*>& parts) {
  WeightRef r;
  r.name = name;
  r.dtype = parts[0]->dtype;
  r.shape = parts[0]->shape;
  r.shape[0] = 0;
  r.file_id = parts[0]->file_id;
  r.offset = parts[0]->offset;
  for (const WeightRef* p : parts) {
    r.shape[0] += p->shape[0];
    r.bytes += p->bytes;
    if (p->parts.empty()) r.parts.push_back(*p);
    else r.parts.insert(r.parts.end(), p->parts.begin(), p->parts.end());  // already fused: flatten
  }
  return r;
}

// A fused node's name: the first member's with its role replaced ("lm.0.q_proj" -> "lm.0.qkv_proj").
std::string fused_node_name(const std::string& member_name, const std::string& role, const std::string& fused) {
  if (member_name.size() > role.size() &&
      member_name.compare(member_name.size() - role.size(), role.size(), role) == 0)
    return member_name.substr(0, member_name.size() - role.size()) + fused;
  return member_name + "." + fused;
}

}  // namespace

Result<LoweredGraph> fuse_linears(const Graph& g, const std::vector<FuseRule>& rules, FuseStats* stats) {
  const UseLists uses = build_use_lists(g);
  std::vector<bool> is_output(g.values().size(), false);
  for (ValueId v : g.outputs()) is_output[size_t(v)] = true;
  std::set<std::string> names;
  for (const WeightRef& w : g.weights()) names.insert(w.name);

  // Candidates by (input value, module): role -> member.
  std::map<std::pair<ValueId, std::string>, std::map<std::string, Member>> cands;
  for (NodeId n = 0; n < NodeId(g.nodes().size()); ++n) {
    const Node& nd = g.node(n);
    if (nd.op != OpKind::Linear) continue;
    Member m;
    m.linear = n;
    m.weight_node = sole_weight_node(g, uses, is_output, nd.inputs[1]);
    if (m.weight_node == kNone) continue;
    const WeightRef& w = g.weights()[size_t(g.node(m.weight_node).weight)];
    std::string module;
    if (w.shape.size() != 2 || !split_name(w.name, "weight", &module, &m.role)) continue;
    if (nd.inputs.size() == 3) {
      m.bias_node = sole_weight_node(g, uses, is_output, nd.inputs[2]);
      if (m.bias_node == kNone) continue;
      std::string bmodule, brole;
      const WeightRef& b = g.weights()[size_t(g.node(m.bias_node).weight)];
      if (!split_name(b.name, "bias", &bmodule, &brole) || bmodule != module || brole != m.role) continue;
    }
    auto [it, inserted] = cands[{nd.inputs[0], module}].emplace(m.role, m);
    if (!inserted) it->second.linear = kNone;  // two Linears in one role of one module: never fused
  }

  // Groups: the first rule whose roles are all present and compatible; each member fuses once.
  std::vector<Group> groups;
  for (auto& [key, by_role] : cands) {
    std::set<std::string> taken;
    for (const FuseRule& rule : rules) {
      Group gr;
      gr.rule = &rule;
      gr.module = key.second;
      bool ok = rule.roles.size() >= 2;
      for (const std::string& role : rule.roles) {
        auto it = by_role.find(role);
        if (it == by_role.end() || it->second.linear == kNone || taken.count(role)) {
          ok = false;
          break;
        }
        gr.members.push_back(it->second);
      }
      if (!ok) continue;
      const WeightRef& w0 = g.weights()[size_t(g.node(gr.members[0].weight_node).weight)];
      const bool bias0 = gr.members[0].bias_node != kNone;
      for (const Member& m : gr.members) {
        const WeightRef& w = g.weights()[size_t(g.node(m.weight_node).weight)];
        ok = ok && w.dtype == w0.dtype && w.shape[1] == w0.shape[1] && (m.bias_node != kNone) == bias0;
        if (ok && bias0) {
          const WeightRef& b = g.weights()[size_t(g.node(m.bias_node).weight)];
          const WeightRef& b0 = g.weights()[size_t(g.node(gr.members[0].bias_node).weight)];
          ok = b.dtype == b0.dtype && b.shape.size() == 1;
        }
      }
      const std::string fused_name = gr.module + "." + rule.fused;
      if (!ok || names.count(fused_name + ".weight") || names.count(fused_name + ".bias")) continue;
      gr.first = gr.members[0].linear;
      for (const Member& m : gr.members) {
        gr.first = std::min(gr.first, m.linear);
        taken.insert(m.role);
      }
      groups.push_back(std::move(gr));
    }
  }
  std::sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) { return a.first < b.first; });

  // What the copy skips (member Linears and their weights) and where each group is written.
  std::vector<int> group_at(g.nodes().size(), -1);
  std::vector<bool> skip(g.nodes().size(), false);
  for (size_t i = 0; i < groups.size(); ++i) {
    group_at[size_t(groups[i].first)] = int(i);
    for (const Member& m : groups[i].members) {
      skip[size_t(m.linear)] = skip[size_t(m.weight_node)] = true;
      if (m.bias_node != kNone) skip[size_t(m.bias_node)] = true;
    }
  }

  LoweredGraph out;
  Graph& ng = out.graph;
  ng.reserve(g.nodes().size(), g.values().size());
  std::vector<ValueId>& vmap = out.value_map;
  vmap.assign(g.values().size(), kNone);
  auto mapped = [&](ValueId v) -> Result<ValueId> {
    if (vmap[size_t(v)] == kNone) return internal_error("fuse: value " + std::to_string(v) + " read before it is written");
    return vmap[size_t(v)];
  };
  for (NodeId n = 0; n < NodeId(g.nodes().size()); ++n) {
    const Node& nd = g.node(n);
    if (group_at[size_t(n)] >= 0) {
      const Group& gr = groups[size_t(group_at[size_t(n)])];
      std::vector<const WeightRef*> wparts, bparts;
      for (const Member& m : gr.members) {
        wparts.push_back(&g.weights()[size_t(g.node(m.weight_node).weight)]);
        if (m.bias_node != kNone) bparts.push_back(&g.weights()[size_t(g.node(m.bias_node).weight)]);
      }
      const std::string base = gr.module + "." + gr.rule->fused;
      const Node& first = g.node(gr.members[0].linear);
      VLAC_ASSIGN_OR_RETURN(ValueId x, mapped(first.inputs[0]));
      std::vector<ValueId> ins = {x, ng.weight(concat_refs(base + ".weight", wparts))};
      if (!bparts.empty()) ins.push_back(ng.weight(concat_refs(base + ".bias", bparts)));
      VLAC_ASSIGN_OR_RETURN(ValueId y, ng.add(OpKind::Linear, std::move(ins), {},
                                              fused_node_name(first.name, gr.members[0].role, gr.rule->fused)));
      int64_t start = 0;
      for (size_t i = 0; i < gr.members.size(); ++i) {
        const int64_t rows = wparts[i]->shape[0];
        const Node& mn = g.node(gr.members[i].linear);
        VLAC_ASSIGN_OR_RETURN(ValueId s, ng.add(OpKind::Slice, {y},
                                                Attrs{{"axis", int64_t{-1}}, {"start", start}, {"end", start + rows}},
                                                mn.name));
        if (ng.info(s) != g.info(mn.outputs[0]))
          return internal_error("fuse: slice of '" + mn.name + "' is " + to_string(ng.info(s)) + ", the Linear gave " +
                                to_string(g.info(mn.outputs[0])));
        vmap[size_t(mn.outputs[0])] = s;
        start += rows;
      }
      if (stats) {
        stats->groups += 1;
        stats->linears_fused += int(gr.members.size());
      }
    }
    if (skip[size_t(n)]) continue;
    switch (nd.op) {
      case OpKind::Input:
        vmap[size_t(nd.outputs[0])] = ng.add_input(nd.name, g.info(nd.outputs[0]));
        break;
      case OpKind::Weight:
        vmap[size_t(nd.outputs[0])] = ng.weight(g.weights()[size_t(nd.weight)]);
        ng.mutable_nodes().back().name = nd.name;
        break;
      default: {
        std::vector<ValueId> ins;
        for (ValueId v : nd.inputs) {
          VLAC_ASSIGN_OR_RETURN(ValueId nv, mapped(v));
          ins.push_back(nv);
        }
        std::vector<ValueInfo> infos;
        for (ValueId v : nd.outputs) infos.push_back(g.info(v));
        const NodeId id = ng.add_node_unchecked(nd.op, std::move(ins), std::move(infos), nd.attrs, nd.name);
        for (size_t i = 0; i < nd.outputs.size(); ++i) vmap[size_t(nd.outputs[i])] = ng.node(id).outputs[i];
      }
    }
  }
  for (ValueId v : g.outputs()) {
    VLAC_ASSIGN_OR_RETURN(ValueId nv, mapped(v));
    ng.mark_output(nv);
  }
  Status st = verify(ng);
  if (!st.is_ok()) return st.with_context("fuse");
  return out;
}

}  // namespace vlac::ir
