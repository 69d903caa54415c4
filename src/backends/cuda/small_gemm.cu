// fp32 GEMMs with few rows and one small side (small_gemm.h).
#include "backends/cuda/small_gemm.h"

#include "backends/cuda/common.cuh"
#include "backends/cuda/env.h"

namespace vlac::cuda {

namespace {

constexpr int kMaxM = 64, kMaxK = 64, kThreads = 256;
constexpr int kMaxNarrowK = 4096;  // x's rows in shared memory: 4 × 4096 floats = 64 KB

// K ≤ 64 (a wide output): thread (n, g) holds W's row n in registers and computes rows g, g + 8, ...
// of its column; x sits in shared memory, read as broadcasts (the warp's 32 threads share g).
template <int KV>  // K / 4, rounded up to a power of two ≤ 16 (the row's float4s)
__global__ void __launch_bounds__(kThreads) wide_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                        const float* __restrict__ bias, float* __restrict__ y, int M,
                                                        int N, int K) {
  __shared__ float4 xs[kMaxM][kMaxK / 4];
  pdl_wait();
  const int kv = K / 4;
  const int n = int(blockIdx.x) * 32 + int(threadIdx.x % 32), g = int(threadIdx.x / 32);
  for (int i = int(threadIdx.x); i < M * kv; i += kThreads)
    xs[i / kv][i % kv] = reinterpret_cast<const float4*>(x)[i];
  float4 wr[KV];
#pragma unroll
  for (int j = 0; j < KV; ++j)
    wr[j] = n < N && j < kv ? __ldg(reinterpret_cast<const float4*>(w + int64_t(n) * K) + j) : make_float4(0, 0, 0, 0);
  const float b = bias && n < N ? bias[n] : 0.0f;
  __syncthreads();
  if (n >= N) return;
  for (int m = g; m < M; m += kThreads / 32) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < KV; ++j) {
      if (j >= kv) break;
      const float4 a = xs[m][j];
      acc = fmaf(a.x, wr[j].x, acc);
      acc = fmaf(a.y, wr[j].y, acc);
      acc = fmaf(a.z, wr[j].z, acc);
      acc = fmaf(a.w, wr[j].w, acc);
    }
    y[int64_t(m) * N + n] = acc + b;
  }
}

// N ≤ 64 (a narrow output, long K): a block owns kRows rows of x (in shared memory); each warp
// takes outputs n = warp, warp + 8, ...: its lanes stride over K in float4s, then a shuffle sum.
constexpr int kRows = 4;
__global__ void __launch_bounds__(kThreads) narrow_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                          const float* __restrict__ bias, float* __restrict__ y, int M,
                                                          int N, int K) {
  extern __shared__ float4 xr[];  // [kRows][K / 4]
  pdl_wait();
  const int kv = K / 4, m0 = int(blockIdx.x) * kRows, rows = min(kRows, M - m0);
  for (int i = int(threadIdx.x); i < rows * kv; i += kThreads)
    xr[i] = reinterpret_cast<const float4*>(x + int64_t(m0) * K)[i];
  __syncthreads();
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  for (int n = warp; n < N; n += kThreads / 32) {
    const float4* wr = reinterpret_cast<const float4*>(w + int64_t(n) * K);
    float acc[kRows] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = lane; j < kv; j += 32) {
      const float4 b = __ldg(wr + j);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
        const float4 a = xr[r * kv + j];
        acc[r] = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, acc[r]))));
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (lane == 0) {
      const float b = bias ? bias[n] : 0.0f;
      for (int r = 0; r < rows; ++r) y[int64_t(m0 + r) * N + n] = acc[r] + b;
    }
  }
}

}  // namespace

bool small_f32_gemm_fits(int64_t m, int64_t n, int64_t k) {
  return m >= 1 && m <= kMaxM && n >= 1 && k >= 4 && k % 4 == 0 && (k <= kMaxK || (n <= 64 && k <= kMaxNarrowK));
}

bool small_f32_gemm_enabled() {
  static const bool on = !env_off("VLAC_SMALL_F32_GEMM");
  return on;
}

Status small_f32_gemm(cudaStream_t stream, int64_t m, int64_t n, int64_t k, const float* x, const float* w,
                      const float* bias, float* y) {
  if (!small_f32_gemm_fits(m, n, k))
    return invalid_argument("small_f32_gemm: " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) +
                            " is not a shape it takes");
  const int M = int(m), N = int(n), K = int(k);
  if (k <= kMaxK) {
    const dim3 grid(unsigned((N + 31) / 32));
    const int kv = K / 4;
    if (kv <= 2) launch(wide_kernel<2>, grid, dim3(kThreads), 0, stream, x, w, bias, y, M, N, K);
    else if (kv <= 4) launch(wide_kernel<4>, grid, dim3(kThreads), 0, stream, x, w, bias, y, M, N, K);
    else if (kv <= 8) launch(wide_kernel<8>, grid, dim3(kThreads), 0, stream, x, w, bias, y, M, N, K);
    else launch(wide_kernel<16>, grid, dim3(kThreads), 0, stream, x, w, bias, y, M, N, K);
    return launch_status("small_f32_gemm (wide)");
  }
  const size_t smem = size_t(kRows) * size_t(K) * sizeof(float);
  static const cudaError_t attr = cudaFuncSetAttribute(narrow_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       int(size_t(kRows) * kMaxNarrowK * sizeof(float)));
  if (attr != cudaSuccess) {
    (void)cudaGetLastError();
    return Status(StatusCode::Backend, std::string("small_f32_gemm: shared memory: ") + cudaGetErrorString(attr));
  }
  launch(narrow_kernel, dim3(unsigned((M + kRows - 1) / kRows)), dim3(kThreads), smem, stream, x, w, bias, y, M, N, K);
  return launch_status("small_f32_gemm (narrow)");
}

}  // namespace vlac::cuda
