// The L2 prefetch kernel (l2_prefetch.h): each thread issues bulk prefetches of 16 KiB pieces.
#include "backends/cuda/common.cuh"
#include "backends/cuda/l2_prefetch.h"

namespace vlac::cuda {
namespace {

constexpr uint32_t kPiece = 16u << 10;

struct Ranges {
  L2Range r[kMaxL2Ranges];
  int n;
};

__global__ void l2_prefetch_kernel(Ranges rs) {
  const uint64_t tid = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t nth = uint64_t(gridDim.x) * blockDim.x;
  for (int i = 0; i < rs.n; ++i) {
    const char* p = static_cast<const char*>(rs.r[i].p);
    const uint64_t bytes = rs.r[i].bytes;
    for (uint64_t off = tid * kPiece; off < bytes; off += nth * kPiece) {
      const uint32_t sz = uint32_t(bytes - off < kPiece ? bytes - off : kPiece);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + off), "r"(sz) : "memory");
#else
      for (uint32_t o = 0; o < sz; o += 128) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p + off + o));
#endif
    }
  }
  // After the prefetches (read-only weights: nothing to wait for), before completing: a kernel
  // that waits on this one (PDL) then also waits on the one before it.
  pdl_wait();
}

}  // namespace

Status l2_prefetch(cudaStream_t stream, const L2Range* ranges, int n, int blocks) {
  if (n < 0 || n > kMaxL2Ranges || blocks < 1) return invalid_argument("l2_prefetch: bad range count or blocks");
  Ranges rs{};
  rs.n = n;
  for (int i = 0; i < n; ++i) {
    // Bulk prefetch wants 16-byte aligned addresses and sizes: a piece outside the range could
    // be another allocation's, so the range is shrunk to its aligned inside.
    const uintptr_t a = reinterpret_cast<uintptr_t>(ranges[i].p);
    const uintptr_t b = (a + 15) & ~uintptr_t(15), e = (a + ranges[i].bytes) & ~uintptr_t(15);
    rs.r[i].p = reinterpret_cast<const void*>(b);
    rs.r[i].bytes = e > b ? uint64_t(e - b) : 0;
  }
  launch(l2_prefetch_kernel, dim3(unsigned(blocks)), dim3(32), 0, stream, rs);
  return launch_status("l2_prefetch");
}

}  // namespace vlac::cuda
