// What every CUDA executable of one backend shares: the device, one stream (so runs, copies and
// recordings are ordered without events), the cuBLASLt runner and its workspace. Created on first
// use; without a GPU every call returns the one error that says why.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <cuda_runtime_api.h>

#include "backends/cuda/gemm.h"
#include "core/status.h"

namespace vlac::cuda {

/// "cuda: <what>: <CUDA error string>" (StatusCode::Backend).
Status cuda_error(const std::string& what, cudaError_t e);
/// Device memory, or ResourceExhausted naming `what`, the bytes asked for and the free memory.
Result<void*> device_alloc(uint64_t bytes, const std::string& what);
/// Page-locked host memory (for staging), or ResourceExhausted naming `what` and the bytes.
Result<void*> host_alloc(uint64_t bytes, const std::string& what);

class CudaContext {
 public:
  /// Creates the stream, the GEMM runner and its workspace on first call; the same status after.
  Status ensure();
  cudaStream_t stream() const { return stream_; }
  GemmRunner& gemm() { return *gemm_; }
  void* workspace() const { return workspace_; }
  int sms() const { return sms_; }
  /// True while the stream is being captured (RunSequence recording).
  bool capturing() const;
  ~CudaContext();

 private:
  bool tried_ = false;
  Status status_;
  cudaStream_t stream_ = nullptr;
  std::optional<GemmRunner> gemm_;
  void* workspace_ = nullptr;
  int sms_ = 0;
};

}  // namespace vlac::cuda
