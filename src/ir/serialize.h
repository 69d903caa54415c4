// Graph <-> JSON: the program of a packaged engine (nodes, value infos, attributes, weight
// references) and shape re-specialization for new input shapes. Reads hostile JSON: every id,
// arity and shape is checked (verify) before the graph is returned. Never touches weight bytes.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "ir/graph.h"

namespace vlac::ir {

/// The whole graph as JSON: {"values": [[dtype, shape], ...], "nodes": [{op, in, out, attrs,
/// name, weight?}], "weights": [{name, dtype, shape, file, offset, bytes}], "inputs": [...],
/// "outputs": [...]}. Deterministic (same graph, same text).
nlohmann::json graph_to_json(const Graph& g);

/// Parses graph_to_json's form; `where` names the source in errors ("pkg.vlac: engine 'lm.0'").
/// Every index is range-checked and the result passes verify().
Result<Graph> graph_from_json(const nlohmann::json& j, const std::string& where);

/// A copy of `g` whose Input nodes take the shapes in `input_shapes` (by input name; inputs not
/// named keep theirs), with every other value re-inferred in order. Fails (ShapeMismatch) when an
/// op cannot take the new shapes; attributes never encode sizes that vary (reshape uses -1).
Result<Graph> respecialize(const Graph& g, const std::map<std::string, std::vector<int64_t>>& input_shapes);

/// Name of an Input node's value ("" when `v` is not a graph input).
std::string input_name(const Graph& g, ValueId v);

}  // namespace vlac::ir
