// The CPU's kernels for 8-bit weight matrices (core/quant.h: codes + one fp32 scale per row):
// W8A16, the activations rounded to bf16 as in the bf16 Linear, codes widened exactly to fp32,
// fp32 sums, each output's sum times its row's scale, then the bias. DnnlLinear runs them.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace vlac::cpu {

/// y[0..n) = the n codes of `dt` at c, decoded (unscaled, exact).
void widen_codes(const uint8_t* c, DType dt, float* y, int64_t n);

/// y[N] = (x[K] · decode(W[N,K])ᵀ) ⊙ scales (+ b). x is used as given (already rounded).
/// Rows split over OpenMP threads; each row's sum in a fixed order.
void quant_gemv(const float* x, const uint8_t* codes, const float* scales, DType dt, const float* b, float* y,
                int64_t k, int64_t n);

}  // namespace vlac::cpu
