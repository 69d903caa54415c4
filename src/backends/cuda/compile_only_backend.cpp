// TEMPORARY (see compile_only_backend.h): the CUDA compiler with a runtime that refuses.
#include "backends/cuda/compile_only_backend.h"

#include "backends/cuda/compiler.h"

namespace vlac::cuda {

namespace {

Status no_runtime() {
  return unsupported("cuda backend: this vlac compiles CUDA engines but its CUDA runtime is not built in yet");
}

class RefusingRuntime final : public BackendRuntime {
 public:
  std::string_view name() const override { return "cuda"; }
  Result<std::unique_ptr<BoundWeights>> bind_weights(const WeightBinding&) override { return no_runtime(); }
  Result<std::unique_ptr<Executable>> plan(ir::Graph, const BoundWeights&, const ExecOptions&) override {
    return no_runtime();
  }
};

class CompileOnlyBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda"; }
  DeviceInfo device() const override {
    DeviceInfo d;
    d.backend = "cuda";
    d.description = "cuda (compile only)";
    d.memory = MemoryKind::Device;
    return d;
  }
  BackendCompiler* compiler() override { return compiler_.get(); }
  BackendRuntime& runtime() override { return runtime_; }

 private:
  std::unique_ptr<BackendCompiler> compiler_ = make_cuda_compiler();
  RefusingRuntime runtime_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_compile_only_backend() { return std::make_unique<CompileOnlyBackend>(); }

}  // namespace vlac::cuda
