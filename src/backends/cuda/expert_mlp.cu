// The action expert's MLP in one cooperative launch (expert_mlp.h). Fragment layout: mma.cuh.
#include "backends/cuda/expert_mlp.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/env.h"
#include "backends/cuda/mma.cuh"

namespace vlac::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTiles = 4;  // W_gu tiles a thread holds in registers at once (phase A)
constexpr int kPad = 32;   // bf16 elements after each shared row: rows 64 bytes off a 128-byte period, no bank conflicts
constexpr int kHSteps = 2; // phase B: steps of h held in registers at once

struct Args {
  const uint16_t* x;
  const uint16_t* wgu;
  const uint16_t* wd;
  uint16_t* h;
  float* y;
  float* part;
  unsigned* sync;  // [0] arrivals, [1] generation, [2 + r] phase B flags
  int m, f, splits, hs, ys;
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}
__device__ __forceinline__ uint4 lds16(const uint16_t* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint4 ldcg16(const uint16_t* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every block of the grid (all resident) arrives before any leaves. sync[0] counts arrivals and is
// back at zero after each barrier; sync[1] is bumped by the last to arrive.
__device__ void grid_barrier(unsigned* sync) {
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

// Phase B item i: its 16 rows of W_down (`rt`) and its K part (`p`). Producers (p ≥ 1) come first
// in item order, so a block never waits on a partner before it has published its own parts.
__device__ __forceinline__ void item_of(int i, int tiles16, int splits, int* rt, int* p) {
  *rt = i % tiles16;
  *p = splits - 1 - i / tiles16;
}

// A warp's MMA sums into red[warp][16 rows][8·NT + 1] (c0, c1: row g; c2, c3: row g + 8), to be
// added across warps in warp order.
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

// NT: token tiles of 8 (M ≤ 8·NT; rows past M repeat row M−1: computed, never stored).
// KS = D / 512: 64-column steps per warp in phase A.
template <int NT, int KS>
__global__ void __launch_bounds__(kThreads, 1) expert_mlp_kernel(Args a) {
  constexpr int D = KS * kWarps * kMmaStep;
  constexpr int xrow = D + kPad;
  constexpr int RS = NT * 8 + 1;
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int M = a.m, F = a.f, S = a.splits, G = int(gridDim.x);
  const int kd = F / S, wrow = kd + kPad;
  const int tiles16 = D / 16, items = tiles16 * S;
  int nitems = 0;
  for (int i = int(blockIdx.x); i < items; i += G) ++nitems;
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* ws = xs + NT * 8 * xrow;
  float* red = reinterpret_cast<float*>(ws + nitems * 16 * wrow);  // [warp][16][RS]

  // 1. This block's W_down rows into shared memory, then its first W_gu tiles into registers:
  //    weights, so before the wait for the kernel before this one.
  for (int ii = 0; ii < nitems; ++ii) {
    int rt, p;
    item_of(int(blockIdx.x) + ii * G, tiles16, S, &rt, &p);
    const int per_row = kd / 8;
    for (int c = int(threadIdx.x); c < 16 * per_row; c += kThreads) {
      const int r = c / per_row, col = (c % per_row) * 8;
      cp_async16(ws + (ii * 16 + r) * wrow + col, a.wd + int64_t(16 * rt + r) * F + p * kd + col);
    }
  }
  const int TA = F / 8;  // W_gu tiles: gate rows 8j..8j+7 and up rows F+8j..F+8j+7
  uint4 wv[kTiles][KS][2][2];
  auto load_tiles = [&](int base) {
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      const int tile = base + i * G;
      if (tile >= TA) continue;
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
    }
  };
  load_tiles(int(blockIdx.x));
  pdl_wait();

  // 2. x into shared memory.
  for (int c = int(threadIdx.x); c < NT * 8 * (D / 8); c += kThreads) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    cp_async16(xs + r * xrow + col, a.x + int64_t(min(r, M - 1)) * D + col);
  }
  cp_async_wait_all();  // x and W_down
  __syncthreads();

  // 3. Phase A: gate|up tiles, GeGLU on the sums, h.
  for (int base = int(blockIdx.x); base < TA; base += kTiles * G) {
    if (base != int(blockIdx.x)) load_tiles(base);
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      const int tile = base + i * G;
      if (tile >= TA) break;
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
    }
  }
  __threadfence();
  grid_barrier(a.sync);

  // 4. Phase B: W_down rows from shared memory, h from L2, split K summed in part order.
  const int spw = kd / (kMmaStep * kWarps);  // steps per warp
  for (int ii = 0; ii < nitems; ++ii) {
    int rt, p;
    item_of(int(blockIdx.x) + ii * G, tiles16, S, &rt, &p);
    const uint16_t* wb = ws + ii * 16 * wrow;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int s0 = 0; s0 < spw; s0 += kHSteps) {
      uint4 hv[kHSteps][NT][2];
#pragma unroll
      for (int u = 0; u < kHSteps; ++u) {
        if (s0 + u >= spw) break;
        const int col = p * kd + (warp + (s0 + u) * kWarps) * kMmaStep + 8 * t;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint16_t* hp = a.h + int64_t(min(8 * j + g, M - 1)) * a.hs + col;
          hv[u][j][0] = ldcg16(hp);
          hv[u][j][1] = ldcg16(hp + 32);
        }
      }
#pragma unroll
      for (int u = 0; u < kHSteps; ++u) {
        if (s0 + u >= spw) break;
        const int col = (warp + (s0 + u) * kWarps) * kMmaStep + 8 * t;
        const uint4 w0[2] = {lds16(wb + g * wrow + col), lds16(wb + g * wrow + col + 32)};
        const uint4 w1[2] = {lds16(wb + (g + 8) * wrow + col), lds16(wb + (g + 8) * wrow + col + 32)};
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_step(acc[j], w0, w1, hv[u][j]);
      }
    }
    store_sums<NT>(red, warp, g, t, acc);
    __syncthreads();
    constexpr int kPer = (16 * 8 * NT + kThreads - 1) / kThreads;
    float v[kPer];
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int e = int(threadIdx.x) + q * kThreads, r = e % 16, c = e / 16;
      v[q] = 0.f;
      if (c < M)
#pragma unroll
        for (int w = 0; w < kWarps; ++w) v[q] += red[(w * 16 + r) * RS + c];
    }
    if (p > 0) {  // a partner: publish this part, then its flag
#pragma unroll
      for (int q = 0; q < kPer; ++q) {
        const int e = int(threadIdx.x) + q * kThreads, r = e % 16, c = e / 16;
        if (c < M) __stcg(a.part + (int64_t(p - 1) * M + c) * D + 16 * rt + r, v[q]);
      }
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) atomicAdd(a.sync + 2 + rt, 1u);
    } else {
      if (threadIdx.x == 0) {
        while (ld_acquire(a.sync + 2 + rt) < unsigned(S - 1)) __nanosleep(20);
        a.sync[2 + rt] = 0;  // ready for the next launch (stream order)
        __threadfence();
      }
      __syncthreads();
#pragma unroll
      for (int q = 0; q < kPer; ++q) {
        const int e = int(threadIdx.x) + q * kThreads, r = e % 16, c = e / 16;
        if (c >= M) continue;
        float s = v[q];
        for (int pp = 1; pp < S; ++pp) s += __ldcg(a.part + (int64_t(pp - 1) * M + c) * D + 16 * rt + r);
        a.y[int64_t(c) * a.ys + 16 * rt + r] = s;
      }
    }
    // (Both branches synchronise after the last read of red: the next item may reuse it.)
  }
}

// The shapes the kernel takes, and the phase B splits of F it takes (whole steps per warp).
bool shape_ok(int64_t m, int64_t d, int64_t f) {
  return m >= 1 && m <= 64 && (d == 512 || d == 1024) && f >= 1024 && f % 1024 == 0 && f <= (int64_t(1) << 20);
}
bool split_ok(int64_t f, int splits) {
  return (splits == 1 || splits == 2 || splits == 4 || splits == 8) && f % (int64_t(splits) * kMmaStep * kWarps) == 0;
}

int nt_for(int64_t m) { return m <= 16 ? 2 : m <= 32 ? 4 : m <= 56 ? 7 : 8; }

uint64_t smem_bytes(int nt, int64_t d, int64_t f, int splits, int items_per_block) {
  return uint64_t(nt * 8) * uint64_t(d + kPad) * 2 + uint64_t(items_per_block) * 16 * uint64_t(f / splits + kPad) * 2 +
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
cudaError_t allow_smem(KernelFn k, uint64_t smem) {
  static std::mutex mu;
  static std::map<KernelFn, uint64_t> allowed;
  std::lock_guard<std::mutex> lock(mu);
  uint64_t& have = allowed[k];
  if (smem <= have) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e == cudaSuccess) have = smem;
  return e;
}

}  // namespace

bool expert_mlp_plan(int64_t m, int64_t d, int64_t f, int sms, int64_t smem_optin, ExpertMlp* out) {
  if (!shape_ok(m, d, f) || sms < 1) return false;
  const int nt = nt_for(m);
  for (int splits : {2, 4, 1, 8}) {
    if (!split_ok(f, splits)) continue;
    const int64_t items = d / 16 * splits;
    const int ipb = int((items + sms - 1) / sms);
    if (ipb > 2) continue;
    const uint64_t smem = smem_bytes(nt, d, f, splits, ipb);
    if (smem > uint64_t(smem_optin) || smem > 232448) continue;
    *out = ExpertMlp{m, d, f, sms, splits, ipb, smem};
    return true;
  }
  return false;
}

uint64_t expert_mlp_workspace_bytes(const ExpertMlp& p) { return uint64_t(p.splits - 1) * uint64_t(p.m * p.d) * 4; }

Status expert_mlp(cudaStream_t stream, const ExpertMlp& p, const void* x, const void* w_gu, const void* w_down, void* h,
                  int64_t h_stride, float* y, int64_t y_stride, void* workspace, unsigned* sync) {
  const int64_t items = p.d / 16 * p.splits;
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
               int(h_stride), int(y_stride)};
  const KernelFn k = pick_kernel(p.m, p.d);
  if (const cudaError_t e = allow_smem(k, p.smem); e != cudaSuccess)
    return Status(StatusCode::Backend,
                  "expert_mlp: " + std::to_string(p.smem) + " bytes of shared memory: " + cudaGetErrorString(e));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(p.blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = p.smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  // Co-residency of every block, which the grid barrier needs (VLAC_MLP_COOP=0: a plain launch,
  // resident in practice at one block per multiprocessor: expert_mlp_resident).
  static const bool coop = !env_off("VLAC_MLP_COOP");
  if (coop) {
    attrs[n].id = cudaLaunchAttributeCooperative;
    attrs[n++].val.cooperative = 1;
  }
  // Should a driver refuse the cooperative launch together with PDL, the first (eager) launch
  // finds out and every later one goes without PDL (griddepcontrol.wait is then a no-op).
  static std::atomic<bool> no_pdl{false};
  const bool pdl = pdl_enabled() && !no_pdl.load();
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = unsigned(n);
  if (cudaLaunchKernelEx(&cfg, k, a) != cudaSuccess && pdl) {
    (void)cudaGetLastError();
    no_pdl = true;
    cfg.numAttrs = unsigned(n - 1);  // PDL is the last attribute
    (void)cudaLaunchKernelEx(&cfg, k, a);
  }
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
