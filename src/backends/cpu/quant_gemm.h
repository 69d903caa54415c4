// The CPU's kernels for 8-bit weight matrices (core/quant.h: codes + one fp32 scale per row):
// W8A16, the activations rounded to bf16 as in the bf16 Linear, codes widened exactly to fp32,
// fp32 sums, each output's sum times its row's scale, then the bias. DnnlLinear runs them.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace vlac::cpu {

/// y[0..n) = the n codes of `dt` at c, decoded (unscaled, exact).
void widen_codes(const uint8_t* c, DType dt, float* y, int64_t n);

/// VLAC_CPU_FP8_ACT=1 (read once per process): whether every F8_E4M3 Linear also rounds its
/// activations as the GPU's W8A8 path does, whatever the package says. Off by default: an fp8
/// package is W8A16 unless compiled with e4m3 activations (ExecOptions::fp8_activations).
bool emulate_fp8_activations();
/// x [m, k] (already rounded to bf16) to what an FP8 GEMM reads: per row, the codes of
/// x / (max|row| / 448) decoded and scaled back (a zero row stays zero). In place.
void round_rows_e4m3(float* x, int64_t m, int64_t k);

/// y[N] = (x[K] · decode(W[N,K])ᵀ) ⊙ scales (+ b). x is used as given (already rounded).
/// Rows split over OpenMP threads; each row's sum in a fixed order.
void quant_gemv(const float* x, const uint8_t* codes, const float* scales, DType dt, const float* b, float* y,
                int64_t k, int64_t n);

}  // namespace vlac::cpu
