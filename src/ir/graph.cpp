// Graph construction (append-only helpers with shape inference) and the verifier.
// Nothing here reads tensor data; weights stay references.
#include "ir/graph.h"

#include <cctype>
#include <cstdio>

#include "ir/walk.h"

namespace vlac::ir {

int64_t ValueInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string to_string(const ValueInfo& info) {
  std::string s = dtype_name(info.dtype);
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  s += "[";
  for (size_t i = 0; i < info.shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(info.shape[i]);
  return s + "]";
}

std::string to_string(const AttrValue& value) {
  struct Visitor {
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", v);
      return buf;
    }
    std::string operator()(const std::string& v) const { return "\"" + v + "\""; }
    std::string operator()(const std::vector<int64_t>& v) const {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    }
  };
  return std::visit(Visitor{}, value);
}

void Attrs::set(std::string key, AttrValue value) {
  for (auto& kv : items_)
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  items_.emplace_back(std::move(key), std::move(value));
}

const AttrValue* Attrs::find(std::string_view key) const {
  for (const auto& kv : items_)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

int64_t Attrs::get_int(std::string_view key, int64_t def) const {
  const AttrValue* v = find(key);
  return v && std::holds_alternative<int64_t>(*v) ? std::get<int64_t>(*v) : def;
}

double Attrs::get_float(std::string_view key, double def) const {
  const AttrValue* v = find(key);
  if (!v) return def;
  if (std::holds_alternative<double>(*v)) return std::get<double>(*v);
  if (std::holds_alternative<int64_t>(*v)) return double(std::get<int64_t>(*v));
  return def;
}

std::string Attrs::get_string(std::string_view key, std::string def) const {
  const AttrValue* v = find(key);
  return v && std::holds_alternative<std::string>(*v) ? std::get<std::string>(*v) : def;
}

std::vector<int64_t> Attrs::get_ints(std::string_view key) const {
  const AttrValue* v = find(key);
  return v && std::holds_alternative<std::vector<int64_t>>(*v) ? std::get<std::vector<int64_t>>(*v)
                                                               : std::vector<int64_t>{};
}

void Graph::reserve(size_t n_nodes, size_t n_values) {
  nodes_.reserve(n_nodes);
  values_.reserve(n_values);
}

NodeId Graph::append(Node node, std::vector<ValueInfo> outs) {
  NodeId id = NodeId(nodes_.size());
  node.outputs.clear();
  node.outputs.reserve(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    node.outputs.push_back(ValueId(values_.size()));
    values_.push_back(Value{std::move(outs[i]), id, int32_t(i)});
  }
  nodes_.push_back(std::move(node));
  return id;
}

ValueId Graph::add_input(std::string name, ValueInfo info) {
  Node n;
  n.op = OpKind::Input;
  n.name = std::move(name);
  NodeId id = append(std::move(n), {std::move(info)});
  ValueId v = nodes_[size_t(id)].outputs[0];
  inputs_.push_back(v);
  return v;
}

WeightId Graph::add_weight(WeightRef ref) {
  weights_.push_back(std::move(ref));
  return WeightId(weights_.size() - 1);
}

ValueId Graph::add_weight_node(WeightId w) {
  VLAC_CHECK(w >= 0 && size_t(w) < weights_.size());
  const WeightRef& ref = weights_[size_t(w)];
  Node n;
  n.op = OpKind::Weight;
  n.weight = w;
  n.name = ref.name;
  NodeId id = append(std::move(n), {ValueInfo{ref.dtype, ref.shape}});
  return nodes_[size_t(id)].outputs[0];
}

ValueId Graph::add_constant(ValueInfo info, double value, std::string name) {
  Node n;
  n.op = OpKind::Constant;
  n.attrs.set("value", value);
  n.name = std::move(name);
  NodeId id = append(std::move(n), {std::move(info)});
  return nodes_[size_t(id)].outputs[0];
}

Result<NodeId> Graph::add_node(OpKind op, std::vector<ValueId> inputs, Attrs attrs,
                               std::string name) {
  std::vector<const ValueInfo*> infos;
  infos.reserve(inputs.size());
  for (ValueId v : inputs) {
    if (v < 0 || size_t(v) >= values_.size())
      return internal_error(std::string(op_name(op)) + " '" + name + "': unknown input value " +
                            std::to_string(v));
    infos.push_back(&values_[size_t(v)].info);
  }
  auto outs = infer_outputs(op, infos, attrs);
  if (!outs.is_ok()) return outs.status().with_context("node '" + name + "'");
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.name = std::move(name);
  return append(std::move(n), std::move(outs).value());
}

Result<ValueId> Graph::add(OpKind op, std::vector<ValueId> inputs, Attrs attrs, std::string name) {
  VLAC_ASSIGN_OR_RETURN(NodeId id, add_node(op, std::move(inputs), std::move(attrs), std::move(name)));
  return nodes_[size_t(id)].outputs[0];
}

NodeId Graph::add_node_unchecked(OpKind op, std::vector<ValueId> inputs,
                                 std::vector<ValueInfo> outs, Attrs attrs, std::string name) {
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.name = std::move(name);
  return append(std::move(n), std::move(outs));
}

Status verify(const Graph& g) {
  const size_t n_nodes = g.nodes().size(), n_values = g.values().size();
  auto label = [&](size_t n) {
    const Node& nd = g.nodes()[n];
    return "verify: node " + std::to_string(n) + (nd.name.empty() ? "" : " '" + nd.name + "'") +
           " (" + op_name(nd.op) + ")";
  };
  for (size_t v = 0; v < n_values; ++v) {
    const Value& val = g.values()[v];
    if (val.producer < 0 || size_t(val.producer) >= n_nodes)
      return internal_error("verify: value " + std::to_string(v) + " has no producer");
    const Node& p = g.node(val.producer);
    if (val.output_index < 0 || size_t(val.output_index) >= p.outputs.size() ||
        p.outputs[size_t(val.output_index)] != ValueId(v))
      return internal_error("verify: value " + std::to_string(v) + " and " +
                            label(size_t(val.producer)) + " disagree on its output slot");
    for (int64_t d : val.info.shape)
      if (d < 0) return internal_error("verify: value " + std::to_string(v) + " has a negative dim");
  }
  // Every input defined before use: a topological order exists (no cycles, no dangling ids).
  auto order = topo_order(g);
  if (!order.is_ok()) return order.status().with_context("verify");
  std::vector<const ValueInfo*> infos;
  for (size_t n = 0; n < n_nodes; ++n) {
    const Node& nd = g.nodes()[n];
    const OpInfo& oi = op_info(nd.op);
    int n_in = int(nd.inputs.size());
    if (n_in < oi.n_in_min || (oi.n_in_max >= 0 && n_in > oi.n_in_max))
      return internal_error(label(n) + ": has " + std::to_string(n_in) + " inputs");
    if (int(nd.outputs.size()) != oi.n_out)
      return internal_error(label(n) + ": has " + std::to_string(nd.outputs.size()) + " outputs, op needs " +
                            std::to_string(oi.n_out));
    infos.clear();
    for (ValueId v : nd.inputs) {
      if (v < 0 || size_t(v) >= n_values)
        return internal_error(label(n) + ": reads unknown value " + std::to_string(v));
      infos.push_back(&g.info(v));
    }
    if (nd.op == OpKind::Weight) {
      if (nd.weight < 0 || size_t(nd.weight) >= g.weights().size())
        return internal_error(label(n) + ": weight id " + std::to_string(nd.weight) + " out of range");
      const WeightRef& w = g.weights()[size_t(nd.weight)];
      ValueInfo expect{w.dtype, w.shape};
      if (g.info(nd.outputs[0]) != expect)
        return internal_error(label(n) + ": output " + to_string(g.info(nd.outputs[0])) +
                              " differs from weight '" + w.name + "' " + to_string(expect));
      if (w.bytes != expect.bytes())
        return internal_error(label(n) + ": weight '" + w.name + "' has " + std::to_string(w.bytes) +
                              " bytes, its shape needs " + std::to_string(expect.bytes()));
      continue;
    }
    if (nd.op == OpKind::Input || nd.op == OpKind::Constant) continue;
    auto outs = infer_outputs(nd.op, infos, nd.attrs);
    if (!outs.is_ok()) return internal_error(label(n) + ": " + outs.status().message());
    for (size_t i = 0; i < outs->size(); ++i)
      if ((*outs)[i] != g.info(nd.outputs[i]))
        return internal_error(label(n) + ": output " + std::to_string(i) + " is " +
                              to_string(g.info(nd.outputs[i])) + ", inference says " +
                              to_string((*outs)[i]));
  }
  for (ValueId v : g.outputs())
    if (v < 0 || size_t(v) >= n_values)
      return internal_error("verify: graph output " + std::to_string(v) + " is not a value");
  for (ValueId v : g.inputs())
    if (v < 0 || size_t(v) >= n_values || g.node(g.value(v).producer).op != OpKind::Input)
      return internal_error("verify: graph input " + std::to_string(v) + " is not an Input value");
  return Status::ok();
}

}  // namespace vlac::ir
