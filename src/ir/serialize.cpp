// Graph <-> JSON and shape re-specialization (see serialize.h). The reader treats the JSON as
// hostile: unknown ops, out-of-range ids, bad shapes give InvalidFormat naming `where`.
#include "ir/serialize.h"

#include <optional>

namespace vlac::ir {

using nlohmann::json;

namespace {

json info_json(const ValueInfo& v) { return json::array({dtype_name(v.dtype), v.shape}); }

json attr_json(const AttrValue& a) {
  if (const auto* i = std::get_if<int64_t>(&a)) return json::object({{"i", *i}});
  if (const auto* d = std::get_if<double>(&a)) return json::object({{"f", *d}});
  if (const auto* s = std::get_if<std::string>(&a)) return json::object({{"s", *s}});
  return json::object({{"ints", std::get<std::vector<int64_t>>(a)}});
}

std::optional<OpKind> op_from_name(const std::string& name) {
  for (int k = 0; k < op_count(); ++k)
    if (name == op_name(OpKind(k))) return OpKind(k);
  return std::nullopt;
}

struct Reader {
  const std::string& where;
  Status bad(const std::string& what) const { return invalid_format(where + ": program: " + what); }

  Result<std::vector<int64_t>> shape(const json& j, const std::string& ctx) const {
    if (!j.is_array() || j.size() > 8) return bad(ctx + ": shape must be a list of at most 8 dims");
    std::vector<int64_t> s;
    for (const auto& d : j) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t(1) << 40))
        return bad(ctx + ": bad dimension");
      s.push_back(d.get<int64_t>());
    }
    int64_t n = 1;
    for (int64_t d : s)
      if (__builtin_mul_overflow(n, d, &n) || n > (int64_t(1) << 40)) return bad(ctx + ": shape too large");
    return s;
  }
  Result<ValueInfo> info(const json& j, const std::string& ctx) const {
    if (!j.is_array() || j.size() != 2 || !j[0].is_string()) return bad(ctx + ": value info must be [dtype, shape]");
    auto dt = dtype_from_name(j[0].get<std::string>());
    if (!dt) return bad(ctx + ": unknown dtype '" + j[0].get<std::string>() + "'");
    VLAC_ASSIGN_OR_RETURN(auto s, shape(j[1], ctx));
    return ValueInfo{*dt, std::move(s)};
  }
  Result<AttrValue> attr(const json& j, const std::string& ctx) const {
    if (!j.is_object() || j.size() != 1) return bad(ctx + ": attribute must be an object with one key");
    const auto it = j.begin();  // (items() would be a temporary: keep the iterator instead)
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    if (k == "i" && v.is_number_integer()) return AttrValue(v.get<int64_t>());
    if (k == "f" && v.is_number()) return AttrValue(v.get<double>());
    if (k == "s" && v.is_string()) return AttrValue(v.get<std::string>());
    if (k == "ints" && v.is_array()) {
      std::vector<int64_t> out;
      for (const auto& e : v) {
        if (!e.is_number_integer()) return bad(ctx + ": ints attribute holds a non-integer");
        out.push_back(e.get<int64_t>());
      }
      return AttrValue(std::move(out));
    }
    return bad(ctx + ": unknown attribute form '" + k + "'");
  }
};

const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

}  // namespace

std::string input_name(const Graph& g, ValueId v) {
  if (v < 0 || size_t(v) >= g.values().size()) return {};
  const Node& n = g.node(g.value(v).producer);
  return n.op == OpKind::Input ? n.name : std::string();
}

json graph_to_json(const Graph& g) {
  json nodes = json::array();
  for (const Node& n : g.nodes()) {
    json o = json::object();
    o["op"] = op_name(n.op);
    o["in"] = n.inputs;
    json outs = json::array();
    for (ValueId v : n.outputs) outs.push_back(info_json(g.info(v)));
    o["out"] = std::move(outs);
    if (!n.name.empty()) o["name"] = n.name;
    if (n.weight != kNone) o["weight"] = n.weight;
    if (!n.attrs.items().empty()) {
      json a = json::array();
      for (const auto& [k, v] : n.attrs.items()) a.push_back(json::array({k, attr_json(v)}));
      o["attrs"] = std::move(a);
    }
    nodes.push_back(std::move(o));
  }
  json weights = json::array();
  for (const WeightRef& w : g.weights())
    weights.push_back(json::object({{"name", w.name}, {"dtype", dtype_name(w.dtype)}, {"shape", w.shape}}));
  return json::object({{"nodes", std::move(nodes)}, {"weights", std::move(weights)}, {"outputs", g.outputs()}});
}

Result<Graph> graph_from_json(const json& j, const std::string& where) {
  Reader r{where};
  if (!j.is_object()) return r.bad("not an object");
  const json* jn = field(j, "nodes");
  const json* jw = field(j, "weights");
  const json* jo = field(j, "outputs");
  if (!jn || !jn->is_array() || !jw || !jw->is_array() || !jo || !jo->is_array())
    return r.bad("needs the lists 'nodes', 'weights' and 'outputs'");
  if (jn->size() > 1000000 || jw->size() > 1000000) return r.bad("too many nodes or weights");
  Graph g;
  g.reserve(jn->size(), jn->size());
  std::vector<WeightRef> weights;
  for (size_t i = 0; i < jw->size(); ++i) {
    const json& e = (*jw)[i];
    const std::string ctx = "weight " + std::to_string(i);
    if (!e.is_object() || !field(e, "name") || !e["name"].is_string() || !field(e, "dtype") || !e["dtype"].is_string() ||
        !field(e, "shape"))
      return r.bad(ctx + ": needs name, dtype and shape");
    WeightRef w;
    w.name = e["name"].get<std::string>();
    auto dt = dtype_from_name(e["dtype"].get<std::string>());
    if (!dt) return r.bad(ctx + ": unknown dtype");
    w.dtype = *dt;
    VLAC_ASSIGN_OR_RETURN(w.shape, r.shape(e["shape"], ctx));
    w.bytes = ValueInfo{w.dtype, w.shape}.bytes();
    weights.push_back(std::move(w));
  }
  std::vector<bool> weight_used(weights.size(), false);
  for (size_t i = 0; i < jn->size(); ++i) {
    const json& e = (*jn)[i];
    const std::string ctx = "node " + std::to_string(i);
    if (!e.is_object() || !field(e, "op") || !e["op"].is_string() || !field(e, "in") || !e["in"].is_array() ||
        !field(e, "out") || !e["out"].is_array())
      return r.bad(ctx + ": needs op, in and out");
    auto op = op_from_name(e["op"].get<std::string>());
    if (!op) return r.bad(ctx + ": unknown op '" + e["op"].get<std::string>() + "'");
    const OpInfo& oi = op_info(*op);
    std::vector<ValueId> ins;
    for (const auto& v : e["in"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || size_t(v.get<int64_t>()) >= g.values().size())
        return r.bad(ctx + ": reads a value not defined before it");
      ins.push_back(ValueId(v.get<int64_t>()));
    }
    if (int(ins.size()) < oi.n_in_min || (oi.n_in_max >= 0 && int(ins.size()) > oi.n_in_max))
      return r.bad(ctx + ": wrong number of inputs for " + oi.name);
    std::vector<ValueInfo> outs;
    for (const auto& o : e["out"]) {
      VLAC_ASSIGN_OR_RETURN(ValueInfo vi, r.info(o, ctx));
      outs.push_back(std::move(vi));
    }
    if (int(outs.size()) != oi.n_out) return r.bad(ctx + ": wrong number of outputs for " + oi.name);
    Attrs attrs;
    if (const json* ja = field(e, "attrs")) {
      if (!ja->is_array()) return r.bad(ctx + ": attrs must be a list");
      for (const auto& kv : *ja) {
        if (!kv.is_array() || kv.size() != 2 || !kv[0].is_string()) return r.bad(ctx + ": attribute must be [key, value]");
        VLAC_ASSIGN_OR_RETURN(AttrValue v, r.attr(kv[1], ctx));
        attrs.set(kv[0].get<std::string>(), std::move(v));
      }
    }
    std::string name;
    if (const json* nm = field(e, "name")) {
      if (!nm->is_string()) return r.bad(ctx + ": name must be a string");
      name = nm->get<std::string>();
    }
    if (*op == OpKind::Input) {
      if (!ins.empty()) return r.bad(ctx + ": an input node has no inputs");
      g.add_input(name, outs[0]);
    } else if (*op == OpKind::Weight) {
      const json* wi = field(e, "weight");
      if (!wi || !wi->is_number_integer() || wi->get<int64_t>() < 0 || size_t(wi->get<int64_t>()) >= weights.size())
        return r.bad(ctx + ": weight index out of range");
      const size_t w = size_t(wi->get<int64_t>());
      if (weight_used[w]) return r.bad(ctx + ": weight " + std::to_string(w) + " has two nodes");
      weight_used[w] = true;
      if (outs[0] != ValueInfo{weights[w].dtype, weights[w].shape}) return r.bad(ctx + ": output differs from its weight");
      // Weights are registered in node order; remember the original index through the name.
      g.weight(weights[w]);
    } else {
      g.add_node_unchecked(*op, std::move(ins), std::move(outs), std::move(attrs), std::move(name));
    }
  }
  for (const auto& v : *jo) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || size_t(v.get<int64_t>()) >= g.values().size())
      return r.bad("output value out of range");
    g.mark_output(ValueId(v.get<int64_t>()));
  }
  Status st = verify(g);
  if (!st.is_ok()) return r.bad(st.message());
  return g;
}

Result<Graph> respecialize(const Graph& g, const std::map<std::string, std::vector<int64_t>>& input_shapes) {
  Graph out = g;
  std::vector<Node>& nodes = out.mutable_nodes();
  std::vector<Value>& values = out.mutable_values();
  std::vector<const ValueInfo*> infos;
  for (Node& n : nodes) {
    if (n.op == OpKind::Input) {
      auto it = input_shapes.find(n.name);
      if (it != input_shapes.end()) values[size_t(n.outputs[0])].info.shape = it->second;
      continue;
    }
    if (n.op == OpKind::Weight || n.op == OpKind::Constant) continue;
    infos.clear();
    for (ValueId v : n.inputs) infos.push_back(&values[size_t(v)].info);
    auto outs = infer_outputs(n.op, infos, n.attrs);
    if (!outs.is_ok())
      return shape_mismatch("node '" + n.name + "' (" + op_name(n.op) + ") cannot take the new shapes: " +
                            outs.status().message());
    for (size_t i = 0; i < outs->size() && i < n.outputs.size(); ++i) values[size_t(n.outputs[i])].info = (*outs)[i];
  }
  VLAC_RETURN_IF_ERROR(verify(out));
  return out;
}

}  // namespace vlac::ir
