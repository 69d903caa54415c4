// The weight-streaming GEMM for few rows (skinny_gemm.h). Fragment layout: mma.cuh (each load
// instruction of a warp reads whole 32-byte sectors: 64 contiguous bytes of 8 rows).
#include "backends/cuda/skinny_gemm.h"

#include <algorithm>
#include <cmath>

#include "backends/cuda/common.cuh"
#include "backends/cuda/mma.cuh"
#include "core/quant.h"

namespace vlac::cuda {

namespace {

constexpr int kWarps = 4;       // per block, splitting the block's K steps
constexpr int kRows = 32;       // rows of W per block: two m16 tiles per warp
constexpr int kStep = kMmaStep;  // K columns per step
constexpr int kMaxSplits = 16;

__device__ __forceinline__ uint4 ld_x(const uint16_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// 8 codes (8 bytes, read once) widened to 8 bf16 in the 16-byte form a bf16 load gives: exact
// (|int8| ≤ 127 and e4m3 both fit bf16's 8 significant bits).
template <int Q>
__device__ __forceinline__ uint4 ld_codes(const uint8_t* p) {
  uint32_t lo, hi;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(lo), "=r"(hi) : "l"(p));
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t wd = i < 2 ? lo : hi, sh = 16 * (i & 1);
    const uint32_t c0 = (wd >> sh) & 0xFFu, c1 = (wd >> (sh + 8)) & 0xFFu;
    const float f0 = Q == 1 ? float(int8_t(uint8_t(c0))) : e4m3_to_f32(c0);
    const float f1 = Q == 1 ? float(int8_t(uint8_t(c1))) : e4m3_to_f32(c1);
    o[i] = uint32_t(f2bf(f0)) | (uint32_t(f2bf(f1)) << 16);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// One block: rows [32·blockIdx.x, +32) of W, K steps [blockIdx.y·steps_per_split, +steps_per_split).
// NT: token tiles of 8 (M ≤ 8·NT). Ty: the output's (and bias's) element type. Q: W is bf16 (0)
// or 8-bit codes (1: int8, 2: e4m3) whose rows' sums are multiplied by `scales` before the bias.
template <int NT, typename Ty, int Q = 0>
__global__ void __launch_bounds__(kWarps * 32) skinny_gemm_kernel(const uint16_t* __restrict__ x,
                                                                  const void* __restrict__ w_any,
                                                                  const Ty* __restrict__ bias, Ty* __restrict__ y,
                                                                  float* __restrict__ part,
                                                                  unsigned* __restrict__ counters, int M, int N, int K,
                                                                  int steps_per_split, const float* __restrict__ scales) {
  const auto* w = static_cast<const uint16_t*>(w_any);
  const auto* wq = static_cast<const uint8_t*>(w_any);
  __shared__ float red[kWarps][kRows][NT * 8 + 1];
  __shared__ bool last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kRows;
  const int ksteps = K / kStep;
  const int s_end = min(ksteps, int(blockIdx.y + 1) * steps_per_split);
  int s = int(blockIdx.y) * steps_per_split + warp;

  // This thread's rows of W (m tile mt, half h: rows g and g+8) and tokens of x (tile j: token 8j+g,
  // the last token repeated past M: computed, never stored).
  const uint16_t* wp[2][2];
  const uint8_t* qp[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      wp[mt][h] = w + int64_t(row0 + mt * 16 + h * 8 + g) * K + 8 * t;
      qp[mt][h] = wq + int64_t(row0 + mt * 16 + h * 8 + g) * K + 8 * t;
    }
  const uint16_t* xp[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) xp[j] = x + int64_t(min(8 * j + g, M - 1)) * K + 8 * t;

  float acc[2][NT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][j][i] = 0.f;

  uint4 cur[2][2][2];
  auto load_w = [&](uint4 (&r)[2][2][2], int step) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (Q == 0) {
          r[mt][h][0] = ld_stream(wp[mt][h] + step * kStep);
          r[mt][h][1] = ld_stream(wp[mt][h] + step * kStep + 32);
        } else {
          r[mt][h][0] = ld_codes<Q>(qp[mt][h] + step * kStep);
          r[mt][h][1] = ld_codes<Q>(qp[mt][h] + step * kStep + 32);
        }
      }
  };
  if (s < s_end) load_w(cur, s);  // weights: before the wait (no kernel writes them)
  pdl_wait();
  for (; s < s_end; s += kWarps) {
    uint4 nxt[2][2][2];
    const bool more = s + kWarps < s_end;
    if (more) load_w(nxt, s + kWarps);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      uint4 xv[2];
      xv[0] = ld_x(xp[j] + s * kStep);
      xv[1] = ld_x(xp[j] + s * kStep + 32);
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
          mma(acc[mt][j], word(cur[mt][0], 2 * q), word(cur[mt][1], 2 * q), word(cur[mt][0], 2 * q + 1),
              word(cur[mt][1], 2 * q + 1), word(xv, 2 * q), word(xv, 2 * q + 1));
    }
    if (more) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) cur[mt][h][0] = nxt[mt][h][0], cur[mt][h][1] = nxt[mt][h][1];
    }
  }

  // The warps' sums, added in warp order.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int r = mt * 16 + g, c = 8 * j + 2 * t;
      red[warp][r][c] = acc[mt][j][0];
      red[warp][r][c + 1] = acc[mt][j][1];
      red[warp][r + 8][c] = acc[mt][j][2];
      red[warp][r + 8][c + 1] = acc[mt][j][3];
    }
  __syncthreads();
  const int splits = gridDim.y;
  const int elems = kRows * M;  // element e: row e % 32, token e / 32 (a store of 32 consecutive n)
  if (splits > 1) {
    float* mine = part + int64_t(blockIdx.y) * M * N;
    for (int e = threadIdx.x; e < elems; e += blockDim.x) {
      const int r = e % kRows, c = e / kRows;
      float v = red[0][r][c];
#pragma unroll
      for (int wi = 1; wi < kWarps; ++wi) v += red[wi][r][c];
      __stcg(mine + int64_t(c) * N + row0 + r, v);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned done = atomicAdd(&counters[blockIdx.x], 1u);
      last = done == unsigned(splits - 1);
      if (last) counters[blockIdx.x] = 0;  // ready for the next GEMM (stream order)
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int e = threadIdx.x; e < elems; e += blockDim.x) {
      const int r = e % kRows, c = e / kRows;
      const int64_t at = int64_t(c) * N + row0 + r;
      float v = __ldcg(part + at);
      for (int sp = 1; sp < splits; ++sp) v += __ldcg(part + int64_t(sp) * M * N + at);
      if constexpr (Q != 0) v *= scales[row0 + r];
      if (bias) v += ld<Ty>(bias, row0 + r);
      st<Ty>(y, at, v);
    }
    return;
  }
  for (int e = threadIdx.x; e < elems; e += blockDim.x) {
    const int r = e % kRows, c = e / kRows;
    float v = red[0][r][c];
#pragma unroll
    for (int wi = 1; wi < kWarps; ++wi) v += red[wi][r][c];
    if constexpr (Q != 0) v *= scales[row0 + r];
    if (bias) v += ld<Ty>(bias, row0 + r);
    st<Ty>(y, int64_t(c) * N + row0 + r, v);
  }
}

int steps_per_split(int64_t k, int splits) {
  const int64_t ks = k / kStep;
  return int((ks + splits - 1) / splits);
}
int blocks_per_tile(int64_t k, int splits) {
  const int64_t ks = k / kStep;
  const int sps = steps_per_split(k, splits);
  return int((ks + sps - 1) / sps);
}

template <int NT, int Q>
Status launch_nt(cudaStream_t stream, const SkinnyGemm& g, const void* x, const void* w, const void* bias, void* y,
                 void* workspace, unsigned* counters) {
  const dim3 grid(unsigned(g.n / kRows), unsigned(blocks_per_tile(g.k, g.splits)));
  const int sps = steps_per_split(g.k, g.splits);
  const auto* xs = static_cast<const uint16_t*>(x);
  auto* part = static_cast<float*>(workspace);
  // An 8-bit blob (core/quant.h): the row scales follow the codes.
  const float* scales =
      Q ? reinterpret_cast<const float*>(static_cast<const uint8_t*>(w) + quant_scales_offset(g.n, g.k)) : nullptr;
  if (g.out == DType::F32)
    launch(skinny_gemm_kernel<NT, float, Q>, grid, dim3(kWarps * 32), 0, stream, xs, w, static_cast<const float*>(bias),
           static_cast<float*>(y), part, counters, int(g.m), int(g.n), int(g.k), sps, scales);
  else
    launch(skinny_gemm_kernel<NT, uint16_t, Q>, grid, dim3(kWarps * 32), 0, stream, xs, w,
           static_cast<const uint16_t*>(bias), static_cast<uint16_t*>(y), part, counters, int(g.m), int(g.n), int(g.k),
           sps, scales);
  return launch_status("skinny_gemm");
}

template <int Q>
Status launch_q(cudaStream_t stream, const SkinnyGemm& g, const void* x, const void* w, const void* bias, void* y,
                void* workspace, unsigned* counters) {
  switch ((g.m + 7) / 8) {
    case 1: return launch_nt<1, Q>(stream, g, x, w, bias, y, workspace, counters);
    case 2: return launch_nt<2, Q>(stream, g, x, w, bias, y, workspace, counters);
    case 3: return launch_nt<3, Q>(stream, g, x, w, bias, y, workspace, counters);
    case 4: return launch_nt<4, Q>(stream, g, x, w, bias, y, workspace, counters);
    case 5: return launch_nt<5, Q>(stream, g, x, w, bias, y, workspace, counters);
    case 6: return launch_nt<6, Q>(stream, g, x, w, bias, y, workspace, counters);
    case 7: return launch_nt<7, Q>(stream, g, x, w, bias, y, workspace, counters);
    default: return launch_nt<8, Q>(stream, g, x, w, bias, y, workspace, counters);
  }
}

}  // namespace

bool skinny_gemm_fits(int64_t m, int64_t n, int64_t k) {
  return m >= 1 && m <= 64 && n >= kRows && n % kRows == 0 && n / kRows <= kSkinnyCounters && k >= kStep &&
         k % kStep == 0 && k <= (int64_t(1) << 24) && n * k < (int64_t(1) << 40);
}

std::vector<int> skinny_gemm_splits(int64_t n, int64_t k, int sms) {
  const int64_t tiles = n / kRows, ks = k / kStep;
  // At least two steps per warp (a load in flight while the MMAs of the last run).
  const int most = int(std::clamp<int64_t>(ks / (2 * kWarps), 1, kMaxSplits));
  const int want = int(std::clamp<int64_t>(std::llround(2.0 * std::max(sms, 1) / double(tiles)), 1, most));
  std::vector<int> out{want};
  for (int s = 1; s <= most; s *= 2)
    if (blocks_per_tile(k, s) != blocks_per_tile(k, want)) out.push_back(s);
  return out;
}

uint64_t skinny_gemm_workspace_bytes(const SkinnyGemm& g) {
  const int b = g.k >= kStep ? blocks_per_tile(g.k, std::max(g.splits, 1)) : 1;
  return b > 1 ? uint64_t(b) * uint64_t(g.m) * uint64_t(g.n) * 4 : 0;
}

Status skinny_gemm(cudaStream_t stream, const SkinnyGemm& g, const void* x, const void* w, const void* bias, void* y,
                   void* workspace, unsigned* counters) {
  if (!skinny_gemm_fits(g.m, g.n, g.k))
    return invalid_argument("skinny_gemm: " + std::to_string(g.m) + "x" + std::to_string(g.k) + "x" +
                            std::to_string(g.n) + " needs 1 <= M <= 64, N % 32 == 0 and K % 64 == 0");
  if (g.out != DType::F32 && g.out != DType::BF16) return bad_dtype("skinny_gemm");
  if (g.splits < 1 || g.splits > kMaxSplits) return invalid_argument("skinny_gemm: splits must be 1..16");
  if (g.bias != (bias != nullptr)) return invalid_argument("skinny_gemm: a bias is given iff g.bias");
  if (blocks_per_tile(g.k, g.splits) > 1 && (workspace == nullptr || counters == nullptr))
    return invalid_argument("skinny_gemm: split K needs a workspace and tile counters");
  for (const void* p : {x, w, static_cast<const void*>(y), bias})
    if ((reinterpret_cast<uintptr_t>(p) & 15u) != 0) return invalid_argument("skinny_gemm: pointers must be 16-byte aligned");
  switch (g.weights) {
    case DType::BF16: return launch_q<0>(stream, g, x, w, bias, y, workspace, counters);
    case DType::I8: return launch_q<1>(stream, g, x, w, bias, y, workspace, counters);
    case DType::F8_E4M3: return launch_q<2>(stream, g, x, w, bias, y, workspace, counters);
    default: return unsupported(std::string("skinny_gemm: weights ") + dtype_name(g.weights));
  }
}

}  // namespace vlac::cuda
