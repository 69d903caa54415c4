// Generic compile (see graph_compile.h).
#include "compile/graph_compile.h"

#include <map>

#include "backends/registry.h"
#include "core/atomic_file.h"

namespace vlac {

Result<CompileSummary> compile_graph(const ir::Graph& g, const std::vector<std::pair<std::string, ir::ValueId>>& outputs,
                                     const GraphCompileOptions& opt) {
  if (opt.out.empty()) return invalid_argument("compile: an output package path is required");
  if (opt.engine_cap < 4096) return invalid_argument("--engine-cap must be at least 4 KiB");
  VLAC_ASSIGN_OR_RETURN(Backend* backend, backend_registry().get(opt.backend, "compile"));
  BackendCompiler* compiler = backend->compiler();
  if (!compiler) return unsupported("compile: backend '" + opt.backend + "' runs packages but does not build engines");
  VLAC_ASSIGN_OR_RETURN(std::unique_ptr<EngineFolder> folder, EngineFolder::open(opt.out, opt.engine_dir, opt.log));
  FileWeightSource source(opt.files);
  CompileSummary sum;
  PackageManifest manifest;
  PackageWriter writer(opt.out, PackageWriterOptions{});
  EngineBuildOptions bo;
  bo.engine_cap = opt.engine_cap;
  bo.run_dtype = opt.run_dtype;
  bo.log = opt.log;
  EngineBuilder builder(*compiler, source, *folder, writer, manifest, sum, bo);
  std::map<ir::ValueId, std::string> named;
  for (const auto& [n, v] : outputs) named[v] = n;
  VLAC_ASSIGN_OR_RETURN(std::vector<std::string> names, builder.add_stage(g, "graph", named));
  manifest.policy = nlohmann::json::object({{"type", "graph"}, {"stages", {{"graph", names}}}});
  manifest.metadata = nlohmann::json::object({{"producer", "vlac compile_graph"}});
  writer.set_manifest(std::move(manifest));
  VLAC_ASSIGN_OR_RETURN(PackageWriteSummary ws, writer.finish());
  sum.package_bytes = ws.file_size;
  folder->cleanup();
  compiler->release_memory();
  return sum;
}

}  // namespace vlac
