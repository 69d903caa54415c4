// CPU backend behind the seam (see backend.h). Thin adapters: the behaviour is the executor's
// and the engine builder's, unchanged.
#include "backends/cpu/backend.h"

#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/engine_builder.h"
#include "backends/cpu/executor.h"

namespace vlac::cpu {

namespace {

class CpuBoundWeights final : public BoundWeights {
 public:
  explicit CpuBoundWeights(CpuWeights w) : w_(std::move(w)) {}
  uint64_t owned_bytes() const override { return w_.owned_bytes(); }
  uint64_t mapped_bytes() const override { return w_.mapped_bytes(); }
  const CpuWeights& weights() const { return w_; }

 private:
  CpuWeights w_;
};

class CpuExecutable final : public Executable {
 public:
  explicit CpuExecutable(Executor ex) : ex_(std::move(ex)) {}
  const ir::Graph& graph() const override { return ex_.graph(); }
  MemoryPlan memory() const override {
    MemoryPlan m;
    m.kind = MemoryKind::Host;
    m.arena_bytes = ex_.arena_bytes();
    m.scratch_bytes = ex_.scratch_bytes();
    m.input_bytes = ex_.input_bytes();
    m.memo_bytes = ex_.memo_bytes();
    m.packed_bytes = ex_.packed_bytes();
    return m;
  }
  void bind_memory(void* arena, void* scratch) override {
    ex_.set_memory(static_cast<uint8_t*>(arena), static_cast<float*>(scratch));
  }
  int input_index(std::string_view name) const override { return ex_.input_index(name); }
  void* input_data(int i) override { return ex_.input_data(i); }
  void bind_input(int i, const void* external) override { ex_.bind_input(i, external); }
  const void* data(ir::ValueId v) const override { return ex_.data(v); }
  Status run() override { return ex_.run(); }
  uint64_t memo_hits() const override { return ex_.memo_hits(); }
  size_t memo_nodes() const override { return ex_.memo_nodes(); }

 private:
  Executor ex_;
};

class CpuRuntime final : public BackendRuntime {
 public:
  std::string_view name() const override { return "cpu"; }
  Result<std::unique_ptr<BoundWeights>> bind_weights(const WeightBinding& b) override {
    VLAC_ASSIGN_OR_RETURN(CpuWeights w, CpuWeights::load(b.refs, b.run_dtypes, b.files, b.gather_only));
    return std::unique_ptr<BoundWeights>(std::make_unique<CpuBoundWeights>(std::move(w)));
  }
  Result<std::unique_ptr<Executable>> plan(ir::Graph program, const BoundWeights& weights,
                                           const ExecOptions& o) override {
    const auto* w = dynamic_cast<const CpuBoundWeights*>(&weights);
    if (!w) return internal_error("cpu backend: weights were bound by another backend");
    ExecutorOptions eo;
    eo.threads = o.threads;
    eo.shared_memory = o.shared_memory;
    eo.pack_weights = o.pack_weights;
    eo.bf16_mqa_attention = o.bf16_mqa_attention;
    eo.fp8_activations = o.fp8_activations;
    eo.memo_inputs = o.memo_inputs;
    eo.memo_slots = o.memo_slots;
    eo.linear_observer = o.linear_observer;
    VLAC_ASSIGN_OR_RETURN(Executor ex, Executor::create(std::move(program), w->weights(), eo));
    return std::unique_ptr<Executable>(std::make_unique<CpuExecutable>(std::move(ex)));
  }
};

class CpuCompiler final : public BackendCompiler {
 public:
  std::string_view name() const override { return "cpu"; }
  bool supports(const ir::Graph& g, ir::NodeId node) const override {
    // What Executor::plan accepts by op kind (its dtype checks are repeated at plan time).
    switch (g.node(node).op) {
      case ir::OpKind::MatMul:
      case ir::OpKind::Transpose:
        return false;
      default:
        return true;
    }
  }
  Result<EngineEstimate> estimate_bytes(const Subgraph& sub) const override {
    EngineEstimate e;
    for (ir::NodeId n : sub.nodes) {
      const ir::Node& nd = sub.graph->node(n);
      if (nd.op == ir::OpKind::Weight) e.weights_bytes += sub.graph->weights()[size_t(nd.weight)].bytes;
      else if (nd.op != ir::OpKind::Reshape)
        for (ir::ValueId v : nd.outputs) e.scratch_bytes += sub.graph->info(v).bytes();
    }
    e.compile_peak_bytes = 8ull << 20;  // the builder's chunk buffer
    return e;
  }
  Result<EngineBlob> compile(const Subgraph& sub, const std::vector<StoredWeight>& store, WeightSource& weights,
                             const CompileOptions& options) override {
    if (options.engine_dir.empty() || options.engine_name.empty())
      return invalid_argument("cpu backend: compile needs an engine folder and an engine name");
    const std::string path = options.engine_dir + "/" + options.engine_name + ".engine";
    VLAC_ASSIGN_OR_RETURN(EngineFile ef, write_cpu_engine_file(path, store, weights, 8ull << 20, options.calibration));
    EngineBlob blob;
    blob.backend = "cpu";
    blob.path = ef.path;
    blob.bytes = ef.bytes;
    blob.weights = std::move(ef.weights);
    if (sub.graph) {
      VLAC_ASSIGN_OR_RETURN(blob.estimate, estimate_bytes(sub));
    }
    blob.estimate.weights_bytes = ef.bytes;
    return blob;
  }
  void release_memory() override { release_heap(); }
};

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  DeviceInfo device() const override {
    const CpuIsaInfo& isa = cpu_isa();
    DeviceInfo d;
    d.backend = "cpu";
    d.description = "cpu " + isa.name;
    d.memory = MemoryKind::Host;
    d.isa = isa.name;
    d.bf16_matmul = isa.bf16_matmul;
    d.int8_matmul = isa.int8_matmul;
    d.error = isa.cap_error;
    d.detail = cpu_isa_line();
    d.f32_path = f32_path_name();
    d.bf16_path = bf16_path_name();
    auto q = [](const std::string& s) { return "\"" + s + "\""; };
    d.report = {{"cpu_isa", q(isa.name)},         {"cpu_isa_native", q(isa.native_name)},
                {"cpu_isa_cap", q(isa.cap)},      {"onednn_isa", q(isa.onednn_isa)},
                {"bf16_matmul", isa.bf16_matmul ? "true" : "false"}, {"bf16_path", q(d.bf16_path)}};
    return d;
  }
  BackendCompiler* compiler() override { return &compiler_; }
  BackendRuntime& runtime() override { return runtime_; }

 private:
  CpuCompiler compiler_;
  CpuRuntime runtime_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace vlac::cpu
