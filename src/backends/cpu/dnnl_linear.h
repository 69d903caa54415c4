// A linear layer y = x·Wᵀ + b through oneDNN's matmul with W reordered once into the layout the
// primitive prefers (AMX/AVX-512 blocked). All memory is allocated in create(); run() allocates
// nothing. No oneDNN header leaks out of this file (pimpl) and no oneDNN exception escapes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace vlac::cpu {

class DnnlLinear {
 public:
  /// Plans y[M,N] = x[M,K] · W[N,K]ᵀ (+ b[N]) for a fixed M.
  /// @param w  W in `w_dtype` (F32 or BF16), row-major [N,K]; read during create() only.
  /// @param b  bias [N] fp32 or null; copied.
  /// With BF16 weights the activations are rounded to bf16 on the way in (oneDNN's bf16 matmul;
  /// fp32 accumulation and output), as lerobot's bf16 mode does in the Gemma layers.
  /// @param n_threads  OpenMP threads for this call site's runs (0: leave the default).
  static Result<DnnlLinear> create(int64_t m, int64_t k, int64_t n, DType w_dtype, const void* w,
                                   const float* b, int n_threads = 0);
  DnnlLinear(DnnlLinear&&) noexcept;
  DnnlLinear& operator=(DnnlLinear&&) noexcept;
  ~DnnlLinear();

  /// x [M,K] fp32 -> y [M,N] fp32. Borrowed pointers; no allocation.
  Status run(const float* x, float* y);
  /// Bytes held: packed weights + bias + bf16 staging + scratchpad.
  uint64_t resident_bytes() const;
  /// oneDNN's implementation name, e.g. "brg:avx512_core_amx_bf16".
  const std::string& impl() const;

 private:
  struct Impl;
  explicit DnnlLinear(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vlac::cpu
