// The shared CUDA context of a backend (context.h) and the allocation helpers whose errors name
// what was asked for.
#include "backends/cuda/context.h"

#include "backends/cuda/kernels.h"
#include "core/bytes.h"

namespace vlac::cuda {

Status cuda_error(const std::string& what, cudaError_t e) {
  return Status(StatusCode::Backend, "cuda: " + what + ": " + cudaGetErrorString(e));
}

Result<void*> device_alloc(uint64_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e == cudaSuccess) return p;
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
  if (e == cudaSuccess) return p;
  (void)cudaGetLastError();
  return Status(e == cudaErrorMemoryAllocation ? StatusCode::ResourceExhausted : StatusCode::Backend,
                "cuda: " + what + ": " + cudaGetErrorString(e) + " allocating " + format_bytes(bytes) +
                    " of page-locked host memory (" + std::to_string(bytes) + " bytes)");
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
  cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  if (e != cudaSuccess) return fail(cuda_error("creating the stream", e));
  auto g = GemmRunner::create();
  if (!g.is_ok()) return fail(g.status());
  gemm_.emplace(std::move(*g));
  auto ws = device_alloc(gemm_->workspace_bytes(), "the cuBLASLt workspace");
  if (!ws.is_ok()) return fail(ws.status());
  workspace_ = *ws;
  sms_ = device_sm_count();
  return status_;
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
