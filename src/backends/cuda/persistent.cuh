// Device helpers of the persistent kernels (expert_mlp.cu, expert_stream.cu): cp.async copies into
// shared memory, acquire loads, a grid barrier for a grid whose blocks are all resident (a
// cooperative launch), and %globaltimer for the benches' stamps.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace vlac::cuda {

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint4 lds16(const uint16_t* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every block of the grid (all resident) arrives before any leaves. sync[0] counts arrivals and is
// back at zero after each barrier; sync[1] is bumped by the last to arrive.
__device__ __forceinline__ void grid_barrier(unsigned* sync) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = ld_acquire(sync + 1);  // read before arriving: the bump needs this block
    __threadfence();
    if (atomicAdd(sync, 1u) == gridDim.x - 1) {
      atomicExch(sync, 0u);
      __threadfence();
      atomicAdd(sync + 1, 1u);
    } else {
      while (ld_acquire(sync + 1) == gen) __nanosleep(20);
    }
    __threadfence();
  }
  __syncthreads();
}

}  // namespace vlac::cuda
