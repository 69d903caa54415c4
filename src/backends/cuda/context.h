// What every CUDA executable of one backend shares: the device, one stream (so runs, copies and
// recordings are ordered without events), the cuBLASLt runner and its workspace. Created on first
// use; without a GPU every call returns the one error that says why.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "backends/cuda/gemm.h"
#include "core/status.h"

namespace vlac::cuda {

/// "cuda: <what>: <CUDA error string>" (StatusCode::Backend).
Status cuda_error(const std::string& what, cudaError_t e);
/// Device memory, or ResourceExhausted naming `what`, the bytes asked for and the free memory.
/// Live bytes are tallied by use (memory_tally), the use read from `what`'s wording.
Result<void*> device_alloc(uint64_t bytes, const std::string& what);
/// Page-locked host memory (for staging), or ResourceExhausted naming `what` and the bytes.
Result<void*> host_alloc(uint64_t bytes, const std::string& what);
/// cudaFree / cudaFreeHost of what device_alloc / host_alloc gave, keeping the tally true.
void device_free(void* p);
void host_free(void* p);
/// Live bytes from device_alloc and host_alloc by use ("device.weights", "device.arena",
/// "host_pinned.staging"...; every use present, 0 when none), and the peak of the pinned total.
/// For the memory breakdown (a map lookup per allocation: nothing per chunk).
std::vector<std::pair<std::string, int64_t>> memory_tally();

/// Device-wide used bytes (total - free) through NVML, which needs no CUDA context (so a reading
/// before this process makes one is the idle level); nullopt where the driver has no NVML.
std::optional<uint64_t> nvml_used_bytes();
/// NVML's total and free bytes of device 0; false where there is no NVML.
bool nvml_memory(uint64_t* total, uint64_t* free_bytes);

/// The per-thread stack limit ensure() sets (VLAC_CUDA_STACK_BYTES, else kDefaultStackBytes):
/// the driver reserves stack x the device's resident threads (1 KiB default x 2048 x 132 SMs =
/// 264 MiB on an H200) and grows it by itself at a launch that needs more (cuCtxSetLimit), so a
/// small limit costs nothing where kernels need little. vlac's largest frame is 32 bytes (the
/// RoPE kernels' sincosf slow path; nvcc -Xptxas -v, sm_90; every other kernel 0): 32 x 2048 x
/// 132 = 8.25 MiB on the H200 (256 B took 66 MiB). A cuBLASLt kernel that needs more makes the
/// driver grow it once, in the warm-up run before any capture (the breakdown's
/// stack_limit_now_bytes_per_thread shows it: 160 B for the full-size pi0.5 on the H200, the
/// driver's rounding of what the first chunk's kernels need; 41 MiB reserved). nullopt: VLAC_CUDA_STACK_BYTES=default (keep the
/// driver's). A bad value is InvalidArgument naming the variable.
inline constexpr uint64_t kDefaultStackBytes = 32;
Result<std::optional<uint64_t>> parse_stack_limit();

/// Gives this process's clean file pages of at least 1 MiB per mapping back to the page cache
/// (mem/host_memory.h: release_clean_file_pages) unless VLAC_TRIM_CLEAN_PAGES=0; called at the
/// end of the loading steps (context, each weight upload, each graph instantiation), never per
/// chunk. Returns the bytes released by this call; the total is trimmed_clean_pages_total().
uint64_t trim_clean_pages();
uint64_t trimmed_clean_pages_total();

/// On-demand weights (weights.h): bytes left in the package, and reads at memo misses so far
/// (breakdown: on_demand_weight_bytes, on_demand_fetches, on_demand_fetched_bytes).
void note_on_demand_weights(uint64_t bytes);
void note_on_demand_fetch(uint64_t bytes);
/// L2 prefetches planned (l2_prefetch.h), summed over the executables made so far: launches and
/// bytes one run of each issues (breakdown: l2_prefetch_launches_per_run, l2_prefetch_bytes_per_run).
void note_l2_prefetch_plan(uint64_t launches, uint64_t bytes);
/// Attentions that run their RoPE themselves (executor's plan_rope_attention), summed over the
/// executables made so far (breakdown: rope_attention_folds).
void note_rope_attention_folds(uint64_t n);
/// Attentions that load their kept prefix keys before they wait (executor's plan_attention_early),
/// summed over the executables made so far (breakdown: attention_early_loads).
void note_attention_early_loads(uint64_t n);

class CudaContext {
 public:
  /// Creates the stream, the GEMM runner and its workspace on first call; the same status after.
  Status ensure();
  cudaStream_t stream() const { return stream_; }
  GemmRunner& gemm() { return *gemm_; }
  void* workspace() const { return workspace_; }
  int sms() const { return sms_; }
  /// ensure() ran and succeeded.
  bool started() const { return tried_ && status_.is_ok(); }
  /// True while the stream is being captured (RunSequence recording).
  bool capturing() const;
  /// What ensure() measured (NVML deltas, device-wide, -1 where unknown) and set, by name, for
  /// the memory breakdown: context_bytes (creating the context), stack limits (bytes per thread:
  /// the driver's default and what was set) and stack_limit_saved_bytes, cublaslt_handle_bytes,
  /// cublaslt_workspace_bytes; plus the graphs' bytes (add_graph_bytes).
  std::vector<std::pair<std::string, int64_t>> breakdown() const;
  /// Device bytes a CUDA-graph instantiation took (NVML delta; RunSequence adds each).
  void add_graph_bytes(int64_t b) { graph_bytes_ += b; }
  /// Host work a recorded chunk needs before each replay, registered while it is recorded: an
  /// embedding over a host table gathers its rows into the page-locked buffer that the graph
  /// uploads. The RunSequence runs them in order, with the stream idle, before each launch, so
  /// the graph holds no host-function node (the GPU waiting for a host thread mid-chunk).
  void add_replay_hook(std::function<Status()> fn) { hooks_.push_back(std::move(fn)); }
  std::vector<std::function<Status()>> take_replay_hooks() { return std::exchange(hooks_, {}); }
  /// Lanes (BackendRuntime::use_lane): lane 1 is a second stream with a cuBLASLt workspace of
  /// its own (so its GEMMs never share one with lane 0's), both made on its first use.
  /// VLAC_LANE_PRIORITY=1 gives that stream the device's highest priority, and recorded chunks
  /// then keep their nodes' priorities (lane_priority()). stream() and workspace() are the
  /// current lane's.
  Status use_lane(int lane);
  int lane() const { return lane_; }
  bool lane_priority() const { return lane_priority_; }
  /// An event recorded on the current lane's stream (ids from 0 after clear_marks(); the events
  /// are made once and reused). wait_mark: the current stream waits for it; a mark of the
  /// current lane is behind it in stream order already, so that waits for nothing.
  Result<int> mark();
  Status wait_mark(int id);
  void clear_marks() { next_mark_ = 0; }
  /// The event of mark `id` (null for an id not recorded since clear_marks()).
  cudaEvent_t mark_event(int id) const {
    return id >= 0 && id < next_mark_ ? events_[size_t(id)] : nullptr;
  }
  /// Whether wait_mark(id) makes the current lane wait (a mark of the other lane).
  bool mark_crosses(int id) const { return mark_event(id) && mark_lanes_[size_t(id)] != lane_; }
  ~CudaContext();

 private:
  bool tried_ = false;
  Status status_;
  cudaStream_t stream_ = nullptr;
  std::optional<GemmRunner> gemm_;
  void* workspace_ = nullptr;
  int sms_ = 0;
  int64_t context_bytes_ = -1, stack_saved_bytes_ = -1, handle_bytes_ = -1, graph_bytes_ = 0;
  int64_t stack_default_ = -1, stack_set_ = -1, heap_limit_ = -1, printf_fifo_ = -1;
  std::vector<std::function<Status()>> hooks_;
  cudaStream_t lane_streams_[2] = {nullptr, nullptr};
  void* lane_workspaces_[2] = {nullptr, nullptr};
  int lane_ = 0;
  bool lane_priority_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<int> mark_lanes_;  // by mark id: the lane it was recorded on
  int next_mark_ = 0;
};

/// Input waits issued by executables on another lane's marks (CudaExecutable::wait_input),
/// summed over the process (breakdown: lane_input_waits).
void note_lane_input_waits(uint64_t n);

}  // namespace vlac::cuda
