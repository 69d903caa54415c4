// fp32 GEMMs with few rows and one small side (small_gemm.h).
#include "backends/cuda/small_gemm.h"

#include "backends/cuda/common.cuh"
#include "backends/cuda/env.h"

namespace vlac::cuda {

namespace {

constexpr int kMaxM = 64, kMaxK = 64, kThreads = 256;
constexpr int kMaxNarrowK = 4096;  // a lane's share of a row: ≤ 32 float4s in registers
constexpr int kRows = 4;           // rows of x a narrow block computes (W's rows are read once per kRows)

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
// 52 blocks of 8 warps at 50 × 32. With M ≤ kRows any N is one pass over W (a GEMV: the time
// MLP's 1 × 1024 → 1024, 128 blocks).
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

// Any other fp32 shape (SigLIP's patch embedding, 768 × 588 → 1152 with 3 cameras): 64 × 64
// output tiles over K steps of 16, both operands through shared memory K-major, 256 threads of
// 4 × 4 outputs each (rows ty + 16i, columns 4tx..4tx+3: float4 reads of W's tile, broadcasts of
// x's). A plain SIMT GEMM, slower than cuBLASLt's; what it saves is cuBLASLt's fp32 kind.
constexpr int kTile = 64, kTileK = 16;
__global__ void __launch_bounds__(kThreads) tile_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                        const float* __restrict__ bias, float* __restrict__ y, int M,
                                                        int N, int K) {
  // Rows padded by 4 floats: the stores (16 threads along K, one tile row) fall on 2 banks'
  // worth of conflicts instead of 16, and W's float4 reads stay 16-byte aligned.
  __shared__ __align__(16) float xs[kTileK][kTile + 4];
  __shared__ __align__(16) float ws[kTileK][kTile + 4];
  pdl_wait();
  const int tx = int(threadIdx.x % 16), ty = int(threadIdx.x / 16);
  const int m0 = int(blockIdx.y) * kTile, n0 = int(blockIdx.x) * kTile;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += kTileK) {
    for (int i = int(threadIdx.x); i < kTile * kTileK; i += kThreads) {
      const int r = i / kTileK, c = i % kTileK, k = k0 + c;
      xs[c][r] = m0 + r < M && k < K ? __ldg(x + int64_t(m0 + r) * K + k) : 0.0f;
      ws[c][r] = n0 + r < N && k < K ? __ldg(w + int64_t(n0 + r) * K + k) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kTileK; ++c) {
      const float4 b = *reinterpret_cast<const float4*>(&ws[c][4 * tx]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float a = xs[c][ty + 16 * i];
        acc[i][0] = fmaf(a, b.x, acc[i][0]);
        acc[i][1] = fmaf(a, b.y, acc[i][1]);
        acc[i][2] = fmaf(a, b.z, acc[i][2]);
        acc[i][3] = fmaf(a, b.w, acc[i][3]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + ty + 16 * i;
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + 4 * tx + j;
      if (n < N) y[int64_t(m) * N + n] = acc[i][j] + (bias ? bias[n] : 0.0f);
    }
  }
}

}  // namespace

bool tile_f32_gemm_takes(bool own_f32) {
  static const bool all = env_on("VLAC_TILE_F32_GEMM"), none = env_off("VLAC_TILE_F32_GEMM");
  return all || (own_f32 && !none);
}

Status tile_f32_gemm(cudaStream_t stream, int64_t m, int64_t n, int64_t k, const float* x, const float* w,
                     const float* bias, float* y) {
  if (m < 1 || n < 1 || k < 1 || m > (int64_t(1) << 30) / kTile || n > (int64_t(1) << 30) / kTile || k > (1 << 30))
    return invalid_argument("tile_f32_gemm: " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) +
                            " is not a shape it takes");
  const dim3 grid(unsigned((n + kTile - 1) / kTile), unsigned((m + kTile - 1) / kTile));
  launch(tile_kernel, grid, dim3(kThreads), 0, stream, x, w, bias, y, int(m), int(n), int(k));
  return launch_status("tile_f32_gemm");
}

bool small_f32_gemm_fits(int64_t m, int64_t n, int64_t k) {
  return m >= 1 && m <= kMaxM && n >= 1 && k >= 4 && k % 4 == 0 &&
         (k <= kMaxK || ((n <= 64 || m <= kRows) && k <= kMaxNarrowK));
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
