// Small-M GEMM phases in one persistent launch, weights streamed across the phases
// (expert_stream.h). Fragment layout: mma.cuh.
#include "backends/cuda/expert_stream.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/mma.cuh"
#include "backends/cuda/persistent.cuh"

namespace vlac::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 32;  // bf16 after each shared row: rows 64 bytes off a 128-byte period, no bank conflicts
constexpr int kChunk = int(kStreamStageCols);  // columns of a weight stage and of an input chunk
constexpr int kRow = kChunk + kPad;
constexpr int kStageElems = 16 * kRow;
constexpr uint64_t kStageBytes = uint64_t(kStageElems) * 2;
constexpr uint64_t kXBytes = uint64_t(kStreamTokens) * kRow * 2;
constexpr int kRS = kStreamTokens + 1;                    // red's row stride (floats)
constexpr uint64_t kRedBytes = uint64_t(4) * 16 * kRS * 4;  // [K quarter][16 rows][tokens]
constexpr uint64_t kSsBytes = 64 * 4;                     // Σx² per token (norm phases)
constexpr int kMinStages = 2, kMaxStages = 8;
constexpr uint64_t kBarBytes = 8 * kMaxStages;            // a ring slot's mbarrier (bulk copies)
constexpr uint64_t kFixedBytes = kXBytes + kRedBytes + kSsBytes + kBarBytes;
constexpr int kRound = 4;  // items a block holds at once (their sums in registers)
constexpr uint64_t kSmemCap = 232448;  // sm_90's per-block opt-in maximum

enum : int { kInF32 = 1, kNorm = 2, kGeglu = 4, kOutF32 = 8, kAccum = 16 };

// A phase as the kernel reads it (expert_stream_upload checked the ranges).
struct Phase {
  const uint16_t* w;
  const void* in;
  void* out;
  int rows, k, parts, in_stride, out_stride, flags;
  float eps;
  int pad_;
};

struct Args {
  const Phase* ph;  // the launch's first phase
  int count, m, stages;
  int bulk;    // weight stages by the bulk copy engine (sm_90+), else cp.async
  int contig;  // a block's items are neighbours (Share)
  unsigned* sync;
  unsigned long long* stamps;  // ExpertStreamProbe (benches): null otherwise
  int skip;
};

// A block's share of a phase: its j-th item (j < n) and how many items from the j-th on form a
// round (at most four, one K part: one input chunk serves them all), each walking `chunks`
// chunks of its K part. Contiguous (the default): the block owns items [b·per, b·per + n), numbered
// part-major, so a round is neighbouring tiles of W (few pages, and a gate|up round's rows are
// two runs); strided (bench A/B): items b, b + G, b + 2G, … numbered tile-major.
struct Share {
  int n, chunks, tiles, parts, first, G, contig;
  __device__ __forceinline__ int item(int j) const { return contig ? first + j : first + j * G; }
  __device__ __forceinline__ int part(int i) const { return contig ? i / tiles : i % parts; }
  __device__ __forceinline__ int tile(int i) const { return contig ? i % tiles : i / parts; }
  __device__ __forceinline__ int round_len(int j) const {
    if (contig) return min(min(kRound, n - j), tiles - tile(item(j)));
    return G % parts == 0 ? min(kRound, n - j) : 1;
  }
};
__device__ __forceinline__ Share share_of(const Phase& P, int contig) {
  const int tiles = P.rows / 16, items = tiles * P.parts, b = int(blockIdx.x), G = int(gridDim.x);
  const int chunks = P.k / P.parts / kChunk;
  if (contig) {
    const int per = (items + G - 1) / G, first = b * per;
    return Share{max(0, min(per, items - first)), chunks, tiles, P.parts, first, G, 1};
  }
  return Share{b < items ? (items - b + G - 1) / G : 0, chunks, tiles, P.parts, b, G, 0};
}

// Where the weight stream is: phase p, round start j0 (the block's j0-th item), chunk c, item u
// of the round. The stream is the order the math consumes the stages in, from the shapes alone.
struct Cursor {
  int p, j0, c, u;
};

__device__ __forceinline__ void settle(const Args& a, Cursor& c) {
  while (c.p < a.count && share_of(a.ph[c.p], a.contig).n == 0) ++c.p;
}
__device__ __forceinline__ void advance(const Args& a, Cursor& c) {
  if (c.p >= a.count) return;
  const Share sh = share_of(a.ph[c.p], a.contig);
  const int len = sh.round_len(c.j0);
  if (++c.u < len) return;
  c.u = 0;
  if (++c.c < sh.chunks) return;
  c.c = 0;
  c.j0 += len;
  if (c.j0 < sh.n) return;
  c.j0 = 0;
  ++c.p;
  settle(a, c);
}

// W's rows of tile `tile` × the 512 columns from col0 into ring slot `slot` (4 copies of 16 bytes
// a thread). geglu: rows 0..7 are gate rows 8·tile.., rows 8..15 the same up rows (F further).
__device__ __forceinline__ void issue_stage(const Phase& P, int tile, int64_t col0, uint16_t* dst) {
  const bool geglu = (P.flags & kGeglu) != 0;
  constexpr int kChunks = kChunk / 8;  // 16-byte copies a row
#pragma unroll
  for (int q = int(threadIdx.x); q < 16 * kChunks; q += kThreads) {
    const int r = q / kChunks, ch = q % kChunks;
    const int row = geglu ? (r < 8 ? 8 * tile + r : P.rows / 2 + 8 * tile + r - 8) : 16 * tile + r;
    cp_async16(dst + r * kRow + ch * 8, P.w + int64_t(row) * P.k + col0 + ch * 8);
  }
}
// The same stage by the bulk copy engine: thread 0 issues one copy a row, counted on bar.
// `whole` (bench probe, skip bit 32): where the stage's rows are one run (k = 512, no geglu), one
// copy of the whole run, unpadded (the math then reads the wrong layout: timing only).
__device__ __forceinline__ void issue_stage_bulk(const Phase& P, int tile, int64_t col0, uint16_t* dst,
                                                 unsigned long long* bar, bool whole) {
  const bool geglu = (P.flags & kGeglu) != 0;
  mbar_expect_tx(bar, 16 * kChunk * 2);
  if (whole && P.k == kChunk && !geglu) {
    bulk_copy(dst, P.w + int64_t(16 * tile) * P.k, 16 * kChunk * 2, bar);
    return;
  }
  for (int r = 0; r < 16; ++r) {
    const int row = geglu ? (r < 8 ? 8 * tile + r : P.rows / 2 + 8 * tile + r - 8) : 16 * tile + r;
    bulk_copy(dst + r * kRow, P.w + int64_t(row) * P.k + col0, kChunk * 2, bar);
  }
}
__device__ __forceinline__ void issue(const Args& a, const Cursor& c, uint16_t* ring, unsigned long long* bars,
                                      int slot) {
  if (c.p >= a.count || (a.bulk && threadIdx.x != 0)) return;
  const Phase& P = a.ph[c.p];
  const Share sh = share_of(P, a.contig);
  const int item = sh.item(c.j0 + c.u), tile = sh.tile(item), part = sh.part(item);
  const int64_t col0 = int64_t(part) * (P.k / P.parts) + int64_t(c.c) * kChunk;
  if (a.bulk) issue_stage_bulk(P, tile, col0, ring + slot * kStageElems, bars + slot, (a.skip & 32) != 0);
  else issue_stage(P, tile, col0, ring + slot * kStageElems);
}

// Until stage `it` has landed: its mbarrier's phase (bulk), or all but the newest S − 2 of this
// thread's cp.async groups (one committed a stage).
__device__ __forceinline__ void wait_ring(const Args& a, unsigned long long* bars, int it) {
  if (a.bulk) {
    mbar_wait(bars + it % a.stages, unsigned(it / a.stages) & 1u);
    return;
  }
  switch (a.stages) {
    case 2: cp_async_wait<0>(); break;
    case 3: cp_async_wait<1>(); break;
    case 4: cp_async_wait<2>(); break;
    case 5: cp_async_wait<3>(); break;
    case 6: cp_async_wait<4>(); break;
    case 7: cp_async_wait<5>(); break;
    default: cp_async_wait<6>(); break;
  }
}

__device__ __forceinline__ void stamp(const Args& a, int p, int i) {
  if (a.stamps == nullptr) return;
  __syncthreads();
  if (threadIdx.x == 0) a.stamps[(int64_t(blockIdx.x) * a.count + p) * kExpertStreamStamps + i] = globaltimer();
}

// Activations are written inside the launch: read through L2 (never the non-coherent path).
__device__ __forceinline__ uint4 ldcg16(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ float4 ldcg_f4(const float* p) { return __ldcg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ void st_bf4(uint16_t* d, float4 v) {
  uint2 u;
  u.x = uint32_t(f2bf(v.x)) | (uint32_t(f2bf(v.y)) << 16);
  u.y = uint32_t(f2bf(v.z)) | (uint32_t(f2bf(v.w)) << 16);
  *reinterpret_cast<uint2*>(d) = u;
}

// Columns [col0, col0 + 512) of the input's m rows into xs as bf16, every load of a thread in
// flight before its first store. fp32 with norm: each row's Σx² over the chunk is added to ss[row]
// (a row's warp is the same for every chunk, so no two warps add to one row).
__device__ void load_chunk(const Phase& P, int m, int64_t col0, uint16_t* xs, float* ss) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  if (P.flags & kInF32) {
    // Warp w takes rows w, w + 8, … (≤ 7), kRows at a time; lane l columns 4l + 128j (j < 4).
    constexpr int kRows = 2;
    const float* in = static_cast<const float*>(P.in);
    const bool norm = (P.flags & kNorm) != 0;
#pragma unroll
    for (int h = 0; h < (kStreamTokens / kWarps + kRows - 1) / kRows; ++h) {
      float4 v[kRows][4];
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int r = warp + kWarps * (kRows * h + i);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (r < m) v[i][j] = ldcg_f4(in + int64_t(r) * P.in_stride + col0 + 4 * lane + 128 * j);
      }
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int r = warp + kWarps * (kRows * h + i);
        if (r >= m) break;
        float q = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          st_bf4(xs + r * kRow + 4 * lane + 128 * j, v[i][j]);
          q += v[i][j].x * v[i][j].x + v[i][j].y * v[i][j].y + v[i][j].z * v[i][j].z + v[i][j].w * v[i][j].w;
        }
        if (norm) {
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
          if (lane == 0) ss[r] += q;
        }
      }
    }
    return;
  }
  // bf16: m rows × 64 copies of 16 bytes, ≤ 14 a thread, in two batches of 7 in flight.
  constexpr int kPer = 7;
  const uint16_t* in = static_cast<const uint16_t*>(P.in);
  const int n = m * (kChunk / 8);
  for (int q0 = int(threadIdx.x); q0 < n; q0 += kPer * kThreads) {
    uint4 v[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int q = q0 + u * kThreads;
      if (q < n) v[u] = ldcg16(in + int64_t(q / (kChunk / 8)) * P.in_stride + col0 + (q % (kChunk / 8)) * 8);
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int q = q0 + u * kThreads;
      if (q < n) *reinterpret_cast<uint4*>(xs + (q / (kChunk / 8)) * kRow + (q % (kChunk / 8)) * 8) = v[u];
    }
  }
}

// One stage against the chunk in xs: warp w takes the stage's K quarter w % 4 (two 64-column MMA
// steps) for token tiles 0..3 (w < 4) or 4..6 (w ≥ 4; NT = 3). acc[j] is token tile 4·(w / 4) + j.
// Every fragment of a step is loaded before its first MMA, and the MMAs go round the token tiles
// (independent sums) rather than down one tile's K: ptxas keeps that order, and one tile's four
// MMAs in a row each wait for the last (session 25: ~1.5 µs a stage that way).
template <int NT>
__device__ __forceinline__ void stage_math_nt(const uint16_t* wa, const uint16_t* xp, float (&acc)[4][4]) {
  const uint16_t* wb = wa + 8 * kRow;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const int col = kMmaStep * s;
    const uint4 a0[2] = {lds16(wa + col), lds16(wa + col + 32)};
    const uint4 a1[2] = {lds16(wb + col), lds16(wb + col + 32)};
    uint4 b[NT][2];
#pragma unroll
    for (int j = 0; j < NT; ++j) b[j][0] = lds16(xp + 8 * j * kRow + col), b[j][1] = lds16(xp + 8 * j * kRow + col + 32);
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int j = 0; j < NT; ++j)
        mma(acc[j], word(a0, 2 * q), word(a1, 2 * q), word(a0, 2 * q + 1), word(a1, 2 * q + 1), word(b[j], 2 * q),
            word(b[j], 2 * q + 1));
  }
}
__device__ __forceinline__ void stage_math(const uint16_t* st, const uint16_t* xs, float (&acc)[4][4]) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, g = lane >> 2, t = lane & 3;
  const int kq = warp & 3, nh = warp >> 2;
  const uint16_t* wa = st + g * kRow + 128 * kq + 8 * t;
  const uint16_t* xp = xs + (32 * nh + g) * kRow + 128 * kq + 8 * t;
  if (nh == 0) stage_math_nt<4>(wa, xp, acc);
  else stage_math_nt<3>(wa, xp, acc);
}

// An item's sums over the four K quarters, in that order, and the phase's epilogue for its 16
// rows of W (tile) and the m tokens. Ends with every thread past its last read of red.
__device__ void epilogue(const Phase& P, int m, int tile, float* red, const float* ss,
                         const float (&acc)[4][4]) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, g = lane >> 2, t = lane & 3;
  const int kq = warp & 3, nh = warp >> 2;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int nt = 4 * nh + j;
    if (nt >= kStreamTokens / 8) break;  // warps 4..7 hold three tiles
    float* r0 = red + (kq * 16 + g) * kRS + 8 * nt + 2 * t;
    r0[0] = acc[j][0], r0[1] = acc[j][1];
    r0[8 * kRS] = acc[j][2], r0[8 * kRS + 1] = acc[j][3];
  }
  __syncthreads();
  const bool norm = (P.flags & kNorm) != 0;
  auto sum = [&](int r, int c) {
    const float s =
        ((red[r * kRS + c] + red[(16 + r) * kRS + c]) + red[(32 + r) * kRS + c]) + red[(48 + r) * kRS + c];
    return norm ? s * rsqrtf(ss[c] / float(P.k) + P.eps) : s;
  };
  if (P.flags & kGeglu) {
    uint16_t* out = static_cast<uint16_t*>(P.out);
    for (int e = int(threadIdx.x); e < 8 * m; e += kThreads) {
      const int r = e % 8, c = e / 8;
      const float gl = round_bf(gelu_tanh_1(round_bf(sum(r, c))));
      out[int64_t(c) * P.out_stride + 8 * tile + r] = f2bf(gl * round_bf(sum(r + 8, c)));
    }
  } else {
    for (int e = int(threadIdx.x); e < 16 * m; e += kThreads) {
      const int r = e % 16, c = e / 16;
      const float s = sum(r, c);
      const int64_t at = int64_t(c) * P.out_stride + 16 * tile + r;
      if (P.flags & kAccum) atomicAdd(static_cast<float*>(P.out) + at, s);
      else if (P.flags & kOutF32) static_cast<float*>(P.out)[at] = s;
      else static_cast<uint16_t*>(P.out)[at] = f2bf(s);
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 1) expert_stream_kernel(Args a) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);
  float* red = reinterpret_cast<float*>(smem + kXBytes);
  float* ss = reinterpret_cast<float*>(smem + kXBytes + kRedBytes);
  auto* bars = reinterpret_cast<unsigned long long*>(smem + kXBytes + kRedBytes + kSsBytes);
  uint16_t* ring = reinterpret_cast<uint16_t*>(smem + kFixedBytes);
  const int S = a.stages, m = a.m;
  if (a.bulk && threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) mbar_init(bars + s, 1);
    mbar_init_fence();
  }
  __syncthreads();

  // Token rows past m are never loaded: zero them once (their sums are computed, never stored).
  for (int q = int(threadIdx.x); q < (kStreamTokens - m) * kRow / 8; q += kThreads)
    reinterpret_cast<uint4*>(xs + m * kRow)[q] = make_uint4(0, 0, 0, 0);

  // The weights depend on nothing: S − 1 stages are in flight before the wait for the kernel
  // before this one, and stay S − 1 ahead of the math from then on, across every barrier.
  Cursor prod{0, 0, 0, 0};
  settle(a, prod);
  for (int s = 0; s + 1 < S; ++s) {
    issue(a, prod, ring, bars, s);
    cp_async_commit();
    advance(a, prod);
  }
  pdl_wait();

  int it = 0;  // stages consumed
  for (int pi = 0; pi < a.count; ++pi) {
    const Phase P = a.ph[pi];
    if (pi > 0 && !(a.skip & 2)) grid_barrier(a.sync);
    stamp(a, pi, 0);
    const Share sh = share_of(P, a.contig);
    const int kc = P.k / P.parts;
    bool stamped = false;
    for (int j0 = 0, len = 0; j0 < sh.n; j0 += len) {
      len = sh.round_len(j0);
      const int part = sh.part(sh.item(j0));
      float acc[kRound][4][4];
#pragma unroll
      for (int u = 0; u < kRound; ++u)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[u][j][0] = acc[u][j][1] = acc[u][j][2] = acc[u][j][3] = 0.f;
      if (threadIdx.x < kStreamTokens) ss[threadIdx.x] = 0.f;
      for (int c = 0; c < sh.chunks; ++c) {
        __syncthreads();  // every warp is done with the last chunk (and ss is zeroed)
        if (!(a.skip & 4)) load_chunk(P, m, int64_t(part) * kc + int64_t(c) * kChunk, xs, ss);
        __syncthreads();
        if (!stamped) stamp(a, pi, 1), stamped = true;
#pragma unroll
        for (int u = 0; u < kRound; ++u) {
          if (u >= len) break;
          wait_ring(a, bars, it);
          __syncthreads();  // the stage is visible to all; slot (it − 1) % S is free again
          issue(a, prod, ring, bars, (it + S - 1) % S);
          cp_async_commit();
          advance(a, prod);
          if (!(a.skip & 1)) stage_math(ring + (it % S) * kStageElems, xs, acc[u]);
          ++it;
        }
      }
      if (!(a.skip & 1)) {
#pragma unroll
        for (int u = 0; u < kRound; ++u) {
          if (u >= len) break;
          epilogue(P, m, sh.tile(sh.item(j0 + u)), red, ss, acc[u]);
        }
      }
    }
    if (!stamped) stamp(a, pi, 1);
    stamp(a, pi, 2);
  }
  cp_async_wait<0>();  // (empty groups only: the stream ends with the last phase)
}

bool plan_ok(const ExpertStreamPlan& p) {
  return p.m >= 1 && p.m <= kStreamTokens && p.blocks >= 1 && p.stages >= kMinStages && p.stages <= kMaxStages &&
         p.smem >= kFixedBytes + uint64_t(p.stages) * kStageBytes;
}

cudaError_t allow_smem(uint64_t smem) {
  static std::mutex mu;
  static uint64_t have = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (smem <= have) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(expert_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e == cudaSuccess) have = smem;
  return e;
}

std::string phase_error(size_t i, const std::string& what) {
  return "expert_stream: phase " + std::to_string(i) + ": " + what;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool expert_stream_plan(int64_t m, int sms, int64_t smem_optin, ExpertStreamPlan* out, int stages) {
  if (m < 1 || m > kStreamTokens || sms < 1) return false;
  if (stages != 0 && (stages < kMinStages || stages > kMaxStages)) return false;
  const uint64_t cap = std::min<uint64_t>(uint64_t(std::max<int64_t>(smem_optin, 0)), kSmemCap);
  for (int s = stages ? stages : kMaxStages; s >= (stages ? stages : kMinStages); --s) {
    const uint64_t smem = kFixedBytes + uint64_t(s) * kStageBytes;
    if (smem > cap) continue;
    *out = ExpertStreamPlan{m, sms, s, smem};
    return true;
  }
  return false;
}

bool expert_stream_resident(const ExpertStreamPlan& p) {
  int per_sm = 0, dev = 0, sms = 0;
  const bool ok = plan_ok(p) && allow_smem(p.smem) == cudaSuccess &&
                  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, expert_stream_kernel, kThreads,
                                                                size_t(p.smem)) == cudaSuccess &&
                  cudaGetDevice(&dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess;
  if (!ok) (void)cudaGetLastError();
  return ok && int64_t(per_sm) * sms >= p.blocks;
}

uint64_t expert_stream_phase_bytes(int64_t n) { return uint64_t(std::max<int64_t>(n, 0)) * sizeof(Phase); }

Status expert_stream_upload(const std::vector<StreamPhase>& phases, int64_t m, void* dev) {
  if (m < 1 || m > kStreamTokens)
    return invalid_argument("expert_stream: m (" + std::to_string(m) + ") must be 1.." + std::to_string(kStreamTokens));
  constexpr int64_t kIntMax = 0x7fffffff;
  std::vector<Phase> out;
  out.reserve(phases.size());
  for (size_t i = 0; i < phases.size(); ++i) {
    const StreamPhase& s = phases[i];
    auto bad = [&](const std::string& what) { return invalid_argument(phase_error(i, what)); };
    if (s.w == nullptr || s.in == nullptr || s.out == nullptr) return bad("w, in and out must be set");
    if (!aligned16(s.w) || !aligned16(s.in)) return bad("w and in must be 16-byte aligned");
    if (s.rows < 16 || s.rows % 16 != 0 || s.rows > kIntMax)
      return bad("rows (" + std::to_string(s.rows) + ") must be a positive multiple of 16");
    if (s.parts != 1 && s.parts != 2 && s.parts != 4)
      return bad("parts (" + std::to_string(s.parts) + ") must be 1, 2 or 4");
    if (s.k < kStreamStageCols || s.k % (kStreamStageCols * s.parts) != 0 || s.k > kIntMax)
      return bad("k (" + std::to_string(s.k) + ") must be a multiple of 512 x parts (" + std::to_string(s.parts) + ")");
    if (s.parts > 1 && !s.accumulate) return bad("K parts add their sums: parts > 1 needs accumulate");
    if (s.accumulate && (!s.out_f32 || s.geglu)) return bad("accumulate needs an fp32 out and no geglu");
    if (s.norm && (!s.in_f32 || s.parts != 1)) return bad("norm needs an fp32 input and one K part");
    if (s.geglu && (s.parts != 1 || s.out_f32)) return bad("geglu needs one K part and a bf16 out");
    const int64_t align = s.in_f32 ? 4 : 8;  // elements in 16 bytes
    if (s.in_stride < s.k || s.in_stride % align != 0 || s.in_stride > kIntMax)
      return bad("in_stride (" + std::to_string(s.in_stride) + ") must be >= k and keep rows 16-byte aligned");
    const int64_t cols = s.geglu ? s.rows / 2 : s.rows;
    if (s.out_stride < cols || s.out_stride > kIntMax)
      return bad("out_stride (" + std::to_string(s.out_stride) + ") must be >= " + std::to_string(cols));
    if (s.rows * s.k > (int64_t(1) << 40)) return bad("W is too large");
    const int flags = (s.in_f32 ? kInF32 : 0) | (s.norm ? kNorm : 0) | (s.geglu ? kGeglu : 0) |
                      (s.out_f32 ? kOutF32 : 0) | (s.accumulate ? kAccum : 0);
    out.push_back(Phase{static_cast<const uint16_t*>(s.w), s.in, s.out, int(s.rows), int(s.k), s.parts,
                        int(s.in_stride), int(s.out_stride), flags, s.eps, 0});
  }
  if (out.empty()) return invalid_argument("expert_stream: no phases");
  if (dev == nullptr) return invalid_argument("expert_stream: no device buffer for the phases");
  if (cudaMemcpy(dev, out.data(), out.size() * sizeof(Phase), cudaMemcpyHostToDevice) != cudaSuccess)
    return launch_status("expert_stream upload");
  return Status::ok();
}

Status expert_stream(cudaStream_t stream, const ExpertStreamPlan& p, const void* phases, int64_t total, int64_t first,
                     int64_t count, unsigned* sync, const ExpertStreamProbe* probe) {
  if (!plan_ok(p)) return invalid_argument("expert_stream: a plan from expert_stream_plan is needed");
  if (phases == nullptr || sync == nullptr) return invalid_argument("expert_stream: needs its phases and sync words");
  if (first < 0 || count < 1 || first + count > total || count > 0x7fffffff)
    return invalid_argument("expert_stream: phases [" + std::to_string(first) + ", " + std::to_string(first + count) +
                            ") are not within the " + std::to_string(total) + " uploaded");
  if (const cudaError_t e = allow_smem(p.smem); e != cudaSuccess)
    return Status(StatusCode::Backend,
                  "expert_stream: " + std::to_string(p.smem) + " bytes of shared memory: " + cudaGetErrorString(e));
  // cp.async; bulk copies (sm_90+, one GPU per process) where a bench asks for them (skip bit 8:
  // measured slower on an H100, session 25).
  static const int cc = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return major;
  }();
  const int skip = probe ? probe->skip : 0;
  const Args a{static_cast<const Phase*>(phases) + first, int(count), int(p.m), p.stages,
               cc >= 9 && (skip & 8) ? 1 : 0, (skip & 16) ? 0 : 1, sync, probe ? probe->stamps : nullptr, skip};
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(p.blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = p.smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  attrs[n].id = cudaLaunchAttributeCooperative;  // every block resident: the grid barrier needs it
  attrs[n++].val.cooperative = 1;
  // As expert_mlp: should a driver refuse cooperative + PDL, later launches go without PDL.
  static std::atomic<bool> no_pdl{false};
  const bool pdl = pdl_enabled() && !no_pdl.load();
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = unsigned(n);
  if (cudaLaunchKernelEx(&cfg, expert_stream_kernel, a) != cudaSuccess && pdl) {
    (void)cudaGetLastError();
    no_pdl = true;
    cfg.numAttrs = unsigned(n - 1);
    (void)cudaLaunchKernelEx(&cfg, expert_stream_kernel, a);
  }
  return launch_status("expert_stream");
}

}  // namespace vlac::cuda
