// The generic compile entry point: one graph (weights referenced in caller-given files) ->
// engines of the named backend under the cap -> one .vlac package that runtime/graph_package.h
// runs. pi0.5's compile (pi05_compile.h) goes through the same EngineBuilder.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "compile/engine_build.h"
#include "core/status.h"
#include "ir/backend.h"
#include "ir/graph.h"

namespace vlac {

struct GraphCompileOptions {
  std::string out;                     // OUT.vlac
  std::string backend = "cpu";         // registry name
  uint64_t engine_cap = 512ull << 20;
  std::string engine_dir;              // "" = a temporary folder next to OUT, removed after
  /// The bytes the graph's WeightRefs point into (WeightRef::file_id indexes this list).
  std::vector<WeightFileView> files;
  /// The dtype each weight is stored and run in; empty: as referenced.
  std::function<DType(const ir::WeightRef&)> run_dtype;
  std::function<void(const std::string& line)> log;
};

/// Compiles `g` (outputs named by `outputs`: the names a GraphPackage run returns) into
/// options.out, stage "graph". On error nothing is left at options.out.
Result<CompileSummary> compile_graph(const ir::Graph& g, const std::vector<std::pair<std::string, ir::ValueId>>& outputs,
                                     const GraphCompileOptions& options);

}  // namespace vlac
