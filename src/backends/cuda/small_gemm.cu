// fp32 GEMMs with few rows and one small side (small_gemm.h).
#include "backends/cuda/small_gemm.h"

#include "backends/cuda/common.cuh"
#include "backends/cuda/env.h"

namespace vlac::cuda {

namespace {

constexpr int kMaxM = 64, kMaxK = 64, kThreads = 256;
constexpr int kMaxNarrowK = 4096;  // a lane's share of a row: ≤ 32 float4s in registers

// K ≤ 64 (a wide output, action_in_proj): block (x, y) computes columns [32x, +32) of rows
// [8y, +8), one output a thread: thread (n, g) reads W's row n (≤ 16 float4s) and x's row 8y + g
// from shared memory as broadcasts (the warp's 32 threads share g). 224 blocks at 50 × 1024.
template <int KV>  // K / 4, rounded up to a power of two ≤ 16 (the row's float4s)
__global__ void __launch_bounds__(kThreads) wide_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                        const float* __restrict__ bias, float* __restrict__ y, int M,
                                                        int N, int K) {
  __shared__ float4 xs[kThreads / 32][kMaxK / 4];
  pdl_wait();
  const int kv = K / 4, m0 = int(blockIdx.y) * (kThreads / 32);
  const int n = int(blockIdx.x) * 32 + int(threadIdx.x % 32), g = int(threadIdx.x / 32), m = m0 + g;
  const int rows = min(kThreads / 32, M - m0);
  for (int i = int(threadIdx.x); i < rows * kv; i += kThreads)
    xs[i / kv][i % kv] = reinterpret_cast<const float4*>(x + int64_t(m0) * K)[i];
  float4 wr[KV];
#pragma unroll
  for (int j = 0; j < KV; ++j)
    wr[j] = n < N && j < kv ? __ldg(reinterpret_cast<const float4*>(w + int64_t(n) * K) + j) : make_float4(0, 0, 0, 0);
  const float b = bias && n < N ? bias[n] : 0.0f;
  __syncthreads();
  if (n >= N || m >= M) return;
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < KV; ++j) {
    if (j >= kv) break;
    const float4 a = xs[g][j];
    acc = fmaf(a.x, wr[j].x, acc);
    acc = fmaf(a.y, wr[j].y, acc);
    acc = fmaf(a.z, wr[j].z, acc);
    acc = fmaf(a.w, wr[j].w, acc);
  }
  y[int64_t(m) * N + n] = acc + b;
}

// N ≤ 64 (a narrow output, long K: action_out_proj): one warp an output column n and kRows rows
// of x; its lanes hold their share of W's row n (K/128 float4s, all loads in flight at once) and
// stride over the rows' K, then a shuffle sum. Block (x, y): columns [8x, +8), rows [4y, +4):
// 52 blocks of 8 warps at 50 × 32.
constexpr int kRows = 4;
template <int KV>  // float4s a lane holds: K / 128 rounded up to a power of two ≤ 32
__global__ void __launch_bounds__(kThreads) narrow_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                          const float* __restrict__ bias, float* __restrict__ y, int M,
                                                          int N, int K) {
  pdl_wait();
  const int lane = int(threadIdx.x % 32), n = int(blockIdx.x) * (kThreads / 32) + int(threadIdx.x / 32);
  const int m0 = int(blockIdx.y) * kRows, rows = min(kRows, M - m0), kv = K / 4;
  if (n >= N) return;
  const float4* wr = reinterpret_cast<const float4*>(w + int64_t(n) * K);
  float4 wv[KV];
#pragma unroll
  for (int j = 0; j < KV; ++j) wv[j] = lane + 32 * j < kv ? __ldg(wr + lane + 32 * j) : make_float4(0, 0, 0, 0);
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    acc[r] = 0.0f;
    if (r >= rows) continue;
    const float4* xr = reinterpret_cast<const float4*>(x + int64_t(m0 + r) * K);
#pragma unroll
    for (int j = 0; j < KV; ++j) {
      if (lane + 32 * j >= kv) continue;
      const float4 a = __ldg(xr + lane + 32 * j);
      acc[r] = fmaf(a.x, wv[j].x, fmaf(a.y, wv[j].y, fmaf(a.z, wv[j].z, fmaf(a.w, wv[j].w, acc[r]))));
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
    const dim3 grid(unsigned((N + 31) / 32), unsigned((M + kThreads / 32 - 1) / (kThreads / 32)));
    const int kv = K / 4;
    if (kv <= 2) launch(wide_kernel<2>, grid, dim3(kThreads), 0, stream, x, w, bias, y, M, N, K);
    else if (kv <= 4) launch(wide_kernel<4>, grid, dim3(kThreads), 0, stream, x, w, bias, y, M, N, K);
    else if (kv <= 8) launch(wide_kernel<8>, grid, dim3(kThreads), 0, stream, x, w, bias, y, M, N, K);
    else launch(wide_kernel<16>, grid, dim3(kThreads), 0, stream, x, w, bias, y, M, N, K);
    return launch_status("small_f32_gemm (wide)");
  }
  const dim3 grid(unsigned((N + kThreads / 32 - 1) / (kThreads / 32)), unsigned((M + kRows - 1) / kRows));
  const int per_lane = (K / 4 + 31) / 32;
  if (per_lane <= 2) launch(narrow_kernel<2>, grid, dim3(kThreads), 0, stream, x, w, bias, y, M, N, K);
  else if (per_lane <= 8) launch(narrow_kernel<8>, grid, dim3(kThreads), 0, stream, x, w, bias, y, M, N, K);
  else launch(narrow_kernel<32>, grid, dim3(kThreads), 0, stream, x, w, bias, y, M, N, K);
  return launch_status("small_f32_gemm (narrow)");
}

}  // namespace vlac::cuda
