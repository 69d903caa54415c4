// y[M,N] = x[M,K] · W[N,K]ᵀ with bf16 weights read in place and widened per panel: the bf16
// Linear where oneDNN has no bf16 matmul (AVX2). fp32 products (exact for bf16 operands) and fp32
// accumulation, the activations rounded to bf16 first: the rounding points of a bf16 matmul.
// Never allocates: the caller stages x in the scratch bf16_gemm_x_bytes() asks for.
#pragma once

#include <cstdint>

namespace vlac::cpu {

/// Whether the register-blocked kernel runs on the active ISA (AVX2+FMA and above on x86-64).
/// Elsewhere (the scalar cap, arm64) callers keep the widen-a-block + sgemm path.
bool bf16_gemm_available();

/// Bytes of the staged activations for x[M,K] (bf16_gemm_stage).
uint64_t bf16_gemm_x_bytes(int64_t m, int64_t k);

/// Stages x for bf16_gemm_nk: each value rounded to bf16 (nearest even, kept in fp32) and laid
/// out as the microkernel reads it (per block of K, tiles of up to 6 rows as [k][row]). Threaded.
/// From fp32 or from bf16 values.
void bf16_gemm_stage(const float* x, float* xs, int64_t m, int64_t k);
void bf16_gemm_stage_bf16(const uint16_t* x, float* xs, int64_t m, int64_t k);

/// y[M,N] = xs · W[N,K]ᵀ (+ b[N], null for none), W bf16 row-major [N,K], xs from
/// bf16_gemm_stage. Each 16-row panel of W is widened once per block of K into a small fp32
/// panel on the calling thread's stack (16 KiB) and reused for all M rows. Panels are split over
/// `threads` OpenMP threads; every output is summed in the same order whatever the thread count
/// (per K block in k order, blocks in order, then the bias). Requires bf16_gemm_available().
void bf16_gemm_nk(const float* xs, const uint16_t* w, const float* b, float* y, int64_t m, int64_t k, int64_t n,
                  int threads);

}  // namespace vlac::cpu
