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

/// Any fp32 shape small_f32_gemm does not take: a tiled SIMT GEMM, the same contract. GemmRunner
/// runs it for GemmDesc::own_f32 shapes (SigLIP's patch embedding in engines with the fast vision
/// mode: bf16-all, int8, fp8), so that those packages plan no fp32 GEMM with cuBLASLt and skip the
/// ~99 MB of host heap its fp32 kind costs (H100, session 38: rss+gpu 5.922 -> 5.823 GiB bf16-all,
/// 3.444 -> 3.348 GiB int8; recorded chunk +0.07 ms). VLAC_TILE_F32_GEMM=0 leaves them to cuBLASLt,
/// =1 gives it every fp32 shape (right, but slow for an fp32 package's big GEMMs).
bool tile_f32_gemm_takes(bool own_f32);
Status tile_f32_gemm(cudaStream_t stream, int64_t m, int64_t n, int64_t k, const float* x, const float* w,
                     const float* bias, float* y);

}  // namespace vlac::cuda
