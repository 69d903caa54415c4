// VLAC_PROFILE_OPS on the GPU, as the CPU executor has it: GPU time per node from CUDA events
// recorded between the nodes of eager runs (a recorded graph's replay has no per-node events),
// summed per op kind, per engine, (=2) per node name with its layer index as '#' and per GEMM
// shape, and (=3) per layer, printed to stderr at exit. A run is enqueued behind a kernel that
// holds the stream (hold_stream) until the host has launched all of it, so the events time the
// GPU's work, not the host's launches; what remains between kernels is the GPU's own launch
// latency (~1-2 us a node), which a recorded graph's replay also pays, less where PDL overlaps.
#pragma once

#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/status.h"

namespace vlac::cuda {

/// 0 off (default), 1 per op kind and engine, 2 also per node name and GEMM shape, 3 also per
/// layer (engine and name up to its layer index).
int op_profile_level();

/// Events between the nodes of one run on one stream.
class NodeTimer {
 public:
  NodeTimer() = default;
  NodeTimer(const NodeTimer&) = delete;
  NodeTimer& operator=(const NodeTimer&) = delete;
  ~NodeTimer();
  /// Holds the stream (hold_stream, at most 200 ms) and records the start; `nodes` marks follow.
  Status start(cudaStream_t stream, size_t nodes);
  /// Records the end of node i (0-based, in run order).
  Status mark(cudaStream_t stream, size_t i);
  /// Releases the stream, waits for the last mark; element i is node i's GPU time in milliseconds.
  Result<std::vector<float>> finish();

 private:
  std::vector<cudaEvent_t> ev_;
  int* flag_host_ = nullptr;  // host-mapped, pinned
  int* flag_dev_ = nullptr;
  size_t used_ = 0;
};

/// Adds one node's time to the process's profile. `name` is the node's ("lm.3.q_proj": kept as
/// "lm.#.q_proj"), `shape` e.g. "linear 968x2048x2560" or "" (level 2 only).
void op_profile_add(const char* op, const std::string& engine, const std::string& name, const std::string& shape,
                    double ms);

/// "lm.3.q_proj" -> "lm.#.q_proj": every dot-separated part made only of digits becomes '#'.
std::string layer_pattern(const std::string& name);
/// "lm.3.q_proj" -> "lm.3": the name up to its first numeric part ("(outside layers)" if none).
std::string layer_of(const std::string& name);

}  // namespace vlac::cuda
