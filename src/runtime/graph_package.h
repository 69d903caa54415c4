// Any .vlac package of engines, run as one graph: every stage in manifest order, inputs and
// outputs by name. The generic runtime entry point (compile/graph_compile.h writes such
// packages); pi0.5's runtime runs its stages through the same PackageEngines.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/status.h"
#include "package/package.h"
#include "runtime/package_engines.h"

namespace vlac {

class GraphPackage {
 public:
  /// Opens and validates the package (no segment byte read); engines are planned on first run.
  /// `registry` (null: backend_registry()) must hold every backend the manifest names.
  static Result<GraphPackage> open(const std::string& path, PackageRunOptions options = {},
                                   const BackendRegistry* registry = nullptr);

  const Package& package() const { return *pkg_; }
  /// Runs every stage in order. `values` holds the graph inputs by name; every engine output is
  /// added (data valid until the next run).
  Status run(std::map<std::string, PackageValue>* values);
  const PackageRunStats& stats() const { return engines_->stats(); }

 private:
  GraphPackage() = default;
  std::unique_ptr<Package> pkg_;
  std::unique_ptr<PackageEngines> engines_;
};

}  // namespace vlac
