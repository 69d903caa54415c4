// The graph IR on "meta": values (dtype + shape), nodes (op + attributes), weights by reference.
// Holds no tensor data and no data pointers: a weight is (name, file id, offset, dtype, shape).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "ir/ops.h"

namespace vlac::ir {

using ValueId = int32_t;
using NodeId = int32_t;
using WeightId = int32_t;
constexpr int32_t kNone = -1;

/// A tensor on meta: element type and row-major shape (outermost first), no data.
struct ValueInfo {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // e.g. [T, D]; rank 0 is a scalar

  int64_t numel() const;
  uint64_t bytes() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype); }
  bool operator==(const ValueInfo&) const = default;
};

/// "f32[968, 2048]".
std::string to_string(const ValueInfo& info);

/// A weight tensor by reference: where its bytes live, never the bytes themselves.
struct WeightRef {
  std::string name;            // canonical checkpoint key, e.g. "model.action_in_proj.weight"
  uint32_t file_id = 0;        // index into the caller's file table (e.g. safetensors shards)
  uint64_t offset = 0;         // byte offset of the data inside that file
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // as stored, e.g. [out, in] for a linear weight
  uint64_t bytes = 0;          // numel * dtype_size
  /// A weight fused from stored tensors (ir/fuse: q|k|v, gate|up): the concatenation of `parts`
  /// along axis 0, in order (each a plain reference with the same dtype and trailing dims); its
  /// own file_id/offset are unused. Empty for a tensor stored as one piece. Never serialized:
  /// the engine that stores it writes the parts as one weight under `name`.
  std::vector<WeightRef> parts;
};

/// Attribute values: a small closed set.
using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>>;

/// A small ordered attribute map (few keys per node, so a vector beats a tree).
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> kv) : items_(kv) {}

  void set(std::string key, AttrValue value);
  bool has(std::string_view key) const { return find(key) != nullptr; }
  const AttrValue* find(std::string_view key) const;
  /// Typed getters: the default when the key is absent or holds another type.
  int64_t get_int(std::string_view key, int64_t def = 0) const;
  double get_float(std::string_view key, double def = 0.0) const;   // also reads an int
  std::string get_string(std::string_view key, std::string def = {}) const;
  std::vector<int64_t> get_ints(std::string_view key) const;
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }

 private:
  std::vector<std::pair<std::string, AttrValue>> items_;
};

/// "scale=0.0625", "perm=[1, 0, 2]", "dtype=\"BF16\"".
std::string to_string(const AttrValue& value);

struct Value {
  ValueInfo info;
  NodeId producer = kNone;  // every value has one (graph inputs come from Input nodes)
  int32_t output_index = 0; // which output of the producer
};

struct Node {
  OpKind op = OpKind::Input;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;  // op_info(op).n_out values; multi-output ops (AdaRMSNorm) have >1
  Attrs attrs;
  WeightId weight = kNone;       // Weight nodes only
  std::string name;              // optional, for printing and diagnostics ("lm.3.q_proj")
};

/// A graph under construction or ready for passes. Nodes are appended, so the insertion order
/// is a valid topological order while only the add_* functions are used; passes that rewire
/// must re-verify. Move-only in spirit (copy is allowed but large).
class Graph {
 public:
  /// Adds an Input node; returns its value. `name` is the graph input's name.
  ValueId add_input(std::string name, ValueInfo info);
  /// Registers a weight (no node); returns its id.
  WeightId add_weight(WeightRef ref);
  /// Adds a Weight node reading weights()[w]; returns its value.
  ValueId add_weight_node(WeightId w);
  /// Convenience: add_weight + add_weight_node.
  ValueId weight(WeightRef ref) { return add_weight_node(add_weight(std::move(ref))); }
  /// Adds a Constant node: `info` filled with attr value=`value`.
  ValueId add_constant(ValueInfo info, double value, std::string name = {});

  /// Adds a node whose output infos are inferred (infer_outputs). Errors name the op and node.
  Result<NodeId> add_node(OpKind op, std::vector<ValueId> inputs, Attrs attrs = {},
                          std::string name = {});
  /// Single-output convenience: the node's only output value.
  Result<ValueId> add(OpKind op, std::vector<ValueId> inputs, Attrs attrs = {},
                      std::string name = {});
  /// Adds a node with explicit output infos (no inference); for passes and tests.
  NodeId add_node_unchecked(OpKind op, std::vector<ValueId> inputs, std::vector<ValueInfo> outs,
                            Attrs attrs = {}, std::string name = {});

  void mark_output(ValueId v) { outputs_.push_back(v); }

  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<WeightRef>& weights() const { return weights_; }
  const std::vector<ValueId>& inputs() const { return inputs_; }    // Input node values, in order
  const std::vector<ValueId>& outputs() const { return outputs_; }
  const Node& node(NodeId n) const { return nodes_[static_cast<size_t>(n)]; }
  const Value& value(ValueId v) const { return values_[static_cast<size_t>(v)]; }
  const ValueInfo& info(ValueId v) const { return value(v).info; }
  /// For passes: mutable access (re-run verify() after edits).
  std::vector<Node>& mutable_nodes() { return nodes_; }
  std::vector<Value>& mutable_values() { return values_; }
  void reserve(size_t n_nodes, size_t n_values);

 private:
  NodeId append(Node node, std::vector<ValueInfo> outs);

  std::vector<Node> nodes_;
  std::vector<Value> values_;
  std::vector<WeightRef> weights_;
  std::vector<ValueId> inputs_;
  std::vector<ValueId> outputs_;
};

/// Output infos of `op` for the given input infos and attributes; an error says what is
/// inconsistent. Input/Constant/Weight have no inference (callers give their info).
Result<std::vector<ValueInfo>> infer_outputs(OpKind op, const std::vector<const ValueInfo*>& in,
                                             const Attrs& attrs);

/// Checks the whole graph: ids in range, producers consistent, every input defined before use
/// (no cycles), arity per the op table, weights valid, output infos equal to inference.
/// Returns Internal on the first violation, naming node id, name and op.
Status verify(const Graph& g);

}  // namespace vlac::ir
