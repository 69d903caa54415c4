// Backend registry (see registry.h).
#include "backends/registry.h"

#include "backends/cpu/backend.h"
#ifdef VLAC_HAVE_CUDA
#include "backends/cuda/compile_only_backend.h"  // TEMPORARY: until the CUDA runtime's backend is wired in
#endif

namespace vlac {

Status BackendRegistry::add(std::unique_ptr<Backend> backend) {
  if (!backend) return invalid_argument("backend registry: null backend");
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& b : backends_)
    if (b->name() == backend->name())
      return invalid_argument("backend registry: a backend named '" + std::string(backend->name()) +
                              "' is registered already");
  backends_.push_back(std::move(backend));
  return Status::ok();
}

Backend* BackendRegistry::find(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& b : backends_)
    if (b->name() == name) return b.get();
  return nullptr;
}

std::vector<std::string> BackendRegistry::names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& b : backends_) out.emplace_back(b->name());
  return out;
}

Result<Backend*> BackendRegistry::get(std::string_view name, const std::string& context) const {
  if (Backend* b = find(name)) return b;
  std::string avail;
  for (const std::string& n : names()) avail += (avail.empty() ? "" : ", ") + n;
  return unsupported(context + ": backend '" + std::string(name) + "' is not built into this vlac (available: " +
                     avail + ")");
}

BackendRegistry& backend_registry() {
  static BackendRegistry* reg = [] {
    auto* r = new BackendRegistry;  // never destroyed: backends may be used from atexit paths
    // Built-in backends, explicitly (a CUDA build adds cuda::make_cuda_backend() here).
    (void)r->add(cpu::make_cpu_backend());
#ifdef VLAC_HAVE_CUDA
    (void)r->add(cuda::make_cuda_compile_only_backend());  // TEMPORARY (see compile_only_backend.h)
#endif
    return r;
  }();
  return *reg;
}

}  // namespace vlac
