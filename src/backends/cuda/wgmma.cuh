// Hopper's warpgroup MMA (wgmma, sm_90a only): both operands read from shared memory through
// descriptors, so one instruction does a 64 × N × 16 product with no fragment loads. Used where
// mma.sync's fragment loads made a kernel instruction-bound (expert_stream.cu, session 26).
//
// Operands are K-major with the 128-byte swizzle: a K slab of 64 bf16 columns holds its rows 128
// bytes apart, the 16-byte unit j of row r stored at unit j ^ (r % 8), and every slab starts on a
// 1024-byte boundary. A descriptor gives the slab's start (plus 32 bytes per 16-column step inside
// it) and the 1024 bytes between groups of 8 rows.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace vlac::cuda {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VLAC_WGMMA 1
#endif

/// Element offset of (row r, column c) in a swizzled K-major tile of `rows` rows (c < 64·slabs).
__device__ __forceinline__ int sw128_at(int rows, int r, int c) {
  return (c >> 6) * (rows * 64) + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7);
}

__device__ __forceinline__ uint64_t sw128_desc(const void* smem) {
  const uint32_t a = uint32_t(__cvta_generic_to_shared(smem));
  return uint64_t((a & 0x3FFFF) >> 4) | (uint64_t(1) << 16) /* LBO: unused with the swizzle */ |
         (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62) /* 128-byte swizzle */;
}

/// Makes this thread's generic-proxy writes to shared memory (stores, cp.async once waited for)
/// visible to the async proxy that wgmma reads through; then a barrier.
__device__ __forceinline__ void fence_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef VLAC_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef VLAC_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef VLAC_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// wgmma_reg_fence (below) keeps the compiler from moving accesses of an accumulator across the
// asynchronous MMA.

/// d[64 × 64] += A[64 × 16] · B[16 × 64] (A: M rows, B: N rows, both K-major, bf16; fp32 sums).
/// Thread (warp w of the group, lane l) holds rows 16w + l/4 (+8 for d[4j+2], d[4j+3]) at
/// columns 8j + 2(l % 4) (+1 for odd indices), j = 0..7.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t da, uint64_t db) {
#ifdef VLAC_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, "
      "1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(1));
#else
  (void)d, (void)da, (void)db;
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_reg_fence(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

}  // namespace vlac::cuda
