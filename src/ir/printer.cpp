// print_graph: the text listing used by `vlac inspect --graph`. Must not read tensor data.
#include "ir/printer.h"

#include <cstdio>

#include "core/bytes.h"
#include "ir/walk.h"

namespace vlac::ir {

std::string print_graph(const Graph& g) {
  auto order = topo_order(g);
  if (!order.is_ok()) return "graph: " + order.status().message() + "\n";
  std::string out;
  char buf[64];
  uint64_t read_weight_bytes = 0;
  for (NodeId n : *order) {
    const Node& nd = g.node(n);
    std::snprintf(buf, sizeof buf, "%6d %-15s", n, op_name(nd.op));
    out += buf;
    if (!nd.name.empty()) out += nd.name + "  ";
    if (!nd.inputs.empty()) {
      out += "(";
      for (size_t i = 0; i < nd.inputs.size(); ++i)
        out += (i ? ", %" : "%") + std::to_string(nd.inputs[i]);
      out += ") ";
    }
    out += "->";
    for (size_t i = 0; i < nd.outputs.size(); ++i)
      out += (i ? ", %" : " %") + std::to_string(nd.outputs[i]) + " " + to_string(g.info(nd.outputs[i]));
    uint64_t wbytes = 0;
    if (nd.op == OpKind::Weight) {
      wbytes = g.weights()[size_t(nd.weight)].bytes;
    } else {
      for (ValueId v : nd.inputs)
        if (g.node(g.value(v).producer).op == OpKind::Weight)
          wbytes += g.weights()[size_t(g.node(g.value(v).producer).weight)].bytes;
      read_weight_bytes += wbytes;
    }
    if (wbytes) out += "  w " + format_bytes(wbytes);
    for (const auto& [key, value] : nd.attrs.items()) out += "  " + key + "=" + to_string(value);
    out += "\n";
  }
  uint64_t weight_bytes = 0;
  for (const WeightRef& w : g.weights()) weight_bytes += w.bytes;
  auto live = liveness(g, *order);
  out += "nodes " + std::to_string(g.nodes().size()) + ", values " + std::to_string(g.values().size()) +
         ", inputs " + std::to_string(g.inputs().size()) + ", outputs " +
         std::to_string(g.outputs().size()) + "\n";
  out += "weights " + std::to_string(g.weights().size()) + ": " + format_bytes(weight_bytes) + " (" +
         std::to_string(weight_bytes) + " bytes); read by nodes: " + format_bytes(read_weight_bytes) + "\n";
  out += "peak live activations (this order): " + format_bytes(peak_live_bytes(g, *order, live)) + "\n";
  return out;
}

}  // namespace vlac::ir
