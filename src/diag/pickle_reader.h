// A Python pickle reader that builds plain data (protocols 0-5) and NEVER executes anything:
// GLOBAL/STACK_GLOBAL/REDUCE/NEWOBJ/BUILD become inert values. Iterative, bounded, no recursion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace vlac {

enum class PickleKind : uint8_t {
  None,
  Bool,
  Int,     // fits int64; larger LONG values are stored as Float with `lossy` set
  Float,
  Str,     // UTF-8 bytes as written (not validated); Python 2 STRING opcodes too
  Bytes,   // bytes / bytearray
  List,
  Tuple,
  Dict,    // items() holds key, value, key, value, ... in insertion order
  Set,     // set and frozenset
  Global,  // a class/function reference: text() is "module.name"; never resolved
  Object,  // result of REDUCE/NEWOBJ/INST/OBJ/PERSID: text() names the callable;
           // items() is [args, state] (None where absent). Nothing was called.
};

const char* to_string(PickleKind kind);

/// Hard limits; every one is checked before the memory it guards is allocated.
struct PickleLimits {
  uint64_t max_input_bytes = 4ull << 30;  // whole pickle
  uint64_t max_objects = 32ull << 20;     // values created (each ~80 bytes)
  uint64_t max_memo = 16ull << 20;        // highest memo index + 1
  uint64_t max_stack = 4ull << 20;        // values on the stack at once
  uint32_t max_depth = 10000;             // open MARKs (nesting of list/dict/tuple literals)
};

using PickleId = uint32_t;

/// The decoded value tree, stored in one arena: values refer to each other by id, so memo
/// references share a value (as in Python) and cycles cannot leak or recurse.
class PickleDoc {
 public:
  PickleId root() const { return root_; }
  size_t n_values() const { return nodes_.size(); }
  /// Number of Global/Object values (things a real unpickler would have imported or called).
  size_t n_opaque() const { return n_opaque_; }

  PickleKind kind(PickleId id) const { return nodes_[id].kind; }
  bool is(PickleId id, PickleKind k) const { return id < nodes_.size() && nodes_[id].kind == k; }
  /// Int (and Bool as 0/1) values.
  std::optional<int64_t> as_int(PickleId id) const;
  /// Int, Bool or Float as double.
  std::optional<double> as_number(PickleId id) const;
  std::optional<bool> as_bool(PickleId id) const;
  /// Str: the text; Bytes: the raw bytes; Global/Object: the dotted name.
  const std::string* as_text(PickleId id) const;
  /// Str only.
  const std::string* as_str(PickleId id) const;
  /// List/Tuple/Set items; Dict flattened key/value pairs; Object [args, state]; else empty.
  std::span<const PickleId> items(PickleId id) const;
  /// Dict lookup by string key (last assignment wins, as in Python).
  std::optional<PickleId> get(PickleId dict, std::string_view key) const;
  /// True when a LONG did not fit int64 and was stored as an approximate Float.
  bool lossy(PickleId id) const { return nodes_[id].lossy; }

  /// Python-like text of a value, cut at `max_depth` levels and `max_items` per container.
  std::string repr(PickleId id, int max_depth = 3, int max_items = 6) const;

 private:
  friend class PickleParser;
  struct Node {
    PickleKind kind = PickleKind::None;
    bool lossy = false;
    int64_t i = 0;
    double f = 0;
    std::string text;
    std::vector<PickleId> items;
  };
  std::vector<Node> nodes_;
  PickleId root_ = 0;
  size_t n_opaque_ = 0;
};

/// Decodes a whole pickle. Errors (truncation, bad opcode, stack underflow, limits) name the
/// byte offset and the opcode, e.g. "pickle: truncated at offset 812 in BINUNICODE: ...".
Result<PickleDoc> read_pickle(std::span<const uint8_t> bytes, const PickleLimits& limits = {});

/// pickletools name of an opcode byte ("BINUNICODE"), or nullptr for unknown bytes.
const char* pickle_opcode_name(uint8_t op);

}  // namespace vlac
