// The action expert's MLP in one cooperative launch (expert_mlp.h). Fragment layout: mma.cuh.
#include "backends/cuda/expert_mlp.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/env.h"
#include "backends/cuda/mma.cuh"
#include "backends/cuda/persistent.cuh"

namespace vlac::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTiles = 4;  // W_gu tiles a thread holds in registers at once (phase A)
constexpr int kPad = 32;   // bf16 elements after each shared row: rows 64 bytes off a 128-byte period, no bank conflicts
constexpr int kItemRows = 64;  // phase B: rows of W_down an item holds (four m16 tiles)

struct Args {
  const uint16_t* x;
  const uint16_t* wgu;
  const uint16_t* wd;
  uint16_t* h;
  float* y;
  float* part;
  unsigned* sync;  // [0] arrivals, [1] generation, [2 + r] phase B flags
  int m, f, splits, hs, ys;
  unsigned long long* stamps;  // ExpertMlpProbe (benches): null in the executor
  int skip;
};

__device__ __forceinline__ void stamp(const Args& a, int i) {
  if (a.stamps == nullptr) return;
  __syncthreads();
  if (threadIdx.x == 0) a.stamps[blockIdx.x * kExpertMlpStamps + i] = globaltimer();
}

// Phase B item i: its 64 rows of W_down (`rg`) and its K part (`p`). Producers (p ≥ 1) come first
// in item order, so a block never waits on a partner before it has published its own parts.
__device__ __forceinline__ void item_of(int i, int groups, int splits, int* rg, int* p) {
  *rg = i % groups;
  *p = splits - 1 - i / groups;
}

// A warp's MMA sums into red[warp][16 rows][8·NT + 1] (c0, c1: row g; c2, c3: row g + 8), to be
// added across warps in a fixed order.
template <int NT>
__device__ __forceinline__ void store_sums(float* red, int warp, int g, int t, const float (&acc)[NT][4]) {
  constexpr int RS = NT * 8 + 1;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    float* r0 = red + (warp * 16 + g) * RS + 8 * j + 2 * t;
    r0[0] = acc[j][0], r0[1] = acc[j][1];
    r0[8 * RS] = acc[j][2], r0[8 * RS + 1] = acc[j][3];
  }
}

// NT: token tiles of 8 (M ≤ 8·NT; token columns past M hold whatever shared memory holds: their
// sums are computed, never stored). KS = D / 512: 64-column steps per warp in phase A.
template <int NT, int KS>
__global__ void __launch_bounds__(kThreads, 1) expert_mlp_kernel(Args a) {
  constexpr int D = KS * kWarps * kMmaStep;
  constexpr int xrow = D + kPad;
  constexpr int RS = NT * 8 + 1;
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int M = a.m, F = a.f, S = a.splits, G = int(gridDim.x);
  const int kd = F / S, wrow = kd + kPad;
  const int groups = D / kItemRows, items = groups * S;
  int nitems = 0;
  for (int i = int(blockIdx.x); i < items; i += G) ++nitems;
  stamp(a, 0);
  // Shared memory: x in phase A, then this item's columns of h in phase B; W_down's rows of this
  // block's items; the warps' sums.
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* ws = xs + NT * 8 * max(xrow, wrow);
  float* red = reinterpret_cast<float*>(ws + nitems * kItemRows * wrow);  // [warp][16][RS]

  const int TA = F / 8;  // W_gu tiles: gate rows 8j..8j+7 and up rows F+8j..F+8j+7
  uint4 wv[kTiles][KS][2][2];
  // Tile i of the round at `base` into registers (i a constant after inlining).
  auto load_tile = [&](int i, int base) {
    const int tile = base + i * G;
    if (tile >= TA) return;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      const int col = (warp + s * kWarps) * kMmaStep + 8 * t;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const uint16_t* p = a.wgu + int64_t(hf * F + 8 * tile + g) * D + col;
        wv[i][s][hf][0] = ld_stream(p);
        wv[i][s][hf][1] = ld_stream(p + 32);
      }
    }
  };
  // Tile i: the MMAs over x, GeGLU on the sums, its 8 columns of h.
  auto compute_tile = [&](int i, int base) {
    const int tile = base + i * G;
    if (tile >= TA || (a.skip & 1)) return;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      const int col = (warp + s * kWarps) * kMmaStep + 8 * t;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint16_t* xp = xs + (8 * j + g) * xrow + col;
        const uint4 xv[2] = {lds16(xp), lds16(xp + 32)};
        mma_step(acc[j], wv[i][s][0], wv[i][s][1], xv);
      }
    }
    store_sums<NT>(red, warp, g, t, acc);
    __syncthreads();
    for (int e = int(threadIdx.x); e < 8 * M; e += kThreads) {
      const int r = e % 8, c = e / 8;
      float gs = 0.f, us = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) gs += red[(w * 16 + r) * RS + c], us += red[(w * 16 + 8 + r) * RS + c];
      // The unfused path's roundings: the GEMM's bf16 store, GeGLU's bf16 gelu, its bf16 store.
      const float gl = round_bf(gelu_tanh_1(round_bf(gs)));
      a.h[int64_t(c) * a.hs + 8 * tile + r] = f2bf(gl * round_bf(us));
    }
    __syncthreads();
  };
  // This block's W_down rows into shared memory (one cp.async group), needed from phase B on.
  auto load_wdown = [&]() {
    const int per_row = kd / 8;
    for (int ii = 0; ii < nitems; ++ii) {
      int rg, p;
      item_of(int(blockIdx.x) + ii * G, groups, S, &rg, &p);
      for (int c = int(threadIdx.x); c < kItemRows * per_row; c += kThreads) {
        const int r = c / per_row, col = (c % per_row) * 8;
        cp_async16(ws + (ii * kItemRows + r) * wrow + col, a.wd + int64_t(kItemRows * rg + r) * F + p * kd + col);
      }
    }
    cp_async_commit();
  };

  // 1. The order of the loads keeps HBM busy from the start while the math waits only for what it
  //    uses: two tiles of W_gu (weights: before the wait for the kernel before this one), then x
  //    (from L2), a third tile, and the fourth and W_down once the first tile's math has begun.
  //    (A thread cannot issue loads past what the memory system has room for, so issuing all the
  //    weights first would hold back the math until nearly all of them had arrived.)
  load_tile(0, int(blockIdx.x));
  load_tile(1, int(blockIdx.x));
  pdl_wait();
  stamp(a, 1);
  for (int c = int(threadIdx.x); c < ((a.skip & 8) ? 0 : M * (D / 8)); c += kThreads) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    cp_async16(xs + r * xrow + col, a.x + int64_t(r) * D + col);
  }
  cp_async_commit();
  load_tile(2, int(blockIdx.x));
  cp_async_wait<0>();
  __syncthreads();
  stamp(a, 2);

  // 2. Phase A: gate|up tiles, GeGLU on the sums, h. Rounds after the first (GPUs with fewer
  //    multiprocessors than 128, or larger F) load their tiles at the round's start.
  bool wdown = false;
  for (int base = int(blockIdx.x); base < TA; base += kTiles * G) {
    if (base != int(blockIdx.x)) {
      load_tile(0, base);
      load_tile(1, base);
      load_tile(2, base);
    }
    compute_tile(0, base);
    load_tile(3, base);
    if (!wdown) load_wdown(), wdown = true;
    compute_tile(1, base);
    compute_tile(2, base);
    compute_tile(3, base);
  }
  if (!wdown) load_wdown();
  __threadfence();
  stamp(a, 3);
  if (!(a.skip & 2)) grid_barrier(a.sync);
  stamp(a, 4);

  // 3. Phase B: an item is 64 rows of W_down over K part p. Its columns of h go into shared memory
  //    (the same for all four row tiles); warps w and w + 4 take row tile w % 4 over the two halves
  //    of the part's steps, and their sums are added in that order. The S − 1 partners' partial
  //    sums are added in part order.
  uint16_t* hsm = xs;
  const int spw = kd / kMmaStep / 2;  // steps per warp
  const int mt = warp & 3, half = warp >> 2;
  constexpr int kPer = kItemRows * 8 * NT / kThreads;
  for (int ii = 0; ii < ((a.skip & 4) ? 0 : nitems); ++ii) {
    int rg, p;
    item_of(int(blockIdx.x) + ii * G, groups, S, &rg, &p);
    for (int c = int(threadIdx.x); c < M * (kd / 8); c += kThreads) {
      const int r = c / (kd / 8), col = (c % (kd / 8)) * 8;
      cp_async16(hsm + r * wrow + col, a.h + int64_t(r) * a.hs + p * kd + col);
    }
    cp_async_commit();
    cp_async_wait<0>();  // h, and W_down on the first item
    __syncthreads();
    const uint16_t* wb = ws + (ii * kItemRows + mt * 16) * wrow;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int s = half * spw; s < (half + 1) * spw; ++s) {
      const int col = s * kMmaStep + 8 * t;
      const uint4 w0[2] = {lds16(wb + g * wrow + col), lds16(wb + g * wrow + col + 32)};
      const uint4 w1[2] = {lds16(wb + (g + 8) * wrow + col), lds16(wb + (g + 8) * wrow + col + 32)};
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint16_t* hp = hsm + (8 * j + g) * wrow + col;
        const uint4 hv[2] = {lds16(hp), lds16(hp + 32)};
        mma_step(acc[j], w0, w1, hv);
      }
    }
    store_sums<NT>(red, warp, g, t, acc);
    __syncthreads();
    float v[kPer];
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int e = int(threadIdx.x) + q * kThreads, r = e % kItemRows, c = e / kItemRows;
      const int w = r / 16, rr = r % 16;
      v[q] = c < M ? red[(w * 16 + rr) * RS + c] + red[((w + 4) * 16 + rr) * RS + c] : 0.f;
    }
    const int row0 = kItemRows * rg;
    if (p > 0) {  // a partner: publish this part, then its flag
#pragma unroll
      for (int q = 0; q < kPer; ++q) {
        const int e = int(threadIdx.x) + q * kThreads, r = e % kItemRows, c = e / kItemRows;
        if (c < M) __stcg(a.part + (int64_t(p - 1) * M + c) * D + row0 + r, v[q]);
      }
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) atomicAdd(a.sync + 2 + rg, 1u);
    } else {
      if (threadIdx.x == 0) {
        while (ld_acquire(a.sync + 2 + rg) < unsigned(S - 1)) __nanosleep(20);
        a.sync[2 + rg] = 0;  // ready for the next launch (stream order)
        __threadfence();
      }
      __syncthreads();
#pragma unroll
      for (int q = 0; q < kPer; ++q) {
        const int e = int(threadIdx.x) + q * kThreads, r = e % kItemRows, c = e / kItemRows;
        if (c >= M) continue;
        float sum = v[q];
        for (int pp = 1; pp < S; ++pp) sum += __ldcg(a.part + (int64_t(pp - 1) * M + c) * D + row0 + r);
        a.y[int64_t(c) * a.ys + row0 + r] = sum;
      }
    }
    // (Both branches synchronise after the last read of red and of h's columns: the next item
    // may reuse them.)
  }
  stamp(a, 5);
}

// The shapes the kernel takes, and the phase B splits of F it takes (whole steps per warp).
bool shape_ok(int64_t m, int64_t d, int64_t f) {
  return m >= 1 && m <= 64 && (d == 512 || d == 1024) && f >= 1024 && f % 1024 == 0 && f <= (int64_t(1) << 20);
}
bool split_ok(int64_t f, int splits) {  // every warp of phase B gets whole steps (two warps share a row tile)
  return (splits == 1 || splits == 2 || splits == 4 || splits == 8 || splits == 16) &&
         f % (int64_t(splits) * kMmaStep * 2) == 0;
}

int nt_for(int64_t m) { return m <= 16 ? 2 : m <= 32 ? 4 : m <= 56 ? 7 : 8; }

// x (phase A) or an item's columns of h (phase B), W_down's rows of the block's items, the warps' sums.
uint64_t smem_bytes(int nt, int64_t d, int64_t f, int splits, int items_per_block) {
  const uint64_t wrow = uint64_t(f / splits + kPad);
  return uint64_t(nt * 8) * std::max(uint64_t(d + kPad), wrow) * 2 + uint64_t(items_per_block) * kItemRows * wrow * 2 +
         uint64_t(kWarps) * 16 * uint64_t(nt * 8 + 1) * 4;
}

using KernelFn = void (*)(Args);

KernelFn pick_kernel(int64_t m, int64_t d) {
  const int nt = nt_for(m);
  if (d == 512)
    return nt == 2 ? expert_mlp_kernel<2, 1> : nt == 4 ? expert_mlp_kernel<4, 1> : nt == 7 ? expert_mlp_kernel<7, 1>
                                                                                          : expert_mlp_kernel<8, 1>;
  return nt == 2 ? expert_mlp_kernel<2, 2> : nt == 4 ? expert_mlp_kernel<4, 2> : nt == 7 ? expert_mlp_kernel<7, 2>
                                                                                        : expert_mlp_kernel<8, 2>;
}

// Opts the kernel into `smem` bytes of dynamic shared memory (once per kernel and size).
cudaError_t allow_smem(KernelFn k, uint64_t smem) { return allow_dynamic_smem(reinterpret_cast<const void*>(k), smem); }

}  // namespace

bool expert_mlp_plan(int64_t m, int64_t d, int64_t f, int sms, int64_t smem_optin, ExpertMlp* out, int want) {
  if (!shape_ok(m, d, f) || sms < 1) return false;
  const int nt = nt_for(m);
  // Phase B: the most K parts whose items (64 rows of W_down each) all run at once, one a block
  // (fewer columns of h per item, so fewer L2 reads); else two items a block.
  for (int ipb : {1, 2})
    for (int splits : {16, 8, 4, 2, 1}) {
      if (!split_ok(f, splits) || (want > 0 && splits != want)) continue;
      const int64_t items = d / kItemRows * splits;
      if ((items + sms - 1) / sms != ipb) continue;
      const uint64_t smem = smem_bytes(nt, d, f, splits, ipb);
      if (smem > uint64_t(smem_optin) || smem > 232448) continue;
      *out = ExpertMlp{m, d, f, sms, splits, ipb, smem};
      return true;
    }
  return false;
}

uint64_t expert_mlp_workspace_bytes(const ExpertMlp& p) { return uint64_t(p.splits - 1) * uint64_t(p.m * p.d) * 4; }

Status expert_mlp(cudaStream_t stream, const ExpertMlp& p, const void* x, const void* w_gu, const void* w_down, void* h,
                  int64_t h_stride, float* y, int64_t y_stride, void* workspace, unsigned* sync,
                  const ExpertMlpProbe* probe) {
  const int64_t items = p.d / kItemRows * p.splits;
  const bool plan_ok = shape_ok(p.m, p.d, p.f) && split_ok(p.f, p.splits) && p.blocks >= 1 && p.items_per_block >= 1 &&
                       p.items_per_block <= 2 && int64_t(p.items_per_block) * p.blocks >= items &&
                       p.smem >= smem_bytes(nt_for(p.m), p.d, p.f, p.splits, p.items_per_block);
  if (!plan_ok)
    return invalid_argument("expert_mlp: a plan from expert_mlp_plan is needed (M " + std::to_string(p.m) + ", D " +
                            std::to_string(p.d) + ", F " + std::to_string(p.f) + ")");
  if (h_stride < p.f || h_stride % 8 != 0 || y_stride < p.d)
    return invalid_argument("expert_mlp: h's row stride must be >= F and a multiple of 8, y's >= D");
  if (sync == nullptr || (p.splits > 1 && workspace == nullptr))
    return invalid_argument("expert_mlp: needs its synchronisation words and, with split K, a workspace");
  for (const void* q : {x, w_gu, w_down, static_cast<const void*>(h)})
    if ((reinterpret_cast<uintptr_t>(q) & 15u) != 0) return invalid_argument("expert_mlp: pointers must be 16-byte aligned");
  const Args a{static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(w_gu), static_cast<const uint16_t*>(w_down),
               static_cast<uint16_t*>(h), y, static_cast<float*>(workspace), sync, int(p.m), int(p.f), p.splits,
               int(h_stride), int(y_stride), probe ? probe->stamps : nullptr, probe ? probe->skip : 0};
  const KernelFn k = pick_kernel(p.m, p.d);
  if (const cudaError_t e = allow_smem(k, p.smem); e != cudaSuccess)
    return Status(StatusCode::Backend,
                  "expert_mlp: " + std::to_string(p.smem) + " bytes of shared memory: " + cudaGetErrorString(e));
  // Co-residency of every block, which the grid barrier needs (VLAC_MLP_COOP=0: a plain launch,
  // resident in practice at one block per multiprocessor: expert_mlp_resident).
  static const bool coop = !env_off("VLAC_MLP_COOP");
  static std::atomic<bool> no_pdl{false};
  launch_persistent(k, dim3(unsigned(p.blocks)), dim3(kThreads), size_t(p.smem), stream, a, coop, no_pdl);
  return launch_status("expert_mlp");
}

bool expert_mlp_resident(const ExpertMlp& p) {
  const KernelFn k = pick_kernel(p.m, p.d);
  int per_sm = 0, dev = 0, sms = 0;
  const bool ok = allow_smem(k, p.smem) == cudaSuccess &&
                  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, size_t(p.smem)) == cudaSuccess &&
                  cudaGetDevice(&dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess;
  if (!ok) (void)cudaGetLastError();
  return ok && int64_t(per_sm) * sms >= p.blocks;
}

}  // namespace vlac::cuda
