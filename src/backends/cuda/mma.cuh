// Tensor-core helpers shared by the weight-streaming kernels (skinny_gemm.cu, expert_mlp.cu):
// mma.sync m16n8k16 over bf16 with fp32 sums, and the loads that feed it.
//
// Fragment layout: in each 16-wide K step a thread with lane = 4g + t holds, for A, rows g and
// g+8 at k ∈ {2t, 2t+1, 2t+8, 2t+9}, and for B the same k's at column g. Which physical column a
// logical k is does not matter to the sum as long as A and B agree, so a thread loads 16
// contiguous bytes twice per 64-column step (columns 8t..8t+7 and 32+8t..+7) of its rows of A and
// of B and feeds them to four MMAs: MMA q takes words 2q and 2q+1 of each (`word`).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace vlac::cuda {

constexpr int kMmaStep = 64;  // K columns per step of the layout above

/// 16 bytes of weights, read once: not kept in L1.
__device__ __forceinline__ uint4 ld_stream(const uint16_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

/// Word p (0..7) of the 32 bytes a thread holds for one row and one step.
__device__ __forceinline__ uint32_t word(const uint4 (&v)[2], int p) {
  const uint4& c = v[p >> 2];
  switch (p & 3) {
    case 0: return c.x;
    case 1: return c.y;
    case 2: return c.z;
    default: return c.w;
  }
}

__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  (void)c, (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
#endif
}

/// ldmatrix (no transpose) from shared memory: lanes 8i..8i+7 give the row addresses (16 bytes
/// each) of matrix i; register i gets matrix i's fragment (lane l: row l / 4, columns 2(l % 4)..+1),
/// the MMA's register order for A (rows 0-7 / 8-15 × columns 0-7 / 8-15) and B (stored [n][k]).
__device__ __forceinline__ void ldsm_x4(const uint16_t* p, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  const unsigned s = unsigned(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(s));
}
/// Two matrices: lanes 0..15 give the addresses.
__device__ __forceinline__ void ldsm_x2(const uint16_t* p, uint32_t& r0, uint32_t& r1) {
  const unsigned s = unsigned(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(s));
}

/// The four MMAs of one step: A rows g (a[0]) and g+8 (a[1]), B column g (b).
__device__ __forceinline__ void mma_step(float (&c)[4], const uint4 (&a0)[2], const uint4 (&a1)[2], const uint4 (&b)[2]) {
#pragma unroll
  for (int q = 0; q < 4; ++q)
    mma(c, word(a0, 2 * q), word(a1, 2 * q), word(a0, 2 * q + 1), word(a1, 2 * q + 1), word(b, 2 * q), word(b, 2 * q + 1));
}

}  // namespace vlac::cuda
