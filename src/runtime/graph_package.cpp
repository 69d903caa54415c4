// Generic package runner (see graph_package.h).
#include "runtime/graph_package.h"

namespace vlac {

Result<GraphPackage> GraphPackage::open(const std::string& path, PackageRunOptions options,
                                        const BackendRegistry* registry) {
  GraphPackage g;
  VLAC_ASSIGN_OR_RETURN(Package pkg, Package::open(path));
  g.pkg_ = std::make_unique<Package>(std::move(pkg));
  VLAC_ASSIGN_OR_RETURN(PackageEngines e, PackageEngines::open(*g.pkg_, std::move(options), registry));
  if (e.stages().empty()) return invalid_format(path + ": the package holds no engine");
  g.engines_ = std::make_unique<PackageEngines>(std::move(e));
  return g;
}

Status GraphPackage::run(std::map<std::string, PackageValue>* values) {
  for (const std::string& stage : engines_->stages()) VLAC_RETURN_IF_ERROR(engines_->run_stage(stage, values));
  return Status::ok();
}

}  // namespace vlac
