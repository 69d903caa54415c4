// The shared CUDA context of a backend (context.h) and the allocation helpers whose errors name
// what was asked for.
#include "backends/cuda/context.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "backends/cuda/env.h"
#include "backends/cuda/kernels.h"
#include "core/bytes.h"
#include "mem/host_memory.h"
#include "mem/host_steps.h"

namespace vlac::cuda {

namespace {

// Live allocation bytes by use. The use is read from the `what` every allocation already gives
// for its error message (so no call site changes); the most specific wording is tested first.
enum Use : int {
  kWeights, kArena, kScratch, kMemo, kInputs, kConstants, kCrossing, kWorkspace, kDeviceOther,
  kStaging, kRows, kPinnedOther, kUses
};
constexpr const char* kUseNames[kUses] = {
    "device.weights",         "device.activation_arena", "device.kernel_scratch", "device.memo_slots",
    "device.engine_inputs",   "device.constants",        "device.crossing_buffers", "device.cublaslt_workspace",
    "device.other",           "host_pinned.weight_staging", "host_pinned.embedding_rows", "host_pinned.other"};

int classify(const std::string& what, bool device) {
  auto has = [&](const char* w) { return what.find(w) != std::string::npos; };
  if (!device) return has("weight staging") ? kStaging : has("embedding rows") ? kRows : kPinnedOther;
  if (has("activation arena")) return kArena;
  if (has("kernel scratch")) return kScratch;
  if (has("memo slots")) return kMemo;
  if (has("cuBLASLt workspace")) return kWorkspace;
  if (has("constants") || has("embedding ids")) return kConstants;
  if (has("': input '")) return kInputs;
  if (has("output '")) return kCrossing;
  if (has("uploading ") && has(" weights")) return kWeights;
  return kDeviceOther;
}

struct Tally {
  std::mutex mu;
  std::unordered_map<void*, std::pair<uint64_t, int>> live;
  int64_t bytes[kUses] = {};
  int64_t pinned = 0, pinned_peak = 0;
  void add(void* p, uint64_t n, int use) {
    std::lock_guard<std::mutex> lock(mu);
    forget_locked(p);  // the address came back after a free this tally did not see
    live[p] = {n, use};
    bytes[use] += int64_t(n);
    if (use >= kStaging) pinned_peak = std::max(pinned_peak, pinned += int64_t(n));
  }
  void forget(void* p) {
    std::lock_guard<std::mutex> lock(mu);
    forget_locked(p);
  }
  void forget_locked(void* p) {
    auto it = live.find(p);
    if (it == live.end()) return;
    bytes[it->second.second] -= int64_t(it->second.first);
    if (it->second.second >= kStaging) pinned -= int64_t(it->second.first);
    live.erase(it);
  }
};
// Never destroyed: frees may run from other static destructors at exit.
Tally& tally() {
  static Tally* t = new Tally;
  return *t;
}

// NVML through dlopen (the driver's libnvidia-ml; nothing to link): needs no CUDA context.
struct Nvml {
  struct Memory {
    unsigned long long total, free, used;
  };
  using Init = int (*)();
  using ByPci = int (*)(const char*, void**);
  using MemInfo = int (*)(void*, Memory*);
  bool ok = false;
  void* dev = nullptr;
  MemInfo mem = nullptr;
  static Nvml& get() {
    static Nvml n = [] {
      Nvml x;
      void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
      if (!h) return x;
      auto init = reinterpret_cast<Init>(dlsym(h, "nvmlInit_v2"));
      auto by_pci = reinterpret_cast<ByPci>(dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2"));
      x.mem = reinterpret_cast<MemInfo>(dlsym(h, "nvmlDeviceGetMemoryInfo"));
      char bus[64] = {};
      if (!init || !by_pci || !x.mem || init() != 0) return x;
      if (cudaDeviceGetPCIBusId(bus, sizeof(bus), 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return x;
      }
      x.ok = by_pci(bus, &x.dev) == 0;
      return x;
    }();
    return n;
  }
};

int64_t delta(const std::optional<uint64_t>& before, const std::optional<uint64_t>& after) {
  return before && after ? int64_t(*after) - int64_t(*before) : -1;
}

// Clean file pages (libraries' code and read-only data, the package's gathered rows) that the
// loading steps touched go back to the page cache (mem/host_memory.h): RSS falls, nothing is
// lost (the next touch is a minor fault). VLAC_TRIM_CLEAN_PAGES=0 turns it off.
bool trim_enabled() {
  static const bool on = !env_off("VLAC_TRIM_CLEAN_PAGES");
  return on;
}

}  // namespace

bool nvml_memory(uint64_t* total, uint64_t* free_bytes) {
  Nvml& nv = Nvml::get();
  Nvml::Memory m{};
  if (!nv.ok || nv.mem(nv.dev, &m) != 0) return false;
  *total = m.total;
  *free_bytes = m.free;
  return true;
}

std::optional<uint64_t> nvml_used_bytes() {
  uint64_t t = 0, f = 0;
  if (!nvml_memory(&t, &f)) return std::nullopt;
  return t - f;
}

Result<std::optional<uint64_t>> parse_stack_limit() {
  const char* v = std::getenv("VLAC_CUDA_STACK_BYTES");
  if (!v || !*v) return std::optional<uint64_t>(kDefaultStackBytes);
  const std::string s(v);
  if (s == "default") return std::optional<uint64_t>();
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || s[0] == '-' || n > (1ull << 20))
    return invalid_argument("VLAC_CUDA_STACK_BYTES must be a byte count per GPU thread (0 to 1048576) or 'default', got '" +
                            s + "'");
  return std::optional<uint64_t>(n);
}

namespace {
std::atomic<uint64_t> g_trimmed{0};
std::atomic<uint64_t> g_on_demand{0}, g_fetches{0}, g_fetched{0};
std::atomic<uint64_t> g_prefetch_launches{0}, g_prefetch_bytes{0};
std::atomic<uint64_t> g_rope_folds{0};
std::atomic<uint64_t> g_early_attentions{0};
std::atomic<uint64_t> g_lane_waits{0};
}  // namespace

void note_lane_input_waits(uint64_t n) { g_lane_waits += n; }

void note_rope_attention_folds(uint64_t n) { g_rope_folds += n; }
void note_attention_early_loads(uint64_t n) { g_early_attentions += n; }

void note_l2_prefetch_plan(uint64_t launches, uint64_t bytes) {
  g_prefetch_launches += launches;
  g_prefetch_bytes += bytes;
}

void note_on_demand_weights(uint64_t bytes) { g_on_demand += bytes; }
void note_on_demand_fetch(uint64_t bytes) {
  ++g_fetches;
  g_fetched += bytes;
}

uint64_t trim_clean_pages() {
  if (!trim_enabled()) return 0;
  const uint64_t n = release_clean_file_pages(1ull << 20);
  g_trimmed += n;
  return n;
}

uint64_t trimmed_clean_pages_total() { return g_trimmed.load(); }

Status cuda_error(const std::string& what, cudaError_t e) {
  return Status(StatusCode::Backend, "cuda: " + what + ": " + cudaGetErrorString(e));
}

Result<void*> device_alloc(uint64_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e == cudaSuccess) {
    tally().add(p, bytes, classify(what, true));
    return p;
  }
  (void)cudaGetLastError();  // an allocation failure is not sticky: clear it
  size_t free_b = 0, total_b = 0;
  (void)cudaMemGetInfo(&free_b, &total_b);
  (void)cudaGetLastError();
  const std::string msg = "cuda: " + what + ": " +
                          (e == cudaErrorMemoryAllocation ? std::string("out of GPU memory") : cudaGetErrorString(e)) +
                          " allocating " + format_bytes(bytes) + " (" + std::to_string(bytes) + " bytes; " +
                          format_bytes(free_b) + " free of " + format_bytes(total_b) + ")";
  return Status(e == cudaErrorMemoryAllocation ? StatusCode::ResourceExhausted : StatusCode::Backend, msg);
}

Result<void*> host_alloc(uint64_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
  if (e == cudaSuccess) {
    tally().add(p, bytes, classify(what, false));
    return p;
  }
  (void)cudaGetLastError();
  return Status(e == cudaErrorMemoryAllocation ? StatusCode::ResourceExhausted : StatusCode::Backend,
                "cuda: " + what + ": " + cudaGetErrorString(e) + " allocating " + format_bytes(bytes) +
                    " of page-locked host memory (" + std::to_string(bytes) + " bytes)");
}

void device_free(void* p) {
  if (!p) return;
  tally().forget(p);
  (void)cudaFree(p);
}

void host_free(void* p) {
  if (!p) return;
  tally().forget(p);
  (void)cudaFreeHost(p);
}

std::vector<std::pair<std::string, int64_t>> memory_tally() {
  Tally& t = tally();
  std::lock_guard<std::mutex> lock(t.mu);
  std::vector<std::pair<std::string, int64_t>> out;
  for (int u = 0; u < kUses; ++u) out.emplace_back(kUseNames[u], t.bytes[u]);
  out.emplace_back("host_pinned.peak", t.pinned_peak);
  return out;
}

Status CudaContext::ensure() {
  if (tried_) return status_;
  tried_ = true;
  status_ = device_status();
  if (!status_.is_ok()) return status_;
  auto fail = [&](Status s) {
    status_ = std::move(s);
    return status_;
  };
  auto stack = parse_stack_limit();
  if (!stack.is_ok()) return fail(stack.status());
  // The context alone first (cudaFree(0) creates it), so its device bytes are measured apart
  // from what follows (NVML, device-wide: another process's allocation in between shows too).
  const std::optional<uint64_t> u0 = nvml_used_bytes();
  std::optional<HostStep> step(std::in_place, "cuda_context");
  cudaError_t e = cudaFree(nullptr);
  step.reset();
  if (e != cudaSuccess) return fail(cuda_error("creating the context", e));
  const std::optional<uint64_t> u1 = nvml_used_bytes();
  context_bytes_ = delta(u0, u1);
  size_t v = 0;
  if (cudaDeviceGetLimit(&v, cudaLimitStackSize) == cudaSuccess) stack_default_ = int64_t(v);
  if (*stack) {
    // See stack_limit_bytes in context.h: the driver's 1 KiB default reserves stack for every
    // resident thread although no vlac kernel needs more than 32 bytes.
    e = cudaDeviceSetLimit(cudaLimitStackSize, size_t(**stack));
    if (e != cudaSuccess) return fail(cuda_error("setting the GPU stack limit (VLAC_CUDA_STACK_BYTES)", e));
  }
  if (cudaDeviceGetLimit(&v, cudaLimitStackSize) == cudaSuccess) stack_set_ = int64_t(v);
  // Read only (reported): nothing of vlac uses device malloc or printf, and the driver sets
  // those buffers up only for modules that do.
  if (cudaDeviceGetLimit(&v, cudaLimitMallocHeapSize) == cudaSuccess) heap_limit_ = int64_t(v);
  if (cudaDeviceGetLimit(&v, cudaLimitPrintfFifoSize) == cudaSuccess) printf_fifo_ = int64_t(v);
  (void)cudaGetLastError();
  const std::optional<uint64_t> u2 = nvml_used_bytes();
  stack_saved_bytes_ = u1 && u2 ? int64_t(*u1) - int64_t(*u2) : -1;
  e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  if (e != cudaSuccess) return fail(cuda_error("creating the stream", e));
  step.emplace("cublaslt_load");
  auto g = GemmRunner::create();
  step.reset();
  if (!g.is_ok()) return fail(g.status());
  gemm_.emplace(std::move(*g));
  handle_bytes_ = delta(u2, nvml_used_bytes());
  auto ws = device_alloc(gemm_->workspace_bytes(), "the cuBLASLt workspace");
  if (!ws.is_ok()) return fail(ws.status());
  workspace_ = *ws;
  lane_streams_[0] = stream_;
  lane_workspaces_[0] = workspace_;
  sms_ = device_sm_count();
  trim_clean_pages();
  return status_;
}

std::vector<std::pair<std::string, int64_t>> CudaContext::breakdown() const {
  size_t now = 0;  // the driver grows the limit at a launch that needs more (context.h)
  if (cudaDeviceGetLimit(&now, cudaLimitStackSize) != cudaSuccess) (void)cudaGetLastError(), now = 0;
  std::vector<std::pair<std::string, int64_t>> out{{"context_bytes", context_bytes_},
          {"stack_limit_now_bytes_per_thread", int64_t(now)},
          {"stack_limit_default_bytes_per_thread", stack_default_},
          {"stack_limit_bytes_per_thread", stack_set_},
          {"stack_limit_saved_bytes", stack_saved_bytes_},
          {"malloc_heap_limit_bytes", heap_limit_},
          {"printf_fifo_limit_bytes", printf_fifo_},
          {"cublaslt_handle_bytes", handle_bytes_},
          {"cublaslt_workspace_bytes", gemm_ ? int64_t(gemm_->workspace_bytes()) : -1},
          {"cublaslt_chosen_workspace_max_bytes", gemm_ ? int64_t(gemm_->chosen_workspace_max()) : -1},
          {"cublaslt_chosen_workspace_max_m64_bytes", gemm_ ? int64_t(gemm_->chosen_workspace_max(64)) : -1},
          // cuBLASLt's plans by kind: each kind planned at all costs host heap once (gemm.h)
          {"cublaslt_plans_bf16_bf16", gemm_ ? int64_t(gemm_->plans_of_kind(DType::BF16, DType::BF16)) : -1},
          {"cublaslt_plans_bf16_f32", gemm_ ? int64_t(gemm_->plans_of_kind(DType::BF16, DType::F32)) : -1},
          {"cublaslt_plans_f32", gemm_ ? int64_t(gemm_->plans_of_kind(DType::F32, DType::F32)) : -1},
          {"cublaslt_plans_tf32", gemm_ ? int64_t(gemm_->plans_of_kind(DType::F32, DType::F32, true)) : -1},
          {"cublaslt_plans_fp8", gemm_ ? int64_t(gemm_->plans_of_kind(DType::F8_E4M3, DType::BF16) +
                                                 gemm_->plans_of_kind(DType::F8_E4M3, DType::F32)) : -1},
          {"gemm_pdl_probed_shapes", gemm_ ? int64_t(gemm_->pdl_probed_shapes()) : -1},
          {"gemm_pdl_safe_shapes", gemm_ ? int64_t(gemm_->pdl_safe_shapes()) : -1},
          {"graph_bytes", graph_bytes_},
          {"host_trimmed_clean_file_bytes", int64_t(trimmed_clean_pages_total())},
          {"on_demand_weight_bytes", int64_t(g_on_demand.load())},
          {"on_demand_fetches", int64_t(g_fetches.load())},
          {"on_demand_fetched_bytes", int64_t(g_fetched.load())},
          {"l2_prefetch_launches_per_run", int64_t(g_prefetch_launches.load())},
          {"l2_prefetch_bytes_per_run", int64_t(g_prefetch_bytes.load())},
          {"rope_attention_folds", int64_t(g_rope_folds.load())},
          {"attention_early_loads", int64_t(g_early_attentions.load())},
          {"lane_input_waits", int64_t(g_lane_waits.load())},
          {"lane_streams", lane_streams_[1] ? 2 : 1}};
  // Host heap and anonymous RSS by loading step (mem/host_steps.h): what grew the host's half.
  for (const HostStepTally& t : host_step_tallies()) {
    out.emplace_back("host_heap_step_" + t.name + "_bytes", t.heap_bytes);
    out.emplace_back("host_anon_step_" + t.name + "_bytes", t.anon_bytes);
  }
  return out;
}

Status CudaContext::use_lane(int lane) {
  VLAC_RETURN_IF_ERROR(ensure());
  if (lane != 0 && lane != 1) return invalid_argument("cuda: no lane " + std::to_string(lane) + " (lanes 0 and 1)");
  if (lane == 1 && !lane_streams_[1]) {
    if (capturing()) return internal_error("cuda: lane 1 is first used inside a recording (a warm-up run makes it)");
    int least = 0, greatest = 0;
    lane_priority_ = env_on("VLAC_LANE_PRIORITY");
    if (lane_priority_ && cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) {
      (void)cudaGetLastError();
      greatest = 0;
    }
    cudaStream_t s = nullptr;
    cudaError_t e = cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, lane_priority_ ? greatest : 0);
    if (e != cudaSuccess) return cuda_error("creating the stream of lane 1", e);
    auto ws = device_alloc(gemm_->workspace_bytes(), "the cuBLASLt workspace of lane 1");
    if (!ws.is_ok()) {
      (void)cudaStreamDestroy(s);
      return ws.status();
    }
    lane_streams_[1] = s;
    lane_workspaces_[1] = *ws;
  }
  lane_ = lane;
  stream_ = lane_streams_[lane];
  workspace_ = lane_workspaces_[lane];
  return Status::ok();
}

Result<int> CudaContext::mark() {
  VLAC_RETURN_IF_ERROR(ensure());
  if (size_t(next_mark_) == events_.size()) {
    // New events only outside a recording: a warm-up run with the same marks comes first.
    if (capturing()) return internal_error("cuda: more marks in a recording than in its warm-up run");
    cudaEvent_t ev = nullptr;
    const cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) return cuda_error("creating a lane mark's event", e);
    events_.push_back(ev);
    mark_lanes_.push_back(0);
  }
  const int id = next_mark_++;
  mark_lanes_[size_t(id)] = lane_;
  const cudaError_t e = cudaEventRecord(events_[size_t(id)], stream_);
  if (e != cudaSuccess) return cuda_error("recording a lane mark", e);
  return id;
}

Status CudaContext::wait_mark(int id) {
  if (id < 0) return Status::ok();
  const cudaEvent_t ev = mark_event(id);
  if (!ev) return internal_error("cuda: waiting for lane mark " + std::to_string(id) + ", which was not recorded");
  if (!mark_crosses(id)) return Status::ok();
  const cudaError_t e = cudaStreamWaitEvent(stream_, ev, 0);
  if (e != cudaSuccess) return cuda_error("waiting for a lane mark", e);
  return Status::ok();
}

bool CudaContext::capturing() const {
  if (!stream_) return false;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream_, &cs) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return cs == cudaStreamCaptureStatusActive;
}

CudaContext::~CudaContext() {
  // The backend lives for the process (the registry never destroys it); freeing at exit after the
  // driver shut down would fail, so nothing is released here on purpose.
}

}  // namespace vlac::cuda
