// fp32 GEMMs with few rows and one small side: y[M,N] = x[M,K]·W[N,K]ᵀ (+ bias[N]), M ≤ 64 and
// K ≤ 64 or N ≤ 64, or M ≤ 4 (a GEMV). pi0.5's action projections are these (50 × 32 → 1024 and
// 50 × 1024 → 32, once each per denoising step), and cuBLASLt's fp32 kernels took 8–9 µs each for
// them on the H200 (session 16's profile) for 128 KB of weights; these take part in programmatic
// dependent launch, which cuBLASLt's kernels do not. The time MLP (1 × 1024 → 1024, twice) was
// the last fp32 GEMM on cuBLASLt, and cuBLASLt builds ~99 MB of host heap the first time it plans
// any fp32 GEMM (session 37, bench/cublaslt_host_probe): as a GEMV here, no process plans one.
// fp32 FMA throughout, in another order than cuBLASLt's.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/status.h"

namespace vlac::cuda {

/// Whether small_f32_gemm takes this shape: 1 ≤ m ≤ 64, k % 4 == 0, and k ≤ 64, or k ≤ 4096 with
/// n ≤ 64 or m ≤ 4.
bool small_f32_gemm_fits(int64_t m, int64_t n, int64_t k);
/// VLAC_SMALL_F32_GEMM=0 leaves these shapes to cuBLASLt (for A/B); on by default.
bool small_f32_gemm_enabled();
/// Enqueues y = x·Wᵀ (+ bias). x [m,k], w [n,k], bias [n] or null, y [m,n]: fp32, rows packed,
/// device pointers 16-byte aligned.
Status small_f32_gemm(cudaStream_t stream, int64_t m, int64_t n, int64_t k, const float* x, const float* w,
                      const float* bias, float* y);

/// Any fp32 shape small_f32_gemm does not take (SigLIP's patch embedding): a tiled SIMT GEMM, the
/// same contract. Opt-in with VLAC_TILE_F32_GEMM=1 (GemmRunner then plans no fp32 GEMM with
/// cuBLASLt at all, saving the host heap its fp32 kind costs) until measured on a GPU. Meant for
/// the packages with the fast vision mode (bf16-all, int8, fp8), where the patch embedding is the
/// only such shape; in an fp32 or bf16 package every fp32 GEMM would take it (right, but slow).
bool tile_f32_gemm_enabled();
Status tile_f32_gemm(cudaStream_t stream, int64_t m, int64_t n, int64_t k, const float* x, const float* w,
                     const float* bias, float* y);

}  // namespace vlac::cuda
