// fp32 GEMMs with few rows and one small side: y[M,N] = x[M,K]·W[N,K]ᵀ (+ bias[N]), M ≤ 64 and
// K ≤ 64 or N ≤ 64. pi0.5's action projections are these (50 × 32 → 1024 and 50 × 1024 → 32, once
// each per denoising step), and cuBLASLt's fp32 kernels took 8–9 µs each for them on the H200
// (session 16's profile) for 128 KB of weights; these take part in programmatic dependent launch,
// which cuBLASLt's kernels do not. fp32 FMA throughout, in another order than cuBLASLt's.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/status.h"

namespace vlac::cuda {

/// Whether small_f32_gemm takes this shape: 1 ≤ m ≤ 64, k % 4 == 0, and k ≤ 64, or n ≤ 64 with
/// k ≤ 4096.
bool small_f32_gemm_fits(int64_t m, int64_t n, int64_t k);
/// VLAC_SMALL_F32_GEMM=0 leaves these shapes to cuBLASLt (for A/B); on by default.
bool small_f32_gemm_enabled();
/// Enqueues y = x·Wᵀ (+ bias). x [m,k], w [n,k], bias [n] or null, y [m,n]: fp32, rows packed,
/// device pointers 16-byte aligned.
Status small_f32_gemm(cudaStream_t stream, int64_t m, int64_t n, int64_t k, const float* x, const float* w,
                      const float* bias, float* y);

}  // namespace vlac::cuda
