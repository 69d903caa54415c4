// Small-M GEMM phases in one persistent launch, weights streamed across the phases
// (expert_stream.h). Fragment layout: mma.cuh.
#include "backends/cuda/expert_stream.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/mma.cuh"
#include "backends/cuda/persistent.cuh"
#include "backends/cuda/wgmma.cuh"

namespace vlac::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 8;  // bf16 after each shared row: rows 16 bytes apart mod 128, so ldmatrix's 8 rows hit 8 bank groups
constexpr int kChunk = int(kStreamStageCols);  // columns of a weight stage and of an input chunk
constexpr int kRow = kChunk + kPad;
constexpr uint64_t kSsBytes = 64 * 4;                     // Σx² per token (norm phases)
constexpr int kMinStages = 2, kMaxStages = 8;
constexpr uint64_t kBarBytes = 8 * kMaxStages;            // a ring slot's mbarrier (bulk copies)
constexpr int kRound = 4;  // items a block holds at once (their sums in registers)

// The two maths' shared-memory layouts: of the input chunk (two buffers: the next bf16 chunk lands
// during this one's math), of a weight stage, and of `red`, the sums of an item's K slices
// [slice][16 rows][tokens] (row stride kRS floats).
//  - mma.sync (kWg false): row-major, rows padded by 16 bytes, 56 token rows; each warp sums one
//    K quarter of a stage.
//  - wgmma (kWg true, sm_90a): wgmma.cuh's 128-byte swizzle, 64 token rows (wgmma's M: rows 56..63
//    stay zero), 1024-byte aligned. A stage is the round's items together, 64 rows of W (item u's
//    16 at rows 16u..; rows past the round's items are left as they were) × 128 columns, four
//    stages a chunk, so one m64n64k16 covers the round; each warpgroup sums one 64-column K half
//    of a stage. (Session 26 first had a stage an item, 16 rows × 512 columns, as m64n16k16: slower
//    than mma.sync.)
template <bool kWg>
struct Lay {
  static constexpr int kXRows = kStreamTokens, kXElems = kXRows * kRow, kStageElems = 16 * kRow;
  static constexpr int kSlices = 4, kRS = kStreamTokens + 1, kAlign = 16;
  __device__ static int x(int r, int c) { return r * kRow + c; }
  __device__ static int w(int r, int c) { return r * kRow + c; }
};
template <>
struct Lay<true> {
  static constexpr int kXRows = 64, kXElems = kXRows * kChunk, kStageElems = 64 * 128;
  static constexpr int kSlices = 2, kRS = 65, kAlign = 1024;
  __device__ static int x(int r, int c) { return sw128_at(kXRows, r, c); }
  __device__ static int w(int r, int c) { return sw128_at(64, r, c); }
};
template <bool kWg>
constexpr uint64_t stage_bytes() {
  return uint64_t(Lay<kWg>::kStageElems) * 2;
}
template <bool kWg>
constexpr uint64_t fixed_bytes() {  // everything but the ring, with room to align the start
  using L = Lay<kWg>;
  return uint64_t(2) * L::kXElems * 2 + uint64_t(L::kSlices) * 16 * L::kRS * 4 + kSsBytes + kBarBytes +
         (L::kAlign > 16 ? L::kAlign : 0);
}
// An item's sums as the epilogue takes them: mma.sync, four token tiles × four; wgmma, the item's
// 16 columns of the round's 64 × 64 fragment (in m64n16's register order).
template <bool kWg>
struct AccOf {
  using T = float[4][4];
};
template <>
struct AccOf<true> {
  using T = float[8];
};
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
  int bulk;  // weight stages by the bulk copy engine (sm_90+; mma.sync layout only), else cp.async
  unsigned long long* sync;    // the grid barrier's arrival counter (grid_barrier_counted)
  unsigned long long* stamps;  // ExpertStreamProbe (benches): null otherwise
  int skip;
};

// A block's share of a phase: the run of items [first, first + n) (ceil(items / G) a block),
// numbered part-major, so neighbouring items are neighbouring 16-row tiles of W; each walks
// `chunks` chunks of 512 columns of its K part. A round is up to four items of one K part (one
// input chunk serves them all): round(j) gives the round from the block's j-th item on.
struct Share {
  int n, first, chunks, tiles, kc;
  __device__ __forceinline__ int round(int j, int* part, int* tile0) const {
    const int item = first + j;
    *part = item / tiles, *tile0 = item % tiles;
    return min(min(kRound, n - j), tiles - *tile0);
  }
};
__device__ __forceinline__ Share share_of(const Phase& P) {
  const int tiles = P.rows / 16, items = tiles * P.parts, G = int(gridDim.x);
  const int per = (items + G - 1) / G, first = int(blockIdx.x) * per;
  return Share{max(0, min(per, items - first)), first, P.k / P.parts / kChunk, tiles, P.k / P.parts};
}

// Where the weight stream is, with what it needs to issue a stage kept in registers (divisions
// once a round, the phase's fields once a phase): phase p (count = done), round start j (the
// block's j-th item) of length len, chunk c, item u of the round. The stream is the order the
// math consumes the stages in, from the shapes alone.
struct Cursor {
  int p, j, len, c, u;
  Share sh;
  int part, tile0;
  const uint16_t* w;
  int k, half, geglu;  // half: F = rows / 2 (gate|up's up rows), geglu: rows 0..7 gate, 8..15 up
};

__device__ __forceinline__ void enter(const Args& a, Cursor& c) {  // phase c.p or the next with items
  for (; c.p < a.count; ++c.p) {
    const Phase& P = a.ph[c.p];
    c.sh = share_of(P);
    if (c.sh.n == 0) continue;
    c.w = P.w, c.k = P.k, c.half = P.rows / 2, c.geglu = (P.flags & kGeglu) != 0;
    c.j = c.c = c.u = 0;
    c.len = c.sh.round(0, &c.part, &c.tile0);
    return;
  }
}
// Stages a chunk: one an item (mma.sync), four of 128 columns (wgmma).
template <bool kWg>
__device__ __forceinline__ int chunk_stages(int len) {
  return kWg ? 4 : len;
}
template <bool kWg>
__device__ __forceinline__ void advance(const Args& a, Cursor& c) {
  if (c.p >= a.count) return;
  if (++c.u < chunk_stages<kWg>(c.len)) return;
  c.u = 0;
  if (++c.c < c.sh.chunks) return;
  c.c = 0;
  c.j += c.len;
  if (c.j < c.sh.n) {
    c.len = c.sh.round(c.j, &c.part, &c.tile0);
    return;
  }
  ++c.p;
  enter(a, c);
}

// W's row for row r (0..15) of tile `tile`.
__device__ __forceinline__ int w_row(const Cursor& c, int tile, int r) {
  return c.geglu ? (r < 8 ? 8 * tile + r : c.half + 8 * tile + r - 8) : 16 * tile + r;
}
// The stage at the cursor into ring slot `slot`: cp.async, 4 copies of 16 bytes a thread; or the
// bulk copy engine, thread 0 one copy a row counted on the slot's mbarrier. `whole` (bench probe,
// skip bit 32): where the rows are one run (k = 512, no geglu), one bulk copy, unpadded (the math
// then reads the wrong layout: timing only).
template <bool kWg>
__device__ __forceinline__ void issue(const Args& a, const Cursor& c, uint16_t* ring, unsigned long long* bars,
                                      int slot) {
  if (c.p >= a.count || (a.bulk && threadIdx.x != 0)) return;
  if constexpr (kWg) {  // the round's items, 16 rows a pass; 128 columns from c.u · 128
    const int ch = int(threadIdx.x) % 16, r0 = int(threadIdx.x) / 16;
    const uint16_t* src = c.w + int64_t(c.part) * c.sh.kc + c.c * kChunk + c.u * 128 + ch * 8;
    uint16_t* dst = ring + slot * Lay<true>::kStageElems;
#pragma unroll
    for (int i = 0; i < kRound; ++i)
      if (i < c.len) cp_async16(dst + Lay<true>::w(16 * i + r0, ch * 8), src + int64_t(w_row(c, c.tile0 + i, r0)) * c.k);
    return;
  }
  const int tile = c.tile0 + c.u;
  const uint16_t* src = c.w + int64_t(c.part) * c.sh.kc + c.c * kChunk;
  uint16_t* dst = ring + slot * Lay<kWg>::kStageElems;
  if (a.bulk) {
    unsigned long long* bar = bars + slot;
    mbar_expect_tx(bar, 16 * kChunk * 2);
    if ((a.skip & 32) && c.k == kChunk && !c.geglu) {
      bulk_copy(dst, src + int64_t(16 * tile) * c.k, 16 * kChunk * 2, bar);
      return;
    }
    for (int r = 0; r < 16; ++r) bulk_copy(dst + r * kRow, src + int64_t(w_row(c, tile, r)) * c.k, kChunk * 2, bar);
    return;
  }
  if (a.skip & 128) {
    // Warps w and w + 4 copy K quarter w % 4 (16 rows × 16 copies of 16 bytes, four each a
    // thread): the quarter they alone read (stage_math), so a barrier of the pair publishes it.
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = lane + 32 * (warp >> 2) + 64 * i, r = idx >> 4, ch = 16 * (warp & 3) + (idx & 15);
      cp_async16(dst + Lay<kWg>::w(r, ch * 8), src + int64_t(w_row(c, tile, r)) * c.k + ch * 8);
    }
    return;
  }
  constexpr int kPerRow = kChunk / 8;  // 16-byte copies a row
  const int ch = int(threadIdx.x) % kPerRow, r0 = int(threadIdx.x) / kPerRow;
#pragma unroll
  for (int i = 0; i < 16 * kPerRow / kThreads; ++i) {
    const int r = r0 + i * (kThreads / kPerRow);
    cp_async16(dst + Lay<kWg>::w(r, ch * 8), src + int64_t(w_row(c, tile, r)) * c.k + ch * 8);
  }
}

// mma.sync: warps w and w + 4, which copy and read K quarter w % 4 of every stage (named barrier
// 1 + w % 4 of 64 threads).
__device__ __forceinline__ void quarter_barrier() {
  asm volatile("bar.sync %0, 64;\n" ::"r"(1 + ((int(threadIdx.x) >> 5) & 3)) : "memory");
}

// Until all but the newest n (0..6; more count as 6) cp.async groups of this thread have landed.
__device__ __forceinline__ void cp_async_wait_n(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    default: cp_async_wait<6>(); break;
  }
}

// Until the next stage (in `slot`) has landed: its mbarrier's phase (bulk), or all but the newest S − 2 of this
// thread's cp.async groups (one committed a stage).
__device__ __forceinline__ void wait_ring(const Args& a, unsigned long long* bars, int slot, unsigned parity) {
  if (a.bulk) {
    mbar_wait(bars + slot, parity);
    return;
  }
  cp_async_wait_n(a.stages - 2);
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
template <bool kWg>
__device__ void load_chunk(const Phase& P, int m, int64_t col0, uint16_t* xs, float* ss) {
  using L = Lay<kWg>;
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  if (P.flags & kInF32) {
    // Warp w takes rows w, w + 8, … (≤ 7), kRows at a time; lane l columns 4l + 128j (j < 4).
    constexpr int kRows = 4;  // 16 float4 in flight a thread: two L2 round trips a chunk
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
          st_bf4(xs + L::x(r, 4 * lane + 128 * j), v[i][j]);
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
      if (q < n) *reinterpret_cast<uint4*>(xs + L::x(q / (kChunk / 8), (q % (kChunk / 8)) * 8)) = v[u];
    }
  }
}

// Columns [col0, col0 + 512) of a bf16 input's m rows into xs by cp.async (the caller commits them
// with a ring stage and waits for that group before the chunk's math).
template <bool kWg>
__device__ __forceinline__ void copy_chunk_async(const Phase& P, int m, int64_t col0, uint16_t* xs) {
  const uint16_t* in = static_cast<const uint16_t*>(P.in);
  const int n = m * (kChunk / 8);
  for (int q = int(threadIdx.x); q < n; q += kThreads) {
    const int r = q / (kChunk / 8), c8 = q % (kChunk / 8);
    cp_async16(xs + Lay<kWg>::x(r, c8 * 8), in + int64_t(r) * P.in_stride + col0 + c8 * 8);
  }
}

// One stage against the chunk in xs: warp w takes the stage's K quarter w % 4 (eight 16-column
// MMA steps) for token tiles 0..3 (w < 4) or 4..6 (w ≥ 4; NT = 3); acc[j] is token tile
// 4·(w / 4) + j. Fragments come by ldmatrix in the MMA's register order (A: W's 16 rows × 16
// columns; B: 8 tokens × 16 columns, two tiles an x4), all of a step's before its MMAs, which go
// round the tiles (independent sums). Session 25 first had 16-byte loads rearranged by register
// moves and one tile's MMAs in a row: ~900 instructions a warp and stage, latency-bound.
template <int NT>
__device__ __forceinline__ void stage_math_nt(const uint16_t* st, const uint16_t* xs, int kq, int nh,
                                              float (&acc)[4][4]) {
  const int lane = int(threadIdx.x) & 31;
  const uint16_t* pa = st + (lane & 15) * kRow + 128 * kq + (lane >> 4) * 8;
  const uint16_t* pb = xs + (32 * nh + 8 * (lane >> 4) + (lane & 7)) * kRow + 128 * kq + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    uint32_t a[4], b[4][2];
    ldsm_x4(pa + 16 * ks, a[0], a[1], a[2], a[3]);
    ldsm_x4(pb + 16 * ks, b[0][0], b[0][1], b[1][0], b[1][1]);
    if constexpr (NT == 4) ldsm_x4(pb + 16 * kRow + 16 * ks, b[2][0], b[2][1], b[3][0], b[3][1]);
    else ldsm_x2(pb + 16 * kRow + 16 * ks, b[2][0], b[2][1]);  // lanes 0..15: tile 2's rows
#pragma unroll
    for (int j = 0; j < NT; ++j) mma(acc[j], a[0], a[1], a[2], a[3], b[j][0], b[j][1]);
  }
}
__device__ __forceinline__ void stage_math(const uint16_t* st, const uint16_t* xs, float (&acc)[4][4]) {
  const int warp = int(threadIdx.x) >> 5, kq = warp & 3, nh = warp >> 2;
  if (nh == 0) stage_math_nt<4>(st, xs, kq, nh, acc);
  else stage_math_nt<3>(st, xs, kq, nh, acc);
}
// wgmma: warpgroup g takes the stage's 64-column K half g (the chunk's slab 2·sub + g), four
// m64n64k16 steps (tokens as M, the round's 64 rows of W as N), one instruction each; waited for
// before the next barrier, so the ring slot and the input buffer can be overwritten after it.
__device__ __forceinline__ void stage_math(const uint16_t* st, const uint16_t* xs, float (&acc)[32], int sub) {
  const int g = int(threadIdx.x) >> 7;
  const uint64_t da = sw128_desc(xs + (2 * sub + g) * 64 * 64), db = sw128_desc(st + g * 64 * 64);
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < 4; ++j) wgmma_m64n64k16(acc, da + uint64_t(2 * j), db + uint64_t(2 * j));  // 32 bytes a step
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_reg_fence(acc);
}

// An item's sums over the four K quarters, in that order, and the phase's epilogue for its 16
// rows of W (tile) and the m tokens. Ends with every thread past its last read of red.
// The sums of each warp's K quarter (mma.sync) into red [quarter][16 rows][tokens].
__device__ __forceinline__ void to_red(float* red, const float (&acc)[4][4]) {
  constexpr int kRS = Lay<false>::kRS;
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
}
// The sums of each warpgroup's K half (wgmma's fragment: tokens as rows, W's rows as columns)
// into red [half][16 rows][tokens].
__device__ __forceinline__ void to_red(float* red, const float (&acc)[8]) {
  constexpr int kRS = Lay<true>::kRS;
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int half = warp >> 2, t0 = 16 * (warp & 3) + (lane >> 2), r0 = 2 * (lane & 3);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int t = t0 + 8 * ((i >> 1) & 1), r = 8 * (i >> 2) + r0 + (i & 1);
    red[(half * 16 + r) * kRS + t] = acc[i];
  }
}

template <bool kWg>
__device__ void epilogue(const Phase& P, int m, int tile, float* red, const float* ss,
                         const typename AccOf<kWg>::T& acc) {
  constexpr int kRS = Lay<kWg>::kRS;
  to_red(red, acc);
  __syncthreads();
  const bool norm = (P.flags & kNorm) != 0;
  auto sum = [&](int r, int c) {
    float s = red[r * kRS + c] + red[(16 + r) * kRS + c];
    if constexpr (Lay<kWg>::kSlices == 4) s = (s + red[(32 + r) * kRS + c]) + red[(48 + r) * kRS + c];
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

__device__ __forceinline__ void zero(float (&a)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) a[i] = 0.f;
}
__device__ __forceinline__ void zero(float (&a)[4][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) a[j][0] = a[j][1] = a[j][2] = a[j][3] = 0.f;
}

template <bool kWg>
__global__ void __launch_bounds__(kThreads, 1) expert_stream_kernel(Args a) {
  using L = Lay<kWg>;
#if !defined(VLAC_WGMMA)
  if constexpr (kWg) {  // built for a GPU without wgmma: expert_stream never launches this
    __trap();
    return;
  }
#endif
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // [x buffers][ring][red][ss][bars], from an L::kAlign boundary (wgmma's swizzle needs 1024).
  uint8_t* smem = smem_raw + ((L::kAlign - (uint32_t(__cvta_generic_to_shared(smem_raw)) & (L::kAlign - 1))) &
                              (L::kAlign - 1));
  const int S = a.stages, m = a.m;
  const int ml = (a.skip & 64) ? (m + 1) / 2 : m;  // the input rows loaded (probe: half, as a cluster of 2 would)
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* ring = xs + 2 * L::kXElems;
  float* red = reinterpret_cast<float*>(ring + S * L::kStageElems);
  float* ss = red + L::kSlices * 16 * L::kRS;
  auto* bars = reinterpret_cast<unsigned long long*>(ss + 64);
  if (a.bulk && threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) mbar_init(bars + s, 1);
    mbar_init_fence();
  }
  __syncthreads();

  // wgmma: the ring's rows past a round's items are read, their sums never stored; zeroed once so
  // that they hold numbers.
  if constexpr (kWg)
    for (int q = int(threadIdx.x); q < S * L::kStageElems / 8; q += kThreads)
      reinterpret_cast<uint4*>(ring)[q] = make_uint4(0, 0, 0, 0);
  // Token rows past m are never loaded: zero them once in both buffers (their sums are computed,
  // never stored).
  for (int q = int(threadIdx.x); q < 2 * (L::kXRows - m) * (kChunk / 8); q += kThreads) {
    const int b = q / ((L::kXRows - m) * (kChunk / 8)), e = q % ((L::kXRows - m) * (kChunk / 8));
    *reinterpret_cast<uint4*>(xs + b * L::kXElems + L::x(m + e / (kChunk / 8), 8 * (e % (kChunk / 8)))) =
        make_uint4(0, 0, 0, 0);
  }

  // The weights depend on nothing: S − 1 stages are in flight before the wait for the kernel
  // before this one, and stay S − 1 ahead of the math from then on, across every barrier.
  Cursor prod{};
  enter(a, prod);
  __syncthreads();  // (the zeroed ring before the copies into it)
  for (int s = 0; s + 1 < S; ++s) {
    issue<kWg>(a, prod, ring, bars, s);
    cp_async_commit();
    advance<kWg>(a, prod);
  }
  pdl_wait();
  // The counter may only be read once the launch before (in stream order) is complete.
  const unsigned long long base = grid_counter_base(a.sync);

  // The ring: the stage consumed next is in slot cs (its mbarrier's phase parity `par`), the next
  // issued goes to slot ps = cs − 1 mod S (the one consumed last).
  int cs = 0, ps = S - 1;
  unsigned par = 0;
  for (int pi = 0; pi < a.count; ++pi) {
    const Phase P = a.ph[pi];
    if (pi > 0 && !(a.skip & 2)) grid_barrier_counted(a.sync, base + (unsigned long long)pi * gridDim.x);
    stamp(a, pi, 0);
    const Share sh = share_of(P);
    bool stamped = false;
    for (int j0 = 0, len = 0; j0 < sh.n; j0 += len) {
      int part, tile0;
      len = sh.round(j0, &part, &tile0);
      // mma.sync: an item's sums each (acc); wgmma: the round's in one 64 × 64 fragment (accw).
      float acc[kWg ? 1 : kRound][4][4], accw[kWg ? 32 : 1];
      if constexpr (kWg) {
        zero(accw);
      } else {
#pragma unroll
        for (int u = 0; u < kRound; ++u) zero(acc[u]);
      }
      const int steps = chunk_stages<kWg>(len);
      if (threadIdx.x < kStreamTokens) ss[threadIdx.x] = 0.f;
      // bf16 inputs: chunk c + 1 of the round is copied by cp.async into the other buffer while
      // chunk c's stages run (in the group of chunk c's first stage, so it has landed once the
      // steps − 1 groups after it may still be pending). The first chunk of a round, and fp32
      // inputs (converted, and summed for the norm, on the way), load through registers.
      const bool ahead = !(P.flags & kInF32) && !(a.skip & 4);
      for (int c = 0; c < sh.chunks; ++c) {
        uint16_t* xc = xs + (c & 1) * L::kXElems;
        __syncthreads();  // every warp is done with the last chunk (and ss is zeroed)
        if (!(a.skip & 4)) {
          if (c > 0 && ahead) cp_async_wait_n(steps - 1);
          else load_chunk<kWg>(P, ml, int64_t(part) * sh.kc + int64_t(c) * kChunk, xc, ss);
        }
        if constexpr (kWg) fence_async_shared();  // the chunk's stores and copies, for wgmma's reads
        __syncthreads();
        if (!stamped) stamp(a, pi, 1), stamped = true;
#pragma unroll
        for (int u = 0; u < kRound; ++u) {
          if (u >= steps) break;
          wait_ring(a, bars, cs, par);
          // The stage is visible to its readers; slot ps (consumed last) is free again. mma.sync
          // by cp.async with probe bit 128: only the two warps of each K quarter meet (they copied
          // it, they read it); measured against the block barrier before it becomes the default.
          if constexpr (kWg) {
            fence_async_shared();
            __syncthreads();
          } else {
            if (!a.bulk && (a.skip & 128)) quarter_barrier();
            else __syncthreads();
          }
          issue<kWg>(a, prod, ring, bars, ps);
          if (u == 0 && ahead && c + 1 < sh.chunks)  // the other buffer's last reader was chunk c − 1
            copy_chunk_async<kWg>(P, ml, int64_t(part) * sh.kc + int64_t(c + 1) * kChunk,
                                  xs + ((c + 1) & 1) * L::kXElems);
          cp_async_commit();
          advance<kWg>(a, prod);
          if (!(a.skip & 1)) {
            if constexpr (kWg) stage_math(ring + cs * L::kStageElems, xc, accw, u);
            else stage_math(ring + cs * L::kStageElems, xc, acc[u]);
          }
          if (++cs == S) cs = 0, par ^= 1u;
          if (++ps == S) ps = 0;
        }
      }
      if (!(a.skip & 1)) {
#pragma unroll
        for (int u = 0; u < kRound; ++u) {
          if (u >= len) break;
          if constexpr (kWg) {
            float a8[8];  // item u's columns of the fragment: the m64n16 order
#pragma unroll
            for (int i = 0; i < 8; ++i) a8[i] = accw[8 * u + i];
            epilogue<true>(P, m, tile0 + u, red, ss, a8);
          } else {
            epilogue<false>(P, m, tile0 + u, red, ss, acc[u]);
          }
        }
      }
    }
    if (!stamped) stamp(a, pi, 1);
    stamp(a, pi, 2);
  }
  cp_async_wait<0>();  // (empty groups only: the stream ends with the last phase)
}

uint64_t smem_of(bool wgmma, int stages) {
  return wgmma ? fixed_bytes<true>() + uint64_t(stages) * stage_bytes<true>()
               : fixed_bytes<false>() + uint64_t(stages) * stage_bytes<false>();
}

bool plan_ok(const ExpertStreamPlan& p) {
  return p.m >= 1 && p.m <= kStreamTokens && p.blocks >= 1 && p.stages >= kMinStages && p.stages <= kMaxStages &&
         p.smem >= smem_of(p.wgmma, p.stages);
}

const void* kernel_of(bool wgmma) {
  return wgmma ? reinterpret_cast<const void*>(expert_stream_kernel<true>)
               : reinterpret_cast<const void*>(expert_stream_kernel<false>);
}

cudaError_t allow_smem(const ExpertStreamPlan& p) { return allow_dynamic_smem(kernel_of(p.wgmma), p.smem); }

std::string phase_error(size_t i, const std::string& what) {
  return "expert_stream: phase " + std::to_string(i) + ": " + what;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool expert_stream_wgmma_available() {
#ifdef VLAC_CUDA_SM90A
  return device_compute_capability() == 90;
#else
  return false;
#endif
}

bool expert_stream_plan(int64_t m, int sms, int64_t smem_optin, ExpertStreamPlan* out, int stages, bool wgmma) {
  if (m < 1 || m > kStreamTokens || sms < 1) return false;
  if (stages != 0 && (stages < kMinStages || stages > kMaxStages)) return false;
  const uint64_t cap = std::min<uint64_t>(uint64_t(std::max<int64_t>(smem_optin, 0)), kSmemCap);
  for (int s = stages ? stages : kMaxStages; s >= (stages ? stages : kMinStages); --s) {
    const uint64_t smem = smem_of(wgmma, s);
    if (smem > cap) continue;
    *out = ExpertStreamPlan{m, sms, s, smem, wgmma};
    return true;
  }
  return false;
}

bool expert_stream_resident(const ExpertStreamPlan& p) {
  int per_sm = 0, dev = 0, sms = 0;
  const bool ok = plan_ok(p) && (!p.wgmma || expert_stream_wgmma_available()) && allow_smem(p) == cudaSuccess &&
                  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_of(p.wgmma), kThreads,
                                                                size_t(p.smem)) == cudaSuccess &&
                  cudaGetDevice(&dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess;
  if (!ok) (void)cudaGetLastError();
  return ok && int64_t(per_sm) * sms >= p.blocks;
}

namespace {
__global__ void cluster_probe_kernel(int* count) {
  if (threadIdx.x == 0) atomicAdd(count, 1);
}
}  // namespace

int expert_stream_max_clusters(const ExpertStreamPlan& p, int cluster) {
  if (!plan_ok(p) || cluster < 1 || allow_smem(p) != cudaSuccess) return -1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(p.blocks / cluster * cluster));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(p.smem);
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = unsigned(cluster), at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
  cfg.attrs = at, cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel_of(p.wgmma), &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return n;
}

cudaError_t expert_stream_cluster_launch_probe(int blocks, int cluster, bool cooperative) {
  int* count = nullptr;
  if (cudaError_t e = cudaMalloc(&count, sizeof(int)); e != cudaSuccess) return e;
  (void)cudaMemset(count, 0, sizeof(int));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(blocks));
  cfg.blockDim = dim3(32);
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = unsigned(cluster), at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
  at[1].id = cudaLaunchAttributeCooperative;
  at[1].val.cooperative = cooperative ? 1 : 0;
  cfg.attrs = at, cfg.numAttrs = 2;
  cudaError_t e = cudaLaunchKernelEx(&cfg, cluster_probe_kernel, count);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  int got = 0;
  if (e == cudaSuccess) e = cudaMemcpy(&got, count, sizeof(int), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess && got != blocks) e = cudaErrorUnknown;
  (void)cudaGetLastError();
  cudaFree(count);
  return e;
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
  if (phases == nullptr || sync == nullptr || (reinterpret_cast<uintptr_t>(sync) & 7u) != 0)
    return invalid_argument("expert_stream: needs its phases and its sync words (8-byte aligned)");
  if (first < 0 || count < 1 || first + count > total || count > 0x7fffffff)
    return invalid_argument("expert_stream: phases [" + std::to_string(first) + ", " + std::to_string(first + count) +
                            ") are not within the " + std::to_string(total) + " uploaded");
  if (p.wgmma && !expert_stream_wgmma_available())
    return Status(StatusCode::Backend, "expert_stream: a wgmma plan needs an sm_90 GPU and a build with sm_90a code");
  if (const cudaError_t e = allow_smem(p); e != cudaSuccess)
    return Status(StatusCode::Backend,
                  "expert_stream: " + std::to_string(p.smem) + " bytes of shared memory: " + cudaGetErrorString(e));
  // cp.async; bulk copies (sm_90+, one GPU per process, the mma.sync layout) where a bench asks
  // for them (skip bit 8: measured slower on an H100, session 25).
  static const bool has_bulk = device_compute_capability() >= 90;
  const int skip = probe ? probe->skip : 0;
  const Args a{static_cast<const Phase*>(phases) + first, int(count), int(p.m), p.stages,
               has_bulk && !p.wgmma && (skip & 8) ? 1 : 0, reinterpret_cast<unsigned long long*>(sync),
               probe ? probe->stamps : nullptr, skip};
  static std::atomic<bool> no_pdl[2] = {false, false};
  if (p.wgmma)
    launch_persistent(expert_stream_kernel<true>, dim3(unsigned(p.blocks)), dim3(kThreads), size_t(p.smem), stream, a,
                      true, no_pdl[1]);
  else
    launch_persistent(expert_stream_kernel<false>, dim3(unsigned(p.blocks)), dim3(kThreads), size_t(p.smem), stream,
                      a, true, no_pdl[0]);
  return launch_status("expert_stream");
}

}  // namespace vlac::cuda
