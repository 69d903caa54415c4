// CUDA backend behind the seam (backend.h): the runtime (weights, plans, buffers, copies on one
// stream), CUDA-graph recording of run sequences, and the device report.
#include "backends/cuda/backend.h"

#include <map>
#include <mutex>
#include <optional>

#include "backends/cuda/compiler.h"
#include "backends/cuda/context.h"
#include "backends/cuda/executor.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/weights.h"
#include "core/bytes.h"
#include "mem/host_steps.h"

namespace vlac::cuda {

namespace {

class CudaBuffer final : public BackendBuffer {
 public:
  CudaBuffer(void* p, uint64_t bytes, MemoryKind kind) : p_(p), bytes_(bytes), kind_(kind) {}
  ~CudaBuffer() override {
    if (kind_ == MemoryKind::Host) host_free(p_);
    else device_free(p_);
  }
  void* data() const override { return p_; }
  uint64_t bytes() const override { return bytes_; }
  MemoryKind kind() const override { return kind_; }

 private:
  void* p_;
  uint64_t bytes_;
  MemoryKind kind_;
};

// Recorded run sequences: per key, run directly once, capture the second call into a CUDA graph,
// replay it after that. Host work the graph needs (CudaContext::add_replay_hook) runs before each
// replay once the stream is idle (it may rewrite a page-locked buffer the last run read from).
class CudaSequence final : public RunSequence {
 public:
  explicit CudaSequence(CudaContext* ctx) : ctx_(ctx) {}
  ~CudaSequence() override { clear(); }
  Status run(uint64_t key, const std::function<Status()>& body) override {
    VLAC_RETURN_IF_ERROR(ctx_->ensure());
    Entry& e = entries_[key];
    if (e.exec) {
      if (!e.hooks.empty()) {
        const cudaError_t se = cudaStreamSynchronize(ctx_->stream());
        if (se != cudaSuccess) return cuda_error("waiting for the stream before a replay's host work", se);
        for (const auto& h : e.hooks) VLAC_RETURN_IF_ERROR(h());
      }
      const cudaError_t ce = cudaGraphLaunch(e.exec, ctx_->stream());
      if (ce != cudaSuccess) return cuda_error("replaying a recorded chunk", ce);
      ++replays_;
      return Status::ok();
    }
    if (e.calls++ == 0) {  // warm-up: plans, cuBLASLt algorithms, memo slots
      const HostStep step("chunk_warmup");
      return body();
    }
    // Idle first: what registers a replay hook does its host work now, during the capture.
    cudaError_t ce = cudaStreamSynchronize(ctx_->stream());
    if (ce != cudaSuccess) return cuda_error("waiting for the stream before recording a chunk", ce);
    (void)ctx_->take_replay_hooks();
    std::optional<HostStep> step(std::in_place, "chunk_record");
    ce = cudaStreamBeginCapture(ctx_->stream(), cudaStreamCaptureModeThreadLocal);
    if (ce != cudaSuccess) return cuda_error("starting to record a chunk", ce);
    Status st = body();
    e.hooks = ctx_->take_replay_hooks();
    cudaGraph_t graph = nullptr;
    ce = cudaStreamEndCapture(ctx_->stream(), &graph);
    step.reset();
    if (!st.is_ok()) {
      if (graph) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      return Status(st.code(), "while recording a chunk: " + st.message());
    }
    if (ce != cudaSuccess) return cuda_error("recording a chunk", ce);
    const std::optional<uint64_t> before = nvml_used_bytes();
    // A second lane made with the highest priority (VLAC_LANE_PRIORITY=1): its kernel nodes keep
    // the stream's priority from the capture, used only with this flag.
    step.emplace("graph_instantiate");
    ce = cudaGraphInstantiate(&e.exec, graph, ctx_->lane_priority() ? cudaGraphInstantiateFlagUseNodePriority : 0);
    (void)cudaGraphDestroy(graph);
    step.reset();
    if (ce != cudaSuccess) {
      e.exec = nullptr;
      return cuda_error("instantiating a recorded chunk", ce);
    }
    const std::optional<uint64_t> after = nvml_used_bytes();
    if (before && after) ctx_->add_graph_bytes(int64_t(*after) - int64_t(*before));
    trim_clean_pages();  // the last loading step of a chunk shape (context.h)
    ce = cudaGraphLaunch(e.exec, ctx_->stream());
    if (ce != cudaSuccess) return cuda_error("replaying a recorded chunk", ce);
    return Status::ok();
  }
  void clear() override {
    for (auto& [k, e] : entries_)
      if (e.exec) (void)cudaGraphExecDestroy(e.exec);
    entries_.clear();
  }
  uint64_t replays() const override { return replays_; }

 private:
  struct Entry {
    int calls = 0;
    cudaGraphExec_t exec = nullptr;
    std::vector<std::function<Status()>> hooks;  // before each replay (CudaContext::add_replay_hook)
  };
  CudaContext* ctx_;
  std::map<uint64_t, Entry> entries_;
  uint64_t replays_ = 0;
};

class CudaBoundWeights final : public BoundWeights {
 public:
  explicit CudaBoundWeights(CudaWeights w) : w_(std::move(w)) {}
  uint64_t owned_bytes() const override { return w_.owned_bytes(); }
  uint64_t mapped_bytes() const override { return w_.mapped_bytes(); }
  const CudaWeights& weights() const { return w_; }

 private:
  CudaWeights w_;
};

class CudaRuntime final : public BackendRuntime {
 public:
  std::string_view name() const override { return "cuda"; }
  Result<std::unique_ptr<BoundWeights>> bind_weights(const WeightBinding& b) override {
    const HostStep step("weights_bind");
    VLAC_ASSIGN_OR_RETURN(CudaWeights w, CudaWeights::upload(ctx_, b));
    return std::unique_ptr<BoundWeights>(std::make_unique<CudaBoundWeights>(std::move(w)));
  }
  Result<std::unique_ptr<Executable>> plan(ir::Graph program, const BoundWeights& weights,
                                           const ExecOptions& o) override {
    const HostStep step("engine_plan");
    const auto* w = dynamic_cast<const CudaBoundWeights*>(&weights);
    if (!w) return internal_error("cuda backend: weights were bound by another backend");
    if (o.linear_observer)
      return unsupported("cuda backend: a calibration run (linear inputs shown to the host) runs on the CPU");
    VLAC_ASSIGN_OR_RETURN(auto ex, CudaExecutable::create(ctx_, std::move(program), w->weights(), o));
    return std::unique_ptr<Executable>(std::move(ex));
  }
  MemoryKind memory_kind() const override { return MemoryKind::Device; }
  Result<std::unique_ptr<BackendBuffer>> allocate(uint64_t bytes, MemoryKind kind, const std::string& what) override {
    VLAC_RETURN_IF_ERROR(ctx_.ensure());
    void* p = nullptr;
    if (kind == MemoryKind::Host) {
      VLAC_ASSIGN_OR_RETURN(p, host_alloc(bytes, what));
      std::memset(p, 0, bytes);
    } else {
      VLAC_ASSIGN_OR_RETURN(p, device_alloc(bytes, what));
      kind = MemoryKind::Device;
      const cudaError_t e = cudaMemsetAsync(p, 0, bytes, ctx_.stream());
      if (e != cudaSuccess) {
        device_free(p);
        return cuda_error(what, e);
      }
    }
    return std::unique_ptr<BackendBuffer>(std::make_unique<CudaBuffer>(p, bytes, kind));
  }
  Status copy(void* dst, const void* src, uint64_t bytes) override {
    VLAC_RETURN_IF_ERROR(ctx_.ensure());
    if (bytes == 0 || dst == src) return Status::ok();
    const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx_.stream());
    if (e != cudaSuccess) return cuda_error("copying " + std::to_string(bytes) + " bytes", e);
    return Status::ok();
  }
  Status synchronize() override {
    VLAC_RETURN_IF_ERROR(ctx_.ensure());
    const cudaError_t e = cudaStreamSynchronize(ctx_.stream());
    if (e != cudaSuccess) return cuda_error("a kernel or copy failed", e);
    return Status::ok();
  }
  std::unique_ptr<RunSequence> make_sequence() override { return std::make_unique<CudaSequence>(&ctx_); }
  int lanes() const override { return 2; }
  Status use_lane(int lane) override { return ctx_.use_lane(lane); }
  Result<int> mark() override { return ctx_.mark(); }
  Status wait_mark(int id) override {
    VLAC_RETURN_IF_ERROR(ctx_.ensure());
    return ctx_.wait_mark(id);
  }
  void clear_marks() override { ctx_.clear_marks(); }
  std::vector<std::pair<std::string, int64_t>> memory_breakdown() const override {
    if (!ctx_.started()) return {};
    std::vector<std::pair<std::string, int64_t>> out = ctx_.breakdown();
    for (auto& kv : memory_tally()) out.push_back(std::move(kv));
    return out;
  }

 private:
  CudaContext ctx_;
};

class CudaBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda"; }
  DeviceInfo device() const override {
    DeviceInfo d;
    d.backend = "cuda";
    d.memory = MemoryKind::Device;
    const Status st = device_status();
    if (!st.is_ok()) {
      d.description = "cuda: " + st.message();
      return d;
    }
    // The properties once (the meter's GPU probe calls device() every few milliseconds).
    static const std::pair<bool, cudaDeviceProp> props = [] {
      cudaDeviceProp p{};
      const bool ok = cudaGetDeviceProperties(&p, 0) == cudaSuccess;
      if (!ok) (void)cudaGetLastError();
      return std::make_pair(ok, p);
    }();
    if (!props.first) {
      d.description = "cuda: cannot read the device properties";
      return d;
    }
    const cudaDeviceProp& prop = props.second;
    d.compute_major = prop.major;
    d.compute_minor = prop.minor;
    // Device-wide memory through NVML when the driver has it: it needs no CUDA context, so the
    // first reading (the meter's idle level) is taken before this process creates one and the
    // context's own memory counts as "above idle". Without NVML, cudaMemGetInfo (context first).
    if (nvml_memory(&d.total_memory, &d.free_memory)) {
      d.memory_source = "nvml (device-wide, read without a CUDA context: the context counts above idle)";
    } else {
      size_t fr = 0, tot = 0;
      if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
        d.total_memory = tot;
        d.free_memory = fr;
        d.memory_source =
            "cudaMemGetInfo (no NVML: the idle reading creates this process's CUDA context, which then counts "
            "as idle)";
      } else {
        (void)cudaGetLastError();
      }
    }
    d.description = "cuda " + std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
                    std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs, " +
                    format_bytes(d.total_memory) + " total, " + format_bytes(d.free_memory) + " free)";
    return d;
  }
  // Host-only (compiler.h): packages for the GPU are built on GPU-less machines too.
  BackendCompiler* compiler() override { return compiler_.get(); }
  BackendRuntime& runtime() override { return runtime_; }

 private:
  CudaRuntime runtime_;
  std::unique_ptr<BackendCompiler> compiler_ = make_cuda_compiler();
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace vlac::cuda
