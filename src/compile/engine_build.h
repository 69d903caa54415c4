// Engine building, backend- and model-neutral: a graph ("stage") partitioned under the engine
// cap, every node checked against the backend's supports(), each engine built by the backend's
// compiler one file at a time and streamed into the package, with its program, weight table and
// last-use list in the manifest. pi0.5's compile and the generic compile_graph both use it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "ir/backend.h"
#include "ir/graph.h"
#include "package/manifest.h"
#include "package/package_writer.h"

namespace vlac {

/// One engine as built, for the compile report.
struct CompiledEngine {
  std::string name, stage;
  uint64_t weight_bytes = 0;  // packed bytes stored with this engine
  uint64_t file_bytes = 0;
  int weights_stored = 0, weights_read = 0;
  bool over_cap = false;
  std::string over_cap_node;
  uint64_t crossing_in_bytes = 0;
};

struct CompileSummary {
  using Engine = CompiledEngine;
  std::vector<CompiledEngine> engines;  // run order
  uint64_t package_bytes = 0;
  uint64_t packed_weight_bytes = 0;
  uint64_t source_weight_bytes = 0;  // bytes of the checkpoint tensors the engines read
  uint64_t crossing_bytes = 0;
  std::string plan_text;             // partition plans, human-readable
};

/// The folder engine files are written to: the caller's, or a temporary ".vlac-engines-<pid>"
/// beside the package (same filesystem, never /tmp, which may be RAM); folders of killed
/// compiles are removed first. Tracked files (and an own folder) are removed on destruction
/// unless keep() was called.
class EngineFolder {
 public:
  static Result<std::unique_ptr<EngineFolder>> open(const std::string& out, const std::string& engine_dir,
                                                    const std::function<void(const std::string&)>& log);
  ~EngineFolder() { cleanup(); }
  const std::string& path() const { return dir_; }
  bool own() const { return own_; }
  void track(const std::string& file) { files_.push_back(file); }
  /// Keeps the files and the folder: the destructor removes nothing.
  void keep() {
    files_.clear();
    own_ = false;
  }
  void cleanup();

 private:
  EngineFolder(std::string dir, bool own) : dir_(std::move(dir)), own_(own) {}
  std::string dir_;
  bool own_;
  std::vector<std::string> files_;
};

struct EngineBuildOptions {
  uint64_t engine_cap = 512ull << 20;
  /// The dtype each weight is stored and run in (F32/BF16 for the CPU).
  std::function<DType(const ir::WeightRef&)> run_dtype;
  std::function<void(const std::string& line)> log;
  std::function<void(const std::string& stage)> on_stage;  // "engine:<name>" before each build
  /// Statistics for GPTQ rounding of the 8-bit weights (CompileOptions::calibration); borrowed.
  const ir::QuantCalibration* calibration = nullptr;
};

/// Builds stages into one package being written. Borrowed: compiler, source, writer, manifest,
/// folder, summary outlive it.
class EngineBuilder {
 public:
  EngineBuilder(BackendCompiler& compiler, WeightSource& source, EngineFolder& folder, PackageWriter& writer,
                PackageManifest& manifest, CompileSummary& summary, EngineBuildOptions options)
      : compiler_(compiler), source_(source), folder_(folder), writer_(writer), manifest_(manifest),
        sum_(summary), opt_(std::move(options)) {}
  /// Partitions `g` as stage `stage` (graph outputs named by `named`), builds and packages every
  /// engine; returns the engine names in run order.
  Result<std::vector<std::string>> add_stage(const ir::Graph& g, const std::string& stage,
                                             const std::map<ir::ValueId, std::string>& named);

 private:
  BackendCompiler& compiler_;
  WeightSource& source_;
  EngineFolder& folder_;
  PackageWriter& writer_;
  PackageManifest& manifest_;
  CompileSummary& sum_;
  EngineBuildOptions opt_;
};

}  // namespace vlac
