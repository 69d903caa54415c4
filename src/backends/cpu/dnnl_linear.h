// A linear layer y = x·Wᵀ + b through oneDNN's matmul (AVX-512 for fp32, AMX for bf16), with W
// used in place in its stored row-major [N,K] layout: nothing is copied or repacked, so weights
// mapped from a package stay shared with the page cache. The primitive is created once for a
// fixed M; run() takes the caller's scratch (staging for bf16 activations + oneDNN's scratchpad)
// and makes no allocation of its own. No oneDNN header leaks out (pimpl); no exception escapes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace vlac::cpu {

class DnnlLinear {
 public:
  /// Plans y[M,N] = x[M,K] · W[N,K]ᵀ (+ b[N]) with W in `w_dtype` (F32 or BF16).
  /// With BF16 weights the activations are rounded to bf16 on the way in (a bf16×bf16 matmul with
  /// fp32 accumulation and output), which is what lerobot's bf16 mode computes in its Linear layers.
  /// Uses the OpenMP thread count current at creation (set_num_threads).
  static Result<DnnlLinear> create(int64_t m, int64_t k, int64_t n, DType w_dtype, bool has_bias);
  DnnlLinear(DnnlLinear&&) noexcept;
  DnnlLinear& operator=(DnnlLinear&&) noexcept;
  ~DnnlLinear();

  /// Bytes of scratch run() needs (any alignment; run() aligns inside).
  uint64_t scratch_bytes() const;
  /// x [M,K] fp32, w [N,K] in the planned dtype, b [N] fp32 (null iff planned without bias),
  /// y [M,N] fp32. Borrowed pointers.
  Status run(const float* x, const void* w, const float* b, float* y, void* scratch) const;
  /// oneDNN's implementation name, e.g. "brg:avx512_core_amx_bf16".
  const std::string& impl() const;

 private:
  struct Impl;
  explicit DnnlLinear(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vlac::cpu
