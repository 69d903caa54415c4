// The GEMM that loads its weights before it waits (preload_gemm.h). Fragments: mma.cuh's
// m16n8k16 with W's rows as the MMA's M and the tokens as its N, both operands by ldmatrix from
// shared memory. Rows are not padded (the expert's gate|up tile is then exactly 160 KiB, which
// leaves room for the o GEMM's 64 KiB beside it): the 16-byte chunk c of row r sits at c ^ (r % 8),
// so the eight rows an ldmatrix reads fall on eight different bank groups.
#include "backends/cuda/preload_gemm.h"

#include <cooperative_groups.h>
#include <cuda.h>  // CUtensorMap (types only: the encoder comes from the runtime's driver entry point)

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/capture_edge.h"
#include "backends/cuda/common.cuh"
#include "backends/cuda/env.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/mma.cuh"
#include "backends/cuda/persistent.cuh"

namespace vlac::cuda {

namespace cg = cooperative_groups;

namespace {

constexpr int kMaxThreads = 512;

struct Args {
  const uint16_t* x;
  const uint16_t* w;
  const void* bias;
  void* y;
  int m, n, k, ldx, ldy;
  int rows, kc, parts;  // the block's W tile: rows × kc; parts blocks a row tile (a cluster)
  int cluster;          // parts, or 1: no cluster, and part q's block writes fp32 partial q at y + q · m · ldy
  int kg, mwarps;       // warps: mwarps of 16 rows each × kg groups of the K steps
  int ntr;              // token rows in shared memory (zero past m; the kernel's NT tiles of 8 use them)
  int accumulate;
  int pipe;   // W in this many groups of columns (1, 2, 4), the math following them
  int bar_off;  // bytes: where the TMA barrier sits in shared memory
  int tma;    // W by TMA boxes onto an mbarrier (layout [kc / 64][rows][64]) instead of cp.async
  int probe;  // timing only (VLAC_PRELOAD_PROBE): 1 no MMAs, 2 no x load, 4 no W load
  unsigned long long* stamps;  // benches only: kStamps %globaltimer values a block, or null
};

// Where a block's time goes (preload_gemm_set_stamps): thread 0 stamps each point.
#define VLAC_STAMP(i)                                                   \
  do {                                                                  \
    if (a.stamps && threadIdx.x == 0) a.stamps[size_t(blockIdx.x) * kPreloadStamps + (i)] = globaltimer(); \
  } while (0)

// (The kernel has code for sm_90 and later only, so neither have these below it.)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__device__ __forceinline__ void add4(float4& s, float4 t) { s.x += t.x, s.y += t.y, s.z += t.z, s.w += t.w; }
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const uint16_t* p) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  return make_float4(bf2f(uint16_t(v.x & 0xFFFFu)), bf2f(uint16_t(v.x >> 16)), bf2f(uint16_t(v.y & 0xFFFFu)),
                     bf2f(uint16_t(v.y >> 16)));
}
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void store4(uint16_t* p, float4 v) {
  *reinterpret_cast<uint2*>(p) = make_uint2(uint32_t(f2bf(v.x)) | (uint32_t(f2bf(v.y)) << 16),
                                            uint32_t(f2bf(v.z)) | (uint32_t(f2bf(v.w)) << 16));
}

// One 2-D TMA box of W (64 columns × the tile's rows, 128-byte swizzle) into shared memory,
// completing on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int col, int row,
                                            unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_u32(bar))
      : "memory");
#else
  (void)dst, (void)map, (void)col, (void)row, (void)bar;
#endif
}

#endif

// NT token tiles of 8 (ceil(m / 8)); RW row tiles of 16 a warp (2: each x fragment a warp
// loads from shared memory feeds twice the MMAs, and the block's x is read half as often).
template <typename To, int NT, int RW>
__global__ void __launch_bounds__(RW == 2 ? kMaxThreads / 2 : kMaxThreads) preload_gemm_kernel(Args a, const __grid_constant__ CUtensorMap wmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  (void)a, (void)wmap;  // launched on sm_90 and later only (preload_gemm_fits): no code for sm_80/87
#else

  // 1024-byte aligned: TMA's 128-byte swizzle follows address bits 7-9, which the XOR below assumes.
  extern __shared__ __align__(1024) uint4 smem_raw[];
  // The TMA boxes' barrier, past the tile (the launch adds 16 bytes when a.tma).
  unsigned long long* wbar = reinterpret_cast<unsigned long long*>(reinterpret_cast<char*>(smem_raw) + a.bar_off);
  uint16_t* ws = reinterpret_cast<uint16_t*>(smem_raw);
  const int pitch = a.kc;
  uint16_t* xs = ws + size_t(a.rows) * pitch;
  const int tid = int(threadIdx.x), nthreads = int(blockDim.x);
  const int tile = int(blockIdx.x) / a.parts, part = int(blockIdx.x) % a.parts;
  const int n0 = tile * a.rows, k0 = part * a.kc;
  VLAC_STAMP(0);

  // 1. The whole W tile, before anything else: it depends on no kernel. In `pipe` groups of
  //    columns (1, 2 or 4), so that the math can begin on the first while the rest arrive.
  const int cpr = a.kc / 8;  // 16-byte chunks a row
  const int groups = a.tma ? 1 : a.pipe, cprg = cpr / groups;
  const bool load_w = !(a.probe & 4);
  if (a.tma) {  // one thread: Kc / 64 boxes of rows × 64 onto one barrier
    if (tid == 0 && load_w) {
      mbar_init(wbar, 1);
      mbar_init_fence();
      mbar_expect_tx(wbar, unsigned(a.rows) * unsigned(a.kc) * 2u);
      for (int sg = 0; sg < a.kc / 64; ++sg) tma_load_2d(ws + size_t(sg) * a.rows * 64, &wmap, k0 + sg * 64, n0, wbar);
    }
  }
  // (Row and chunk are stepped, not divided out of a flat index: a runtime division is ~20
  // instructions per 16 bytes, and the stamps had this issue loop at 0.8–1.4 µs.)
  const int wdr = nthreads / cprg, wdc = nthreads - wdr * cprg;
  for (int gi = 0; gi < (a.tma ? 0 : groups); ++gi) {
    int r = tid / cprg, c = tid - r * cprg;
    while (load_w && r < a.rows) {
      const int cc = gi * cprg + c;
      cp_async16(ws + size_t(r) * pitch + ((cc ^ (r & 7)) * 8), a.w + size_t(n0 + r) * a.k + k0 + cc * 8);
      r += wdr, c += wdc;
      if (c >= cprg) c -= cprg, ++r;
    }
    cp_async_commit();
  }
  VLAC_STAMP(1);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // 2. Let the next kernel launch (it waits for this one's completion itself), then wait for x.
  pdl_launch_dependents();
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  VLAC_STAMP(2);
  // 3. x's rows of this K part; token rows past m are zero. With one W group by cp.async (its
  //    group is then waited for with W's); with more, by loads, so W's groups complete alone.
  const int xdr = nthreads / cpr, xdc = nthreads - xdr * cpr;
  for (int r = tid / cpr, c = tid - (tid / cpr) * cpr; r < a.ntr;) {
    uint16_t* dst = xs + size_t(r) * pitch + ((c ^ (r & 7)) * 8);
    const uint16_t* src = a.x + size_t(r) * a.ldx + k0 + c * 8;
    if (r >= a.m || (a.probe & 2))
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    else if (groups == 1)
      cp_async16(dst, src);
    else
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    r += xdr, c += xdc;
    if (c >= cpr) c -= cpr, ++r;
  }
  if (groups == 1) cp_async_commit();

  // 4. Each warp: 16 rows of W × every token over its group of K steps, W group by W group. The
  //    token tiles are a compile-time count (NT), so a step's loads carry no branch: its W
  //    fragment and all of its x fragments are loaded one step ahead (two register sets), and
  //    a step's NT MMAs wait on nothing but the loads issued during the step before.
  const int warp = tid >> 5, lane = tid & 31;
  const int mw = warp % a.mwarps, g = warp / a.mwarps;
  const int spg = a.kc / 16 / a.kg, spw = a.kc / 16 / groups;
  // A lane's row address: its row's 16-byte chunk 2s + ha (A) or 2s + hb (B), swizzled by the
  // row's low three bits, which are lane % 8 for both.
  const int l7 = lane & 7, ha = lane >> 4, hb = (lane >> 3) & 1;
  const int wrow = mw * 16 * RW + l7 + hb * 8;
  const int wpitch = a.tma ? 64 : pitch;  // elements between W's rows
  const uint16_t* wa = ws + size_t(wrow) * wpitch;
  const uint16_t* xb = xs + size_t(ha * 8 + l7) * pitch;
  constexpr int NP = (NT + 1) / 2;  // an x ldmatrix holds two token tiles (the odd one's rows are zero)
  struct Frag {
    uint32_t a[RW][4];
    uint32_t b[NP][4];
  };
  auto load = [&](int s, Frag& f) {
    // W's chunk: in the row (cp.async), or in the row of 64-column segment s / 4 (TMA).
    const int ca = a.tma ? (s >> 2) * a.rows * 64 + ((((s & 3) * 2 + ha) ^ l7) * 8) : ((2 * s + ha) ^ l7) * 8;
    const int cb = ((2 * s + hb) ^ l7) * 8;
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) ldsm_x4(wa + size_t(rr) * 16 * wpitch + ca, f.a[rr][0], f.a[rr][1], f.a[rr][2], f.a[rr][3]);
#pragma unroll
    for (int jp = 0; jp < NP; ++jp) ldsm_x4(xb + size_t(jp) * 16 * pitch + cb, f.b[jp][0], f.b[jp][1], f.b[jp][2], f.b[jp][3]);
  };
  float acc[RW][NT][4] = {};
  auto math = [&](const Frag& f) {
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
      const uint32_t(&fa)[4] = f.a[rr];
#pragma unroll
      for (int jp = 0; jp < NP; ++jp) {
        mma(acc[rr][2 * jp], fa[0], fa[1], fa[2], fa[3], f.b[jp][0], f.b[jp][1]);
        if (2 * jp + 1 < NT) mma(acc[rr][2 * jp + 1], fa[0], fa[1], fa[2], fa[3], f.b[jp][2], f.b[jp][3]);
      }
    }
  };
  const bool do_math = !(a.probe & 1);
  for (int gi = 0; gi < groups; ++gi) {
    switch (groups - 1 - gi) {  // W's groups still allowed in flight
      case 0: cp_async_wait<0>(); break;
      case 1: cp_async_wait<1>(); break;
      case 2: cp_async_wait<2>(); break;
      default: cp_async_wait<3>(); break;
    }
    __syncthreads();
    if (a.tma && load_w && gi == 0) mbar_wait(wbar, 0);  // (x's barrier above ordered the init)
    if (gi == 0) VLAC_STAMP(3);
    const int lo = max(g * spg, gi * spw), hi = min((g + 1) * spg, (gi + 1) * spw);
    if (!do_math || lo >= hi) continue;
    Frag f0, f1;
    load(lo, f0);
    int s = lo;
    for (; s + 1 < hi; s += 2) {
      load(s + 1, f1);
      math(f0);
      if (s + 2 < hi) load(s + 2, f0);
      math(f1);
    }
    if (s < hi) math(f0);
  }

  // 5. The block's partial [token][row] in shared memory (over W and x, now read): each K group
  //    writes its own slice in one pass; the groups are added in order below (in the output pass
  //    with one part, into slice 0 before the cluster reads it with more).
  float* p = reinterpret_cast<float*>(smem_raw);
  const int pp = a.rows + 4;  // padded: the 4 tokens of a quad fall on other banks
  const int slice = 8 * NT * pp;  // floats of one group's partial
  __syncthreads();
  VLAC_STAMP(4);
  {
    float* pg = p + size_t(g) * slice;
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = (mw * RW + rr) * 16 + (lane >> 2) + h * 8, t = 8 * j + 2 * (lane & 3);
          pg[size_t(t) * pp + r] = acc[rr][j][2 * h];
          pg[size_t(t + 1) * pp + r] = acc[rr][j][2 * h + 1];
        }
      }
    }
  }
  __syncthreads();
  const int v = a.rows / 4, total = a.m * v;
  const int cparts = a.cluster;
  if (cparts > 1 && a.kg > 1) {
    for (int i = tid; i < total; i += nthreads) {
      const int t = i / v, c = (i - t * v) * 4;
      float* d = p + size_t(t) * pp + c;
      float4 sum = load4(d);
      for (int gg = 1; gg < a.kg; ++gg) add4(sum, load4(d + size_t(gg) * slice));
      store4(d, sum);
    }
  }
  const int kg_out = cparts > 1 ? 1 : a.kg;  // groups the output pass adds

  // 6. The cluster's parts summed in rank order over distributed shared memory; each rank
  //    finishes a slice of the tile's outputs (+ bias, + y) and stores it. Split: each block
  //    stores its whole partial.
  VLAC_STAMP(5);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::cluster_group cluster = cg::this_cluster();
  if (cparts > 1) cluster.sync();
#define VLAC_PART(q) (cparts > 1 ? cluster.map_shared_rank(p, q) : p)
#else
#define VLAC_PART(q) p  // (launched on sm_90 and later only: preload_gemm_fits)
#endif
  const int per = (total + cparts - 1) / cparts;
  const int lo = cparts > 1 ? part * per : 0, hi = min(total, lo + per);
  const To* bias = static_cast<const To*>(a.bias);
  To* y = static_cast<To*>(a.y) + (cparts > 1 ? 0 : size_t(part) * a.m * a.ldy);
  for (int i = lo + tid; i < hi; i += nthreads) {
    const int t = i / v, c = (i - t * v) * 4;
    float4 part_sum[8];  // every part's load issued before the first add
#pragma unroll
    for (int q = 0; q < 8; ++q)
      if (q < cparts) part_sum[q] = load4(VLAC_PART(q) + size_t(t) * pp + c);
    float4 s = part_sum[0];
#pragma unroll
    for (int q = 1; q < 8; ++q)
      if (q < cparts) add4(s, part_sum[q]);
    for (int gg = 1; gg < kg_out; ++gg) add4(s, load4(p + size_t(gg) * slice + size_t(t) * pp + c));
    const int n = n0 + c;
    if (bias) add4(s, load4(bias + n));
    To* dst = y + size_t(t) * a.ldy + n;
    if (a.accumulate) add4(s, load4(dst));
    store4(dst, s);
  }
#undef VLAC_PART
  VLAC_STAMP(6);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cparts > 1) cluster.sync();  // no block leaves while another reads its partial
#endif
  VLAC_STAMP(7);
#endif
}
#undef VLAC_STAMP

int token_rows(int64_t m) {
  const int nt = int((m + 7) / 8);
  return 16 * ((nt + 1) / 2);
}

// Row tiles of 16 a warp: 2 where the tile's rows allow it (VLAC_PRELOAD_RW=1: always 1, to
// compare).
int tile_rw(int rows) {
  static const bool one = env_count("VLAC_PRELOAD_RW", 2) == 1;
  return rows % 32 == 0 && !one ? 2 : 1;
}

// Warps of a tile: rows / (16 · tile_rw) along W, and K groups up to 8 warps in all (fewer where
// the K steps do not divide).
void tile_warps(int rows, int64_t kc, int* mwarps, int* kg) {
  *mwarps = rows / (16 * tile_rw(rows));
  int g = std::max(1, 8 / *mwarps);
  while (g > 1 && (kc / 16) % g != 0) g /= 2;
  *kg = g;
}

// Shared memory of a block: W's and x's tiles, which the K groups' partials (one slice of 8·NT
// tokens × rows + 4 each) later overwrite.
uint64_t tile_smem(int64_t m, int rows, int64_t kc) {
  const uint64_t ntr = uint64_t(token_rows(m));
  const uint64_t operands = (uint64_t(rows) + ntr) * uint64_t(kc) * 2;
  int mw = 0, kg = 0;
  tile_warps(rows, kc, &mw, &kg);
  const uint64_t partial = uint64_t(kg) * uint64_t(8 * ((m + 7) / 8)) * uint64_t(rows + 4) * 4;
  return std::max(operands, partial);
}

using KernelFn = void (*)(Args, const CUtensorMap);

// The kernel for an output dtype, NT = ceil(m / 8) token tiles (1..8) and RW row tiles a warp.
template <typename To, int RW>
KernelFn kernel_nt(int nt) {
  switch (nt) {
    case 1: return preload_gemm_kernel<To, 1, RW>;
    case 2: return preload_gemm_kernel<To, 2, RW>;
    case 3: return preload_gemm_kernel<To, 3, RW>;
    case 4: return preload_gemm_kernel<To, 4, RW>;
    case 5: return preload_gemm_kernel<To, 5, RW>;
    case 6: return preload_gemm_kernel<To, 6, RW>;
    case 7: return preload_gemm_kernel<To, 7, RW>;
    default: return preload_gemm_kernel<To, 8, RW>;
  }
}
KernelFn kernel_for(DType out, int64_t m, int rw) {
  const int nt = int(std::clamp<int64_t>((m + 7) / 8, 1, 8));
  if (out == DType::BF16) return rw == 2 ? kernel_nt<uint16_t, 2>(nt) : kernel_nt<uint16_t, 1>(nt);
  return rw == 2 ? kernel_nt<float, 2>(nt) : kernel_nt<float, 1>(nt);
}

// Every instantiation may take all of a multiprocessor's shared memory (set once).
cudaError_t allow_full_smem() {
  static const cudaError_t e = [] {
    for (DType out : {DType::BF16, DType::F32})
      for (int m = 8; m <= 64; m += 8)
        for (int rw : {1, 2}) {
          const cudaError_t r =
              cudaFuncSetAttribute(kernel_for(out, m, rw), cudaFuncAttributeMaxDynamicSharedMemorySize, 227 << 10);
          if (r != cudaSuccess) {
            (void)cudaGetLastError();
            return r;
          }
        }
    return cudaSuccess;
  }();
  return e;
}

}  // namespace

PreloadTiles preload_gemm_tiles(int64_t m, int64_t n, int64_t k, int sms, uint64_t smem_limit, int max_parts,
                                const std::function<int(const PreloadTiles&)>& resident_clusters, int split_parts) {
  PreloadTiles best;
  uint64_t best_x = 0;
  if (m < 1 || m > 64 || n < 16 || k < 64 || sms < 1) return best;
  const bool split = split_parts > 1;  // exactly these parts, each a block of its own
  const std::vector<int> part_options = split ? std::vector<int>{split_parts} : std::vector<int>{1, 2, 4, 8};
  for (int rows : {16, 32, 64, 128, 256}) {
    if (n % rows != 0) continue;
    for (int parts : part_options) {
      if ((!split && parts > max_parts) || k % parts != 0 || (k / parts) % 64 != 0) continue;
      const int64_t kc = k / parts;
      const int64_t blocks = (n / rows) * parts;
      const uint64_t smem = tile_smem(m, rows, kc);
      if (blocks > sms || smem > smem_limit) continue;
      const uint64_t xbytes = uint64_t(blocks) * uint64_t(m) * uint64_t(kc) * 2;
      const bool better = best.rows == 0 || blocks > best.blocks ||
                          (blocks == best.blocks && (xbytes < best_x || (xbytes == best_x && parts < best.parts)));
      if (!better) continue;
      int mw = 0, kg = 0;
      tile_warps(rows, kc, &mw, &kg);
      const PreloadTiles t{rows, parts, int(blocks), 32 * mw * kg, smem, split ? 1 : parts};
      if (resident_clusters) {  // every cluster resident at once, or the weights load in waves
        const int r = resident_clusters(t);
        if (r >= 0 && blocks / t.cluster > r) continue;
      }
      best = t;
      best_x = xbytes;
    }
  }
  return best;
}

int preload_gemm_waves() {
  static const int v = int(std::clamp<int64_t>(env_count("VLAC_PRELOAD_WAVES", 1), 1, 4));
  return v;
}

int preload_gemm_max_parts() {
  static const int v = int(std::clamp<int64_t>(env_count("VLAC_PRELOAD_MAX_PARTS", 8), 1, 8));
  return v;
}

uint64_t preload_gemm_smem_limit() {
  static const uint64_t v = [] {
    const int64_t kib = env_count("VLAC_PRELOAD_SMEM_KIB", 160);
    return uint64_t(std::clamp<int64_t>(kib, 16, 227)) << 10;
  }();
  return v;
}

// W [n, k] as a TMA tensor map of boxes 64 columns × `rows` with the 128-byte swizzle (the
// kernel's TMA layout), made once per weight and tile height. The encoder is the driver's,
// reached through the runtime (vlac links no libcuda).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static Status weight_map(const void* w, int64_t n, int64_t k, int rows, CUtensorMap* out) {
  static const EncodeTiled encode = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return EncodeTiled(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  if (!encode) return Status(StatusCode::Backend, "preload_gemm: the driver has no cuTensorMapEncodeTiled");
  static std::mutex mu;
  static std::map<std::tuple<const void*, int64_t, int64_t, int>, CUtensorMap> maps;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(w, n, k, rows);
  if (auto it = maps.find(key); it != maps.end()) {
    *out = it->second;
    return Status::ok();
  }
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(n)};
  const cuuint64_t strides[1] = {cuuint64_t(k) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(rows)};
  const cuuint32_t estrides[2] = {1, 1};
  CUtensorMap m{};
  const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(w), dims, strides, box, estrides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status(StatusCode::Backend, "preload_gemm: cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")");
  maps.emplace(key, m);
  *out = m;
  return Status::ok();
}

static unsigned long long* g_stamps = nullptr;
void preload_gemm_set_stamps(unsigned long long* stamps) { g_stamps = stamps; }

// How many clusters of t can be resident at once on this GPU (-1: unknown).
static int resident_clusters(const PreloadGemm& g, const PreloadTiles& t) {
  const KernelFn kernel = kernel_for(g.out, g.m, tile_rw(t.rows));
  if (allow_full_smem() != cudaSuccess) return -1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(t.blocks));
  cfg.blockDim = dim3(unsigned(t.threads));
  cfg.dynamicSmemBytes = t.smem;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = unsigned(t.cluster), at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return n;
}

// The tiles under the environment's settings, checked on this GPU for one wave of clusters
// (VLAC_PRELOAD_ONE_WAVE=0: not checked); cached per shape (a query per candidate costs µs).
static PreloadTiles tiles_for(const PreloadGemm& g, int sms) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int64_t, int, int, int>, PreloadTiles> cache;
  static const bool one_wave = !env_off("VLAC_PRELOAD_ONE_WAVE");
  const int split = g.k_parts > 1 ? g.k_parts : 0;
  const auto key = std::make_tuple(g.m, g.n, g.k, int(g.out), sms, split);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  std::function<int(const PreloadTiles&)> resident;
  if (one_wave) resident = [&g](const PreloadTiles& t) { return resident_clusters(g, t); };
  const PreloadTiles t = preload_gemm_tiles(g.m, g.n, g.k, sms * preload_gemm_waves(), preload_gemm_smem_limit(),
                                            preload_gemm_max_parts(), resident, split);
  cache.emplace(key, t);
  return t;
}

static bool sm90() {
  static const bool v = device_compute_capability() >= 90;
  return v;
}

bool preload_gemm_fits(const PreloadGemm& g, int sms) {
  const int64_t ldx = g.ldx ? g.ldx : g.k, ldy = g.ldy ? g.ldy : g.n;
  if ((g.out != DType::BF16 && g.out != DType::F32) || ldx < g.k || ldy < g.n || ldx % 8 != 0 || ldy % 8 != 0)
    return false;
  if (g.k_parts > 1 && (g.out != DType::F32 || g.bias || g.accumulate)) return false;
  return sm90() && tiles_for(g, sms).rows > 0;  // (the tiles query this GPU: sm_90 first)
}

int preload_gemm_mode() {
  static const int v = [] {
    const int64_t n = env_count("VLAC_PRELOAD_GEMM", 0);
    return n == 1 || n == 2 ? int(n) : 0;
  }();
  return v;
}

static bool early_edges() {
  static const bool v = !env_off("VLAC_PRELOAD_EARLY");
  return v;
}

Status preload_gemm(cudaStream_t stream, const PreloadGemm& g, int sms, const void* x, const void* w,
                    const void* bias, void* y) {
  // The name only where an error needs it: this runs once per GEMM launch.
  auto name = [&] { return "preload_gemm " + std::to_string(g.m) + "x" + std::to_string(g.k) + "x" + std::to_string(g.n); };
  if (!preload_gemm_fits(g, sms)) return unsupported(name() + ": shape, strides or GPU not supported");
  if (g.bias != (bias != nullptr)) return invalid_argument(name() + ": a bias is given iff g.bias");
  for (const void* ptr : {x, w, static_cast<const void*>(y), bias})
    if ((reinterpret_cast<uintptr_t>(ptr) & 15u) != 0) return invalid_argument(name() + ": pointers must be 16-byte aligned");
  const PreloadTiles t = tiles_for(g, sms);
  const KernelFn kernel = kernel_for(g.out, g.m, tile_rw(t.rows));
  const cudaError_t attr = allow_full_smem();
  if (attr != cudaSuccess) return Status(StatusCode::Backend, name() + ": " + cudaGetErrorString(attr));
  Args a{};
  a.x = static_cast<const uint16_t*>(x), a.w = static_cast<const uint16_t*>(w), a.bias = bias, a.y = y;
  a.m = int(g.m), a.n = int(g.n), a.k = int(g.k);
  a.ldx = int(g.ldx ? g.ldx : g.k), a.ldy = int(g.ldy ? g.ldy : g.n);
  a.rows = t.rows, a.kc = int(g.k / t.parts), a.parts = t.parts, a.cluster = t.cluster;
  tile_warps(t.rows, a.kc, &a.mwarps, &a.kg);
  a.ntr = token_rows(g.m);
  a.accumulate = g.accumulate ? 1 : 0;
  static const int probe = int(env_count("VLAC_PRELOAD_PROBE", 0));
  a.probe = probe;
  a.stamps = g_stamps;
  static const int pipe = int(env_count("VLAC_PRELOAD_PIPE", 1));
  a.pipe = 1;
  for (int gs : {4, 2})  // the most groups asked for that divide the K steps
    if (gs <= pipe && (a.kc / 16) % gs == 0 && (a.kc / 8) % gs == 0) {
      a.pipe = gs;
      break;
    }

  CUtensorMap wmap{};
  static const bool tma_env = env_on("VLAC_PRELOAD_TMA");
  a.tma = (g.tma < 0 ? tma_env : g.tma > 0) ? 1 : 0;
  if (a.tma) {
    VLAC_RETURN_IF_ERROR(weight_map(w, g.n, g.k, t.rows, &wmap));
    a.pipe = 1;
  }
  a.bar_off = int(t.smem);

  // Inside a capture, the edge from the kernel before leaves at its launch completion (all of its
  // blocks started), so griddepcontrol.wait still waits for its end; the launch then carries no
  // PDL attribute, which would replace that edge.
  const bool early = early_edges() && set_capture_edge(stream, EdgePort::LaunchCompletion);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(t.blocks));
  cfg.blockDim = dim3(unsigned(t.threads));
  cfg.dynamicSmemBytes = t.smem + (a.tma ? 16 : 0);
  cfg.stream = stream;
  cudaLaunchAttribute at[2];
  unsigned na = 0;
  at[na].id = cudaLaunchAttributeClusterDimension;
  at[na].val.clusterDim.x = unsigned(t.cluster), at[na].val.clusterDim.y = 1, at[na].val.clusterDim.z = 1;
  ++na;
  if (!early && pdl_enabled()) {
    at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = at;
  cfg.numAttrs = na;
  (void)cudaLaunchKernelEx(&cfg, kernel, a, wmap);
  return launch_status("preload_gemm");
}

PreloadTiles preload_gemm_plan(const PreloadGemm& g, int sms) { return tiles_for(g, sms); }

int preload_gemm_active_clusters(const PreloadGemm& g, int sms) {
  const PreloadTiles t = tiles_for(g, sms);
  return t.rows == 0 ? 0 : resident_clusters(g, t);
}

}  // namespace vlac::cuda
