// Device helpers of the persistent kernels (expert_mlp.cu, expert_stream.cu): cp.async copies into
// shared memory, Hopper's bulk copies completing on an mbarrier, acquire loads, a grid barrier for
// a grid whose blocks are all resident (a cooperative launch), and %globaltimer for the benches'
// stamps.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>

#include <cuda_runtime.h>

#include "backends/cuda/common.cuh"

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
// Bulk copies (sm_90+): `bytes` (a multiple of 16, 16-byte aligned ends) from global memory into
// shared memory by the copy engine, counted on an mbarrier that expects them (mbar_expect_tx).
__device__ __forceinline__ unsigned smem_u32(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#else
  (void)bar, (void)count;
#endif
}
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#else
  (void)bar, (void)bytes;
#endif
}
__device__ __forceinline__ void bulk_copy(void* smem, const void* gmem, unsigned bytes, unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
#else
  (void)smem, (void)gmem, (void)bytes, (void)bar;
#endif
}
// Until the mbarrier's phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
#else
  (void)bar, (void)parity;
#endif
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

// A grid barrier on one 64-bit arrival counter that only grows: it is a multiple of G between
// launches, so a block reads the launch's base at its start (at most G − 1 others can have
// arrived at the first barrier by then) and barrier k of the launch waits until the counter
// reaches base + k·G. One fire-and-forget release add and acquire polls a barrier: no reset and
// no generation bump, each of which cost a round trip in grid_barrier (session 25: 3.3 µs a
// barrier there).
__device__ __forceinline__ unsigned long long grid_counter_base(const unsigned long long* counter) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(counter) : "memory");
  return v / gridDim.x * gridDim.x;
}
__device__ __forceinline__ void grid_barrier_counted(unsigned long long* counter, unsigned long long target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;\n" ::"l"(counter) : "memory");
    unsigned long long v;
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(counter) : "memory");
    } while (v < target);
  }
  __syncthreads();
}

// Opts `kernel` into `smem` bytes of dynamic shared memory (once per kernel and size; one GPU per
// process).
inline cudaError_t allow_dynamic_smem(const void* kernel, uint64_t smem) {
  static std::mutex mu;
  static std::map<const void*, uint64_t> allowed;
  std::lock_guard<std::mutex> lock(mu);
  uint64_t& have = allowed[kernel];
  if (smem <= have) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e == cudaSuccess) have = smem;
  return e;
}

// Launches a persistent kernel: cooperative (every block resident, which the grid barriers need)
// unless `cooperative` is false, and with programmatic dependent launch where enabled. Should a
// driver refuse the two together, this launch and every later one of the call site (its
// `no_pdl` flag) go without PDL (griddepcontrol.wait is then a no-op). Errors stay for
// launch_status.
template <typename Args>
inline void launch_persistent(void (*kernel)(Args), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                              const Args& a, bool cooperative, std::atomic<bool>& no_pdl) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  if (cooperative) {
    attrs[n].id = cudaLaunchAttributeCooperative;
    attrs[n++].val.cooperative = 1;
  }
  const bool pdl = pdl_enabled() && !no_pdl.load();
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = unsigned(n);
  if (cudaLaunchKernelEx(&cfg, kernel, a) != cudaSuccess && pdl) {
    (void)cudaGetLastError();
    no_pdl = true;
    cfg.numAttrs = unsigned(n - 1);  // PDL is the last attribute
    (void)cudaLaunchKernelEx(&cfg, kernel, a);
  }
}

}  // namespace vlac::cuda
