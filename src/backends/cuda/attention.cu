// Attention for pi0.5: a bf16 tensor-core kernel (mma.sync m16n8k16, fp32 accumulation) with an
// online softmax, and an fp32 kernel for the exact-parity mode.
//
// bf16 kernel. A block owns BM = 64 rows of one KV head: the rows are (token, query head) pairs of
// the heads that share that KV head, packed token-major, so with pi0.5's one KV head the 8 query
// heads of 8 tokens fill one tile and every K/V tile is read once for all of them. Each of the 4
// warps owns 16 rows. Keys stream in tiles of BN = 64 through shared memory with cp.async (the next
// K tile loads while P·V runs, the V tile while Q·Kᵀ and the softmax run). Scores stay in registers:
// the accumulator layout of Q·Kᵀ is the A-operand layout of P·V, so P is rounded to bf16 and fed to
// the second mma without a trip through shared memory. V's B operand comes from ldmatrix.trans.
// For few rows (the expert: 50 tokens × 8 heads = 7 tiles) the keys are split across blocks
// (blockIdx.z) and the partial (o, max, sum) triples are merged by a combine kernel over partials
// in global scratch, or (opt-in, sm_90) inside the kernel, the splits of a row tile being one
// thread-block cluster (≤ 8) that reads its members' partials from their shared memory (DSMEM).
// The expert's RoPE can run inside it (AttentionRope): q and the step's own keys are rotated from
// the fused q|k|v GEMM's f32 rows as they load, which saves the rope launch of every layer.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cudnn_attention.h"
#include "backends/cuda/env.h"
#include "backends/cuda/kernels.h"

namespace vlac::cuda {
namespace {

constexpr int kBM = 64, kBN = 64, kWarps = 4, kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
struct Geom {
  static constexpr int DK = (D + 15) / 16 * 16;  // Q·Kᵀ reduction length padded to the mma's k (72 -> 80)
  static constexpr int LD = DK + 8;              // shared row stride (bf16): 16-byte rows, no bank conflicts
  static constexpr int CH = D / 8;               // 16-byte chunks per global row
  static constexpr int NT = D / 8;               // n-tiles of 8 output columns
  static constexpr size_t kSmem = size_t(3) * kBM * LD * sizeof(uint16_t);
  // With kSub groups of 4 warps walking alternate key tiles: Q, then a K and a V tile per group.
  static constexpr size_t smem(int sub) { return size_t(1 + 2 * sub) * kBM * LD * sizeof(uint16_t); }
  static_assert(D % 8 == 0 && kBM == kBN);
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;  // 0: fill the 16 bytes with zeros
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldsm_x4_t(const uint16_t* p, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  const unsigned s = unsigned(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(s));
}
__device__ __forceinline__ void ldsm_x2_t(const uint16_t* p, uint32_t& r0, uint32_t& r1) {
  const unsigned s = unsigned(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(s));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return uint32_t(f2bf(lo)) | (uint32_t(f2bf(hi)) << 16);
}
__device__ __forceinline__ uint32_t lds32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

struct Params {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  const uint8_t* allow;
  const float* add;
  void* out;
  float* part_o;  // [splits][hk][R][D] unnormalized partial outputs (splits > 1)
  float* part_ml; // [splits][hk][R][2] running max and sum
  int64_t t, h, hk, s, group, rows;  // rows = t · group
  int64_t qs, ks, vs, os;
  int64_t keys_per_split;
  int64_t early_keys;  // AttentionShape::stable_keys: a split inside [0, early_keys) loads K/V before pdl_wait
  int64_t kv_block;  // > 0: the keys of a row tile are its block's (splits == 1, tiles inside one block)
  int splits;
  bool allow_pairs;  // allow rows 2-byte aligned: mask bytes of a key pair in one 16-bit load
  float scale;
  // AttentionRope: q from f32 rows rotated as it loads, key rows >= fresh0 (= s − t) from f32 rows.
  const float* qf;
  const float* kf;
  const float* vf;
  const float* sc;
  int64_t qfs, kfs, vfs, fresh0;
};

// Loads 64 rows of a bf16 matrix into smem (stride LD): row r (< n_valid) from base + r·stride,
// rows >= n_valid zero-filled. 32-bit tile indices, the loop unrolled (CH is a constant).
// Rows [skip_lo, n_valid) are left alone (the fused RoPE's rows, stored by the threads themselves).
template <int D>
__device__ __forceinline__ void load_rows(uint16_t* sm, const uint16_t* base, int64_t stride, int n_valid, int tid,
                                          int skip_lo = kBM) {
  using G = Geom<D>;
  constexpr int kChunks = kBM * G::CH, kIters = (kChunks + kThreads - 1) / kThreads;
#pragma unroll 2
  for (int i = 0; i < kIters; ++i) {
    const int c = tid + i * kThreads;
    if (kChunks % kThreads != 0 && c >= kChunks) break;
    const int r = c / G::CH, ch = c % G::CH;
    if (r >= skip_lo && r < n_valid) continue;
    const bool ok = r < n_valid;
    cp_async16(sm + r * G::LD + ch * 8, base + (ok ? r : 0) * stride + ch * 8, ok);
  }
}

// Q rows of the tile: packed row r -> token r / group, head kvh·group + r % group. All kT
// threads of the block take part.
template <int D, int kT>
__device__ __forceinline__ void load_q(uint16_t* sm, const Params& p, int64_t kvh, int64_t row0) {
  using G = Geom<D>;
  constexpr int kChunks = kBM * G::CH, kIters = (kChunks + kT - 1) / kT;
  const int group = int(p.group);
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int c = int(threadIdx.x) + i * kT;
    if (kChunks % kT != 0 && c >= kChunks) break;
    const int r = c / G::CH, ch = c % G::CH;
    const int64_t row = row0 + r;
    const bool ok = row < p.rows;
    const int rr = ok ? int(row) : 0;
    cp_async16(sm + r * G::LD + ch * 8, p.q + int64_t(rr / group) * p.qs + (kvh * group + rr % group) * D + ch * 8, ok);
  }
}

// The fused RoPE (Params::qf): f32 rows rotated (q, the step's own k) or rounded (its v) into
// bf16 tiles by plain loads and stores, which the barrier before the tile's first read publishes.
// Each thread takes units of four pairs (i..i+3, i+half..i+half+3) of one row, in batches whose
// loads are all issued before any is used, so their latency overlaps (one L2 round trip a batch).
__device__ __forceinline__ uint2 pack4(float a, float b, float c, float d) {
  return make_uint2(pack_bf16(a, b), pack_bf16(c, d));
}
struct Rope4 {
  float4 a, b, s01, s23;  // x[i..i+3], x[half+i..], (sin, cos) of i, i+1 and of i+2, i+3
};
__device__ __forceinline__ Rope4 rope4_load(const float* x, int half, const float* sc) {
  return {*reinterpret_cast<const float4*>(x), *reinterpret_cast<const float4*>(x + half),
          *reinterpret_cast<const float4*>(sc), *reinterpret_cast<const float4*>(sc + 4)};
}
// rope_to's bits: rotate, then one rounding to bf16, at d0 (i..i+3) and d0 + half.
__device__ __forceinline__ void rope4_store(const Rope4& l, int half, uint16_t* d0) {
  float y0[4], y1[4];
  rotate(l.a.x, l.b.x, l.s01.x, l.s01.y, &y0[0], &y1[0]);
  rotate(l.a.y, l.b.y, l.s01.z, l.s01.w, &y0[1], &y1[1]);
  rotate(l.a.z, l.b.z, l.s23.x, l.s23.y, &y0[2], &y1[2]);
  rotate(l.a.w, l.b.w, l.s23.z, l.s23.w, &y0[3], &y1[3]);
  *reinterpret_cast<uint2*>(d0) = pack4(y0[0], y0[1], y0[2], y0[3]);
  *reinterpret_cast<uint2*>(d0 + half) = pack4(y1[0], y1[1], y1[2], y1[3]);
}
constexpr int kQBatch = 4, kKBatch = 2, kVBatch = 4;  // units a thread has in flight (4, 4, 1 float4 each)

// Q with the RoPE fused: rows of the tile packed as load_q's, rows past p.rows zero.
template <int D, int kT>
__device__ __forceinline__ void load_q_rope(uint16_t* sm, const Params& p, int64_t kvh, int64_t row0) {
  using G = Geom<D>;
  constexpr int kHalf = D / 2, kQuads = kHalf / 4, kUnits = kBM * kQuads;
  static_assert(kHalf % 4 == 0);
  const int group = int(p.group);
  for (int b = int(threadIdx.x); b < kUnits; b += kT * kQBatch) {
    Rope4 l[kQBatch];
#pragma unroll
    for (int j = 0; j < kQBatch; ++j) {
      const int u = b + j * kT, r = u / kQuads, i = (u % kQuads) * 4;
      const int64_t row = row0 + r;
      if (u >= kUnits || row >= p.rows) continue;
      const int64_t tok = row / group;
      l[j] = rope4_load(p.qf + tok * p.qfs + (kvh * group + row % group) * D + i, kHalf, p.sc + (tok * kHalf + i) * 2);
    }
#pragma unroll
    for (int j = 0; j < kQBatch; ++j) {
      const int u = b + j * kT, r = u / kQuads, i = (u % kQuads) * 4;
      if (u >= kUnits) continue;
      uint16_t* d0 = sm + r * G::LD + i;
      if (row0 + r < p.rows) {
        rope4_store(l[j], kHalf, d0);
      } else {
        *reinterpret_cast<uint2*>(d0) = make_uint2(0u, 0u);
        *reinterpret_cast<uint2*>(d0 + kHalf) = make_uint2(0u, 0u);
      }
    }
  }
}

// The first of a tile's rows (key0 on, n_valid of them) that the fused RoPE supplies: n_valid
// when none does.
__device__ __forceinline__ int first_fresh(const Params& p, int64_t key0, int n_valid) {
  if (!p.kf || key0 + n_valid <= p.fresh0) return n_valid;
  return p.fresh0 > key0 ? int(p.fresh0 - key0) : 0;
}

// Rows [f0, n_valid) of the K and V tiles whose first key is key0 (either may be null: not this
// time), by kT threads (index t): k rotated, v rounded, from the step's own f32 rows (token
// key − fresh0).
template <int D, int kT>
__device__ __forceinline__ void fresh_rows(uint16_t* Ks, uint16_t* Vs, const Params& p, int64_t kvh, int64_t key0,
                                           int f0, int n_valid, int t) {
  using G = Geom<D>;
  constexpr int kHalf = D / 2, kKQ = kHalf / 4, kVQ = D / 4;
  const int ku = (n_valid - f0) * kKQ, vu = (n_valid - f0) * kVQ;
  const int64_t tok0 = key0 - p.fresh0;
  for (int b = t; Ks && b < ku; b += kT * kKBatch) {
    Rope4 l[kKBatch];
#pragma unroll
    for (int j = 0; j < kKBatch; ++j) {
      const int u = b + j * kT, r = f0 + u / kKQ, i = (u % kKQ) * 4;
      if (u < ku)
        l[j] = rope4_load(p.kf + (tok0 + r) * p.kfs + kvh * D + i, kHalf, p.sc + ((tok0 + r) * kHalf + i) * 2);
    }
#pragma unroll
    for (int j = 0; j < kKBatch; ++j) {
      const int u = b + j * kT, r = f0 + u / kKQ, i = (u % kKQ) * 4;
      if (u < ku) rope4_store(l[j], kHalf, Ks + r * G::LD + i);
    }
  }
  for (int b = t; Vs && b < vu; b += kT * kVBatch) {
    float4 x[kVBatch];
#pragma unroll
    for (int j = 0; j < kVBatch; ++j) {
      const int u = b + j * kT, r = f0 + u / kVQ, i = (u % kVQ) * 4;
      if (u < vu) x[j] = *reinterpret_cast<const float4*>(p.vf + (tok0 + r) * p.vfs + kvh * D + i);
    }
#pragma unroll
    for (int j = 0; j < kVBatch; ++j) {
      const int u = b + j * kT, r = f0 + u / kVQ, i = (u % kVQ) * 4;
      if (u < vu) *reinterpret_cast<uint2*>(Vs + r * G::LD + i) = pack4(x[j].x, x[j].y, x[j].z, x[j].w);
    }
  }
}

// A K or V tile by cp.async, less the rows the fused RoPE supplies (first_fresh on).
template <int D, bool kIsK, bool kRope>
__device__ __forceinline__ void load_kv(uint16_t* sm, const Params& p, int64_t kvh, int64_t key0, int n_valid, int tid) {
  const int64_t stride = kIsK ? p.ks : p.vs;
  load_rows<D>(sm, (kIsK ? p.k : p.v) + kvh * D + key0 * stride, stride, n_valid, tid,
               kRope ? first_fresh(p, key0, n_valid) : kBM);
}

// Hopper allows clusters of 16 blocks where the kernel opts in (non-portable size); launch_bf16
// checks that a 16-block cluster of this kernel can be resident and uses 8 (portable) otherwise.
constexpr int kMaxClusterSplits = 16;
constexpr int kPortableClusterSplits = 8;

// The splits of one row tile as a cluster: each member leaves its unnormalised o and (max, sum)
// in its shared memory, then merges rows [rank·64/splits, ...) of the tile over all members with
// the combine kernel's arithmetic (the same weights, summed in split order).
// With kSub key groups, group 0 holds the block's merged result and every group's warps share the
// merge (all threads take part in the barriers).
template <int D, typename To, int kSub = 1>
__device__ __forceinline__ void cluster_combine(const Params& p, uint16_t* smem, const float (&o)[Geom<D>::NT][4],
                                                const float (&m)[2], const float (&l)[2], int64_t kvh, int64_t row0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  using G = Geom<D>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;  // warp: over all groups
  const int g = lane >> 2, tq = lane & 3;
  __syncthreads();  // every warp is done with the K/V tiles (and the groups' merge): their space holds the partials now
  float* so = reinterpret_cast<float*>(smem);  // [kBM][D]
  float* sml = so + kBM * D;                   // [kBM][2]
  if (warp < kWarps) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int lr = warp * 16 + g + 8 * i;
#pragma unroll
      for (int j = 0; j < G::NT; ++j)
        *reinterpret_cast<float2*>(so + lr * D + j * 8 + tq * 2) = make_float2(o[j][2 * i], o[j][2 * i + 1]);
      if (tq == 0) sml[lr * 2] = m[i], sml[lr * 2 + 1] = l[i];
    }
  }
  cluster.sync();
  const int splits = p.splits, rank = int(blockIdx.z);
  const int per = (kBM + splits - 1) / splits;
  const int lr_end = min(kBM, (rank + 1) * per);
  for (int lr = rank * per + warp; lr < lr_end; lr += kWarps * kSub) {
    const int64_t r = row0 + lr;
    if (r >= p.rows) break;
    float ms = -INFINITY, ls = 0.0f;
    if (lane < splits) {
      const float* rm = cluster.map_shared_rank(sml, lane);
      ms = rm[lr * 2], ls = rm[lr * 2 + 1];
    }
    float mx = ms;
    for (int x = 16; x > 0; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
    const float e = ms == -INFINITY ? 0.0f : exp2f((ms - mx) * kLog2e);
    float den = 0.0f + e * ls;
    for (int x = 16; x > 0; x >>= 1) den += __shfl_xor_sync(0xffffffffu, den, x);
    const float w = e / den;
    float wv[kMaxClusterSplits];  // every lane takes part in the shuffles (not all have columns)
#pragma unroll
    for (int sp = 0; sp < kMaxClusterSplits; ++sp) wv[sp] = __shfl_sync(0xffffffffu, w, sp);
    To* dst = static_cast<To*>(p.out) + (r / p.group) * p.os + (kvh * p.group + r % p.group) * D;
    for (int c0 = lane * 4; c0 < D; c0 += 128) {  // 4 columns per lane per pass
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int sp = 0; sp < kMaxClusterSplits; ++sp) {
        if (sp >= splits) break;
        const float wsp = wv[sp];
        const float4 v = *reinterpret_cast<const float4*>(cluster.map_shared_rank(so, sp) + lr * D + c0);
        acc[0] += wsp * v.x, acc[1] += wsp * v.y, acc[2] += wsp * v.z, acc[3] += wsp * v.w;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) st(dst, c0 + i, acc[i]);
    }
  }
  cluster.sync();  // no member leaves while another still reads its shared memory
#else
  (void)p, (void)smem, (void)o, (void)m, (void)l, (void)kvh, (void)row0;
#endif
}

// kSub > 1: kSub groups of 4 warps own the same 64 rows and walk alternate key tiles (group i
// takes tiles i, i + kSub, ...), each with its own K and V tiles in shared memory; their (o, max,
// sum) are merged through shared memory at the end. With pi0.5's prefix (121 row tiles on 132
// multiprocessors) that puts 8 warps instead of 4 on each multiprocessor without splitting the keys
// across blocks (no partials in global memory, no combine kernel).
// kRope: the expert's fused RoPE (Params::qf, AttentionRope), a kernel of its own so that the
// others keep their registers (its loads in flight cost the accumulators some spills).
template <int D, typename To, bool kCluster, int kSub = 1, bool kRope = false>
__global__ void __launch_bounds__(kThreads * kSub) attn_bf16_kernel(Params p) {
  using G = Geom<D>;
  extern __shared__ __align__(16) uint16_t smem[];
  const int sub = kSub > 1 ? int(threadIdx.x) / kThreads : 0;
  const int tid = kSub > 1 ? int(threadIdx.x) % kThreads : int(threadIdx.x);
  uint16_t* Qs = smem;
  uint16_t* Ks = Qs + kBM * G::LD + sub * 2 * kBN * G::LD;
  uint16_t* Vs = Ks + kBN * G::LD;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, tq = lane & 3;
  const int64_t kvh = blockIdx.y;
  const int64_t row0 = int64_t(blockIdx.x) * kBM;
  const int64_t k_begin =
      p.kv_block > 0 ? row0 / p.group / p.kv_block * p.kv_block : int64_t(blockIdx.z) * p.keys_per_split;
  const int64_t k_end = min(p.s, k_begin + (p.kv_block > 0 ? p.kv_block : p.keys_per_split));
  constexpr int64_t kStep = int64_t(kBN) * kSub;
  const int64_t k_first = k_begin + int64_t(sub) * kBN;       // this group's first tile
  const int64_t iters = (k_end - k_begin + kStep - 1) / kStep;  // the same for every group
  // The first K/V tiles of every group. Keys below early_keys do not depend on the kernel before
  // this one: a split wholly inside them issues those loads before it waits (AttentionShape::
  // stable_keys), Q after the wait in a group of its own; otherwise Q joins the K tile's group.
  const auto first_kv = [&] {
    const bool have = k_first < k_end;  // a group past the last tile loads zeros and reads nothing
    const int64_t at = have ? k_first : 0;
    const int nv = have ? int(min(k_end - k_first, int64_t(kBN))) : 0;
    load_kv<D, true, kRope>(Ks, p, kvh, at, nv, tid);
    cp_commit();
    load_kv<D, false, kRope>(Vs, p, kvh, at, nv, tid);
    cp_commit();
  };
  const bool early = !kRope && k_end <= p.early_keys;
  if (early) first_kv();
  pdl_wait();

  // Zero the padding columns [D, DK) of Q and of the group's K tile once (cp.async never writes them).
  if constexpr (G::DK > D) {
    for (int i = tid; i < kBM * (G::DK - D); i += kThreads) {
      const int r = i / (G::DK - D), c = D + i % (G::DK - D);
      Ks[r * G::LD + c] = 0;
      if (sub == 0) Qs[r * G::LD + c] = 0;
    }
  }
  if constexpr (!kRope) load_q<D, kThreads * kSub>(Qs, p, kvh, row0);
  if (early) {
    cp_commit();
    cp_wait<0>();  // Q and the early K/V: the loop's first wait then finds nothing in flight
  } else {
    first_kv();
  }
  if constexpr (kRope) {
    // The fused RoPE while the first K/V tiles are in flight: q, then the step's own keys of every
    // group's first tile, by all the block's threads (they sit in one split's tiles: spread thin).
    load_q_rope<D, kThreads * kSub>(Qs, p, kvh, row0);
#pragma unroll
    for (int sg = 0; sg < kSub; ++sg) {
      const int64_t at = k_begin + int64_t(sg) * kBN;
      const int nv = at < k_end ? int(min(k_end - at, int64_t(kBN))) : 0;
      const int f0 = first_fresh(p, at, nv);
      uint16_t* ks = Qs + kBM * G::LD + sg * 2 * kBN * G::LD;
      if (f0 < nv) fresh_rows<D, kThreads * kSub>(ks, ks + kBN * G::LD, p, kvh, at, f0, nv, int(threadIdx.x));
    }
  }

  // This thread's two rows (g and g + 8 of the warp's 16) and their tokens (for the mask).
  const int64_t rr[2] = {row0 + warp * 16 + g, row0 + warp * 16 + g + 8};
  const int64_t tok[2] = {min(rr[0], p.rows - 1) / p.group, min(rr[1], p.rows - 1) / p.group};
  const uint8_t* allow_row[2] = {p.allow ? p.allow + tok[0] * p.s : nullptr, p.allow ? p.allow + tok[1] * p.s : nullptr};
  const float* add_row[2] = {p.add ? p.add + tok[0] * p.s : nullptr, p.add ? p.add + tok[1] * p.s : nullptr};

  float o[G::NT][4];
#pragma unroll
  for (int j = 0; j < G::NT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int64_t it = 0; it < iters; ++it) {
    // Every group passes every barrier; a group whose tile lies past the end computes nothing.
    const int64_t kt = k_first + it * kStep;
    const bool have = kt < k_end;
    const bool more = kt + kStep < k_end;
    cp_wait<1>();  // Q and this K tile have landed (this V tile may still be in flight)
    __syncthreads();
    float s[kBN / 8][4];
#pragma unroll
    for (int n = 0; n < kBN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    if (have) {
#pragma unroll
      for (int kk = 0; kk < G::DK / 16; ++kk) {
        const uint16_t* qa = Qs + (warp * 16 + g) * G::LD + kk * 16 + tq * 2;
        const uint32_t a[4] = {lds32(qa), lds32(qa + 8 * G::LD), lds32(qa + 8), lds32(qa + 8 * G::LD + 8)};
#pragma unroll
        for (int n = 0; n < kBN / 8; ++n) {
          const uint16_t* kb = Ks + (n * 8 + g) * G::LD + kk * 16 + tq * 2;
          mma_bf16(s[n], a, lds32(kb), lds32(kb + 8));
        }
      }
    }  // have
    __syncthreads();  // every warp is done with this K tile
    if (more) {  // (the fused RoPE's rows of a later tile by this group: not pi0.5's case, one tile a group)
      const int nv = int(min(k_end - kt - kStep, int64_t(kBN)));
      load_kv<D, true, kRope>(Ks, p, kvh, kt + kStep, nv, tid);
      const int f0 = kRope ? first_fresh(p, kt + kStep, nv) : nv;
      if (f0 < nv) fresh_rows<D, kThreads>(Ks, nullptr, p, kvh, kt + kStep, f0, nv, tid);
    }
    cp_commit();  // (an empty group at the last tile keeps the wait counts uniform)
    uint32_t pa[kBN / 16][4];
    if (have) {
      // Scale and mask in fp32 (the CPU's order: s·scale, then + mask), then the online softmax.
      // The mask kind is uniform over the block, so its branch sits outside the element loops.
      const int nvalid = int(min(k_end - kt, int64_t(kBN)));
      if (p.allow_pairs && nvalid == kBN) {
        // Keys kofs, kofs + 1 of a pair are adjacent bytes at an even offset: one 16-bit load.
#pragma unroll
        for (int n = 0; n < kBN / 8; ++n)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const uint16_t pair = *reinterpret_cast<const uint16_t*>(allow_row[i] + kt + n * 8 + tq * 2);
            s[n][2 * i] = s[n][2 * i] * p.scale + ((pair & 0xffu) ? 0.0f : kMaskValue);
            s[n][2 * i + 1] = s[n][2 * i + 1] * p.scale + ((pair >> 8) ? 0.0f : kMaskValue);
          }
      } else if (allow_row[0]) {
#pragma unroll
        for (int n = 0; n < kBN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int kofs = min(n * 8 + tq * 2 + (e & 1), nvalid - 1);
            s[n][e] = s[n][e] * p.scale + (allow_row[e >> 1][kt + kofs] ? 0.0f : kMaskValue);
          }
      } else if (add_row[0]) {
#pragma unroll
        for (int n = 0; n < kBN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int kofs = min(n * 8 + tq * 2 + (e & 1), nvalid - 1);
            s[n][e] = s[n][e] * p.scale + add_row[e >> 1][kt + kofs];
          }
      } else {
#pragma unroll
        for (int n = 0; n < kBN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] *= p.scale;
      }
      if (nvalid < kBN) {  // the split's last, partial tile: keys past its end get no weight at all
#pragma unroll
        for (int n = 0; n < kBN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (n * 8 + tq * 2 + (e & 1) >= nvalid) s[n][e] = -INFINITY;
      }
      float m_use[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < kBN / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[i], mx);
        m_use[i] = m_new == -INFINITY ? 0.0f : m_new;  // all keys absent so far: keep exp() finite
        const float corr = exp2f((m[i] - m_use[i]) * kLog2e);
        m[i] = m_new;
        l[i] *= corr;
#pragma unroll
        for (int j = 0; j < G::NT; ++j) o[j][2 * i] *= corr, o[j][2 * i + 1] *= corr;
      }
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n) {
        float e4[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          e4[e] = exp2f((s[n][e] - m_use[e >> 1]) * kLog2e);
          l[e >> 1] += e4[e];
        }
        // C fragment of n-tile n -> half of the A fragment of key step n/2 (lerobot's rounding of P).
        pa[n / 2][(n & 1) * 2 + 0] = pack_bf16(e4[0], e4[1]);
        pa[n / 2][(n & 1) * 2 + 1] = pack_bf16(e4[2], e4[3]);
      }
    }  // have
    if (more) cp_wait<1>(); else cp_wait<0>();  // this V tile has landed
    __syncthreads();
    if (have) {
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        // ldmatrix.trans: lanes 0-7 address keys 0-7, 8-15 keys 8-15 (cols j..j+7), 16-31 the same for cols +8.
        const uint16_t* vb = Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * G::LD + (lane >> 4) * 8;
#pragma unroll
        for (int j = 0; j + 1 < G::NT; j += 2) {
          uint32_t b0, b1, b2, b3;
          ldsm_x4_t(vb + j * 8, b0, b1, b2, b3);
          mma_bf16(o[j], pa[kk], b0, b1);
          mma_bf16(o[j + 1], pa[kk], b2, b3);
        }
        if constexpr (G::NT % 2 == 1) {
          uint32_t b0, b1;
          ldsm_x2_t(Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * G::LD + (G::NT - 1) * 8, b0, b1);
          mma_bf16(o[G::NT - 1], pa[kk], b0, b1);
        }
      }
    }  // have
    __syncthreads();  // every warp is done with this V tile
    if (more) {
      const int nv = int(min(k_end - kt - kStep, int64_t(kBN)));
      load_kv<D, false, kRope>(Vs, p, kvh, kt + kStep, nv, tid);
      const int f0 = kRope ? first_fresh(p, kt + kStep, nv) : nv;
      if (f0 < nv) fresh_rows<D, kThreads>(nullptr, Vs, p, kvh, kt + kStep, f0, nv, tid);
    }
    cp_commit();
  }
  cp_wait<0>();

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  if constexpr (kSub > 1) {
    // The groups' results for the same rows: the others leave theirs in the K/V tiles' space
    // (thread-major, so each thread reads back exactly what its twin wrote), group 0 merges.
    static_assert(size_t(G::NT * 4 + 4) * kThreads * (kSub - 1) * sizeof(float) <=
                      size_t(2 * kSub) * kBN * G::LD * sizeof(uint16_t),
                  "the groups' partials fit in the tiles' space");
    float* so = reinterpret_cast<float*>(smem + kBM * G::LD);
    constexpr int kPer = G::NT * 4 + 4;
    __syncthreads();  // every group is done with every K/V tile
    if (sub > 0) {
      float* mine = so + size_t(sub - 1) * kPer * kThreads;
#pragma unroll
      for (int j = 0; j < G::NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(j * 4 + e) * kThreads + tid] = o[j][e];
      mine[(G::NT * 4 + 0) * kThreads + tid] = m[0];
      mine[(G::NT * 4 + 1) * kThreads + tid] = m[1];
      mine[(G::NT * 4 + 2) * kThreads + tid] = l[0];
      mine[(G::NT * 4 + 3) * kThreads + tid] = l[1];
    }
    __syncthreads();
    if (sub > 0 && !kCluster) return;  // (in a cluster every thread takes part in its barriers)
#pragma unroll
    for (int gs = 1; gs < kSub; ++gs) {
      if (sub > 0) break;
      const float* other = so + size_t(gs - 1) * kPer * kThreads;
      float c0[2], c1[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float m1 = other[(G::NT * 4 + i) * kThreads + tid], l1 = other[(G::NT * 4 + 2 + i) * kThreads + tid];
        const float mm = fmaxf(m[i], m1);
        const float mu = mm == -INFINITY ? 0.0f : mm;
        c0[i] = exp2f((m[i] - mu) * kLog2e);
        c1[i] = exp2f((m1 - mu) * kLog2e);
        l[i] = l[i] * c0[i] + l1 * c1[i];
        m[i] = mm;
      }
#pragma unroll
      for (int j = 0; j < G::NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[j][e] = o[j][e] * c0[e >> 1] + other[(j * 4 + e) * kThreads + tid] * c1[e >> 1];
    }
  }
  if constexpr (kCluster) {
    cluster_combine<D, To, kSub>(p, smem, o, m, l, kvh, row0);
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t r = rr[i];
      if (r >= p.rows) continue;
      if (p.splits == 1) {
        const float inv = 1.0f / l[i];
        To* dst = static_cast<To*>(p.out) + (r / p.group) * p.os + (kvh * p.group + r % p.group) * D;
#pragma unroll
        for (int j = 0; j < G::NT; ++j) {
          st(dst, j * 8 + tq * 2, o[j][2 * i] * inv);
          st(dst, j * 8 + tq * 2 + 1, o[j][2 * i + 1] * inv);
        }
      } else {
        const int64_t slot = (int64_t(blockIdx.z) * p.hk + kvh) * p.rows + r;
        float* dst = p.part_o + slot * D;
#pragma unroll
        for (int j = 0; j < G::NT; ++j)
          *reinterpret_cast<float2*>(dst + j * 8 + tq * 2) = make_float2(o[j][2 * i], o[j][2 * i + 1]);
        if (tq == 0) {
          p.part_ml[slot * 2] = m[i];
          p.part_ml[slot * 2 + 1] = l[i];
        }
      }
    }
  }
}

// Merges the partial results of the key splits: o = Σ_s e^(m_s − M)·o_s / Σ_s e^(m_s − M)·l_s.
// One block per (row, KV head): the first warp turns the splits' (max, sum) pairs into weights in
// shared memory (one split per lane), then each thread sums its columns over the splits with the
// loads unrolled, so they are in flight together instead of one L2 round trip per split.
constexpr int kMaxSplits = 64;
template <typename To>
__global__ void __launch_bounds__(256) attn_combine_kernel(const float* part_o, const float* part_ml, To* out,
                                                            int64_t rows, int64_t hk, int64_t group, int64_t d,
                                                            int64_t os, int splits) {
  pdl_wait();
  __shared__ float wgt[kMaxSplits];
  const int64_t r = blockIdx.x, kvh = blockIdx.y;
  if (threadIdx.x < 32) {
    float ms[kMaxSplits / 32], ls[kMaxSplits / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) {
      const int sp = int(threadIdx.x) + 32 * i;
      const float* ml = part_ml + ((sp * hk + kvh) * rows + r) * 2;
      ms[i] = sp < splits ? ml[0] : -INFINITY;
      ls[i] = sp < splits ? ml[1] : 0.0f;
      mx = fmaxf(mx, ms[i]);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float den = 0.0f, e[kMaxSplits / 32];
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) {
      e[i] = ms[i] == -INFINITY ? 0.0f : exp2f((ms[i] - mx) * kLog2e);
      den += e[i] * ls[i];
    }
    for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) wgt[threadIdx.x + 32 * i] = e[i] / den;
  }
  __syncthreads();
  To* dst = out + (r / group) * os + (kvh * group + r % group) * d;
  const float* po = part_o + (kvh * rows + r) * d;
  const int64_t split_stride = hk * rows * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.0f;
    int sp = 0;
    for (; sp + 8 <= splits; sp += 8) {
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = po[(sp + i) * split_stride + c];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc += wgt[sp + i] * v[i];
    }
    for (; sp < splits; ++sp) acc += wgt[sp] * po[sp * split_stride + c];
    st(dst, c, acc);
  }
}

// fp32 attention: one warp per (token, query head) row, online softmax over the keys one at a time;
// each lane holds head dims lane, lane + 32, ... (up to 256). Exact-parity mode: expf, fp32 throughout.
template <typename To>
__global__ void __launch_bounds__(128) attn_f32_kernel(const float* q, const float* k, const float* v,
                                                        const uint8_t* allow, const float* add, To* out, int64_t t,
                                                        int64_t h, int64_t hk, int64_t s, int64_t dh, int64_t dv,
                                                        int64_t qs, int64_t ks, int64_t vs, int64_t os, float scale) {
  pdl_wait();
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;
  if (row >= t * h) return;
  const int64_t tok = row / h, hd = row % h, kvh = hd / (h / hk);
  float qr[8], acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t d = lane + 32 * i;
    qr[i] = d < dh ? q[tok * qs + hd * dh + d] : 0.0f;
    acc[i] = 0.0f;
  }
  const float* kb = k + kvh * dh;
  const float* vb = v + kvh * dv;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = 0; j < s; ++j) {
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < dh) part += qr[i] * kb[j * ks + d];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    float x = part * scale;
    if (allow) x += allow[tok * s + j] ? 0.0f : kMaskValue;
    else if (add) x += add[tok * s + j];
    if (x > m) {
      const float corr = expf(m - x);
      l *= corr;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] *= corr;
      m = x;
    }
    const float e = expf(x - m);
    l += e;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < dv) acc[i] += e * vb[j * vs + d];
    }
  }
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < dv) st(out + tok * os + hd * dv, d, acc[i] * inv);
  }
}

struct Dense {
  int64_t qs, ks, vs, os;
};
Dense strides(const AttentionShape& a) {
  return {a.q_stride ? a.q_stride : a.h * a.dh, a.k_stride ? a.k_stride : a.hk * a.dh,
          a.v_stride ? a.v_stride : a.hk * a.dv, a.o_stride ? a.o_stride : a.h * a.dv};
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Keys per split for `splits` requested splits: whole tiles, so no split is empty.
int64_t keys_per_split(int64_t s, int splits) {
  return cdiv(cdiv(s, kBN), std::max(1, splits)) * kBN;
}

// sm_90 can merge the splits inside the kernel (cluster_combine), opt-in with VLAC_ATTN_CLUSTER=1:
// on the H200 it is correct (test_cuda) but whole recorded chunks ran 0.6 ms slower with it (24.26 /
// 24.42 ms against 23.71 / 23.79 ms with 16 splits and the combine kernel, alternated in one
// session-9 run): 8 splits leave half the multiprocessors idle and each block walks two key tiles.
bool cluster_combine_available() {
  static const bool on = [] {
    if (!env_on("VLAC_ATTN_CLUSTER")) return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) !=
                                                  cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return on;
}

// The largest cluster of the expert's kernel (D = 256, bf16 out) that can be resident, capped at
// kMaxClusterSplits; kPortableClusterSplits where the query fails.
template <int kSub = 1>
int max_cluster_splits() {
  static const int n = [] {
    using G = Geom<256>;
    auto* k = attn_bf16_kernel<256, uint16_t, true, kSub>;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(G::smem(kSub))) != cudaSuccess ||
        cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      (void)cudaGetLastError();
      return kPortableClusterSplits;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, 1, unsigned(kMaxClusterSplits));
    cfg.blockDim = dim3(kThreads * kSub);
    cfg.dynamicSmemBytes = G::smem(kSub);
    int size = 0;
    if (cudaOccupancyMaxPotentialClusterSize(&size, k, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      return kPortableClusterSplits;
    }
    return std::max(2, std::min(size, kMaxClusterSplits));
  }();
  return n;
}

// Groups of 4 warps per block walking alternate key tiles (the kernel's kSub): 2 for head dim 256
// where a block's keys span at least 2 tiles and the blocks alone would leave each multiprocessor
// one block of 4 warps at most: pi0.5's prefix (121 row tiles, 968 keys) and the expert, whose
// keys attention_splits then cuts into 8 splits of 2 tiles instead of 16 of one (half the
// partials for the combine). H200, session 12: prefix LM 8.10 -> 7.86 ms per chunk, the expert's
// steps 11.9 -> 11.6 ms (eager); SigLIP (head dim 72, 192 tiles) ran slower with it (3.32 -> 3.46
// ms). VLAC_ATTN_SUB=1 never, =2 wherever a block has 2 tiles or more (a measurement knob). Read
// at every launch (host code that a recorded chunk does not run again), so the harness can take
// both paths in one process.
int attention_sub_setting() {
  const int64_t n = env_count("VLAC_ATTN_SUB", 0);
  return n == 1 || n == 2 ? int(n) : 0;
}
int subgroups(const Params& p, int d, int sms) {
  const int64_t keys = p.kv_block > 0 ? p.kv_block : p.keys_per_split;
  if (keys < 2 * kBN || attention_sub_setting() == 1) return 1;
  if (attention_sub_setting() == 2) return 2;
  const int64_t blocks = cdiv(p.rows, kBM) * p.hk * p.splits;
  return d == 256 && blocks <= sms ? 2 : 1;
}

// The splits of each row tile as one thread-block cluster (cluster_combine merges them), with
// programmatic dependent launch where it is on.
template <typename K>
Status launch_cluster(K kernel, dim3 grid, int threads, size_t smem, cudaStream_t stream, const Params& p,
                      const char* what) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = 1, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = unsigned(p.splits);
  at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  (void)cudaLaunchKernelEx(&cfg, kernel, p);
  return launch_status(what);
}

// A timing probe for split attention (the expert's), never a mode to run a policy in:
// VLAC_ATTN_PROBE=1 launches the splits' kernel without the combine, =2 the combine alone, so
// that a recorded chunk's difference from the whole tells what each launch costs (the outputs
// are wrong). Read at every launch, like attention_sub_setting.
int attention_probe() { return int(env_count("VLAC_ATTN_PROBE", 0)); }

// The combine kernel over the splits' partials (splits > 1, no cluster).
template <int D, typename To>
Status launch_combine(cudaStream_t stream, const Params& p) {
  if (p.splits <= 1 || attention_probe() == 1) return Status::ok();
  launch(attn_combine_kernel<To>, dim3(unsigned(p.rows), unsigned(p.hk)), 256, 0, stream,
      p.part_o, p.part_ml, static_cast<To*>(p.out), p.rows, p.hk, p.group, D, p.os, p.splits);
  return launch_status("attention_combine");
}

template <int D, typename To>
Status launch_bf16(cudaStream_t stream, Params p, int sms) {
  using G = Geom<D>;
  if (p.qf) {  // the fused RoPE's kernels (no cluster merge: the combine kernel)
    static const cudaError_t attr_r = [] {
      cudaError_t e = cudaFuncSetAttribute(attn_bf16_kernel<D, To, false, 1, true>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(G::smem(1)));
      if (e == cudaSuccess)
        e = cudaFuncSetAttribute(attn_bf16_kernel<D, To, false, 2, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(G::smem(2)));
      return e;
    }();
    if (attr_r != cudaSuccess) {
      (void)cudaGetLastError();
      return Status(StatusCode::Backend, std::string("attention_bf16 (fused RoPE): ") + cudaGetErrorString(attr_r));
    }
    const int sub = subgroups(p, D, sms);
    const dim3 grid(unsigned(cdiv(p.rows, kBM)), unsigned(p.hk), unsigned(p.splits));
    launch(sub == 2 ? attn_bf16_kernel<D, To, false, 2, true> : attn_bf16_kernel<D, To, false, 1, true>, grid,
           sub * kThreads, G::smem(sub), stream, p);
    VLAC_RETURN_IF_ERROR(launch_status("attention_bf16 (fused RoPE)"));
    return launch_combine<D, To>(stream, p);
  }
  if (subgroups(p, D, sms) == 2) {
    static const cudaError_t attr2 = cudaFuncSetAttribute(
        attn_bf16_kernel<D, To, false, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(G::smem(2)));
    if (attr2 != cudaSuccess) {
      (void)cudaGetLastError();
      return Status(StatusCode::Backend, std::string("attention_bf16: shared memory of ") +
                                             std::to_string(G::smem(2)) + " bytes: " + cudaGetErrorString(attr2));
    }
    const dim3 grid(unsigned(cdiv(p.rows, kBM)), unsigned(p.hk), unsigned(p.splits));
    if constexpr (D == 256) {
      if (p.splits > 1 && cluster_combine_available() && p.splits <= max_cluster_splits<2>()) {
        // The splits of a row tile as one cluster, merged over DSMEM (cluster_combine): no combine kernel.
        static const cudaError_t attr_c = [] {
          cudaError_t e = cudaFuncSetAttribute(attn_bf16_kernel<D, To, true, 2>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, int(G::smem(2)));
          if (e == cudaSuccess)
            e = cudaFuncSetAttribute(attn_bf16_kernel<D, To, true, 2>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
          return e;
        }();
        if (attr_c != cudaSuccess) {
          (void)cudaGetLastError();
          return Status(StatusCode::Backend, std::string("attention_bf16 (cluster, 2 key groups): ") + cudaGetErrorString(attr_c));
        }
        return launch_cluster(attn_bf16_kernel<D, To, true, 2>, grid, 2 * kThreads, G::smem(2), stream, p,
                              "attention_bf16 (cluster, 2 key groups)");
      }
    }
    if (p.splits <= 1 || attention_probe() != 2)
      launch(attn_bf16_kernel<D, To, false, 2>, grid, 2 * kThreads, G::smem(2), stream, p);
    VLAC_RETURN_IF_ERROR(launch_status("attention_bf16 (2 key groups)"));
    return launch_combine<D, To>(stream, p);
  }
  const bool cluster = p.splits > 1 && cluster_combine_available() && p.splits <= max_cluster_splits();
  static const cudaError_t attr = [] {
    cudaError_t e = cudaFuncSetAttribute(attn_bf16_kernel<D, To, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(G::kSmem));
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(attn_bf16_kernel<D, To, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(G::kSmem));
    if (e == cudaSuccess && cluster_combine_available())
      e = cudaFuncSetAttribute(attn_bf16_kernel<D, To, true>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return e;
  }();
  if (attr != cudaSuccess) {
    (void)cudaGetLastError();
    return Status(StatusCode::Backend, std::string("attention_bf16: shared memory of ") + std::to_string(G::kSmem) +
                                           " bytes: " + cudaGetErrorString(attr));
  }
  const dim3 grid(unsigned(cdiv(p.rows, kBM)), unsigned(p.hk), unsigned(p.splits));
  if (cluster) {
    static_assert(size_t(kBM) * D * 4 + size_t(kBM) * 8 <= G::kSmem, "the partials fit in the tiles' space");
    return launch_cluster(attn_bf16_kernel<D, To, true>, grid, kThreads, G::kSmem, stream, p, "attention_bf16 (cluster)");
  }
  launch(attn_bf16_kernel<D, To, false>, grid, kThreads, G::kSmem, stream, p);
  VLAC_RETURN_IF_ERROR(launch_status("attention_bf16"));
  return launch_combine<D, To>(stream, p);
}

}  // namespace

int attention_splits(const AttentionShape& a, DType io, int num_sms) {
  if (io != DType::BF16 || a.t <= 0 || a.hk <= 0 || a.s <= 0 || a.kv_block > 0) return 1;
  const int64_t blocks = cdiv(a.t * (a.h / a.hk), kBM) * a.hk;
  const int64_t sms = num_sms > 0 ? num_sms : 1;
  // Measured on the H200 (bench/results): the combine pass costs more than it buys unless the row
  // tiles leave most multiprocessors idle — the prefix (121 tiles) and SigLIP (64) run fastest
  // unsplit, the expert (7 tiles) 3.4x faster with 8-32 splits.
  // VLAC_ATTN_FORCE_SPLITS=N splits those too (a measurement knob: more blocks per SM against the
  // partials' traffic and the combine).
  static const int64_t force = [] {
    const int64_t v = env_count("VLAC_ATTN_FORCE_SPLITS", 0);
    return v > 1 ? std::min<int64_t>(v, kMaxSplits) : int64_t(0);
  }();
  if (blocks * 8 > sms) return force ? int(cdiv(a.s, keys_per_split(a.s, int(force)))) : 1;
  // VLAC_ATTN_MAX_SPLITS caps the splits (a tuning knob for the measurement).
  static const int64_t cap = [] {
    const int64_t v = env_count("VLAC_ATTN_MAX_SPLITS", 0);
    return v > 0 ? std::min<int64_t>(v, kMaxSplits) : int64_t(kMaxSplits);
  }();
  // Merged inside the kernel (VLAC_ATTN_CLUSTER=1 on sm_90), the splits of a tile are one cluster:
  // at most 8.
  const int64_t lim = cluster_combine_available() ? std::min<int64_t>(cap, max_cluster_splits<1>()) : cap;
  // Head dim 256 runs two key groups per block (subgroups): a split of two tiles at least.
  const int64_t tiles_per_split = a.dh == 256 && attention_sub_setting() != 1 ? 2 : 1;
  const int64_t want = std::min<int64_t>({cdiv(sms, blocks), cdiv(a.s, tiles_per_split * kBN), lim});
  return int(cdiv(a.s, keys_per_split(a.s, int(want))));  // the splits that keys_per_split really makes
}

uint64_t attention_scratch_bytes(const AttentionShape& a, DType io, int splits) {
  if (io != DType::BF16 || splits <= 1) return 0;
  const uint64_t slots = uint64_t(splits) * uint64_t(a.hk) * uint64_t(a.t * (a.h / std::max<int64_t>(a.hk, 1)));
  return slots * uint64_t(a.dv + 2) * sizeof(float);
}

Status attention(cudaStream_t stream, const AttentionShape& a, DType io, const void* q, const void* k, const void* v,
                 AttentionMask mask, void* out, DType ot, float scale, int splits, void* scratch,
                 uint64_t scratch_bytes, const AttentionRope* rope) {
  const char* name = "attention";
  if (!is_act(io) || !is_act(ot)) return bad_dtype(name);
  if (a.t < 0 || a.h <= 0 || a.hk <= 0 || a.h % a.hk != 0 || a.s <= 0 || a.dh <= 0 || a.dv <= 0)
    return invalid_argument("attention: bad shape (t, h, hk, s, dh, dv) = (" + std::to_string(a.t) + ", " +
                            std::to_string(a.h) + ", " + std::to_string(a.hk) + ", " + std::to_string(a.s) + ", " +
                            std::to_string(a.dh) + ", " + std::to_string(a.dv) + ")");
  if (a.t == 0) return Status::ok();
  const Dense dn = strides(a);
  if (rope) {
    const auto bad16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) != 0; };
    if (io != DType::BF16 || a.kv_block > 0 || a.dh != a.dv || a.dh % 8 != 0 || a.s < a.t)
      return invalid_argument("attention: the fused RoPE needs bf16 attention, no kv_block, dh = dv (a multiple of 8) "
                              "and at least t keys");
    if (!rope->q || !rope->k || !rope->v || !rope->sc || bad16(rope->q) || bad16(rope->k) || bad16(rope->v) ||
        bad16(rope->sc) || rope->q_stride % 4 || rope->k_stride % 4 || rope->v_stride % 4 ||
        rope->q_stride < a.h * a.dh || rope->k_stride < a.hk * a.dh || rope->v_stride < a.hk * a.dv)
      return invalid_argument("attention: the fused RoPE's f32 rows must be 16-byte aligned, strides multiples of 4 "
                              "and at least a row");
  }
  // cuDNN's fused attention (VLAC_CUDNN_ATTN, cudnn_attention.h; not for lean calls unless asked):
  // unmasked bf16 in and out, no fused RoPE; the expert's split attention only at setting 2. Where
  // cuDNN is absent or declines the shape (Unsupported), the own kernel below runs.
  if (const int dnn = cudnn_attention_setting(a.lean);
      dnn > 0 && io == DType::BF16 && ot == DType::BF16 && !rope && !mask.allow && !mask.add && a.dh == a.dv &&
      (dnn == 2 || splits <= 1) && (a.kv_block == 0 || (a.t == a.s && a.t % a.kv_block == 0)) &&
      ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v) |
        reinterpret_cast<uintptr_t>(out)) & 15u) == 0 &&
      (dn.qs | dn.ks | dn.vs | dn.os) % 8 == 0) {
    CudnnAttentionShape c;
    c.b = a.kv_block > 0 ? a.t / a.kv_block : 1;
    c.sq = a.kv_block > 0 ? a.kv_block : a.t;
    c.skv = a.kv_block > 0 ? a.kv_block : a.s;
    c.h = a.h, c.hk = a.hk, c.d = a.dh;
    c.q_stride = dn.qs, c.k_stride = dn.ks, c.v_stride = dn.vs, c.o_stride = dn.os;
    const Status st = cudnn_attention(stream, c, q, k, v, out, scale);
    if (st.code() != StatusCode::Unsupported) return st;
  }
  if (a.kv_block > 0) {
    if (mask.allow || mask.add || a.t != a.s || a.t % a.kv_block != 0)
      return invalid_argument("attention: kv_block " + std::to_string(a.kv_block) + " needs no mask and t = s (" +
                              std::to_string(a.t) + ", " + std::to_string(a.s) + ") a multiple of it");
    // The bf16 kernel takes the blocks in one launch when no row tile straddles two of them;
    // otherwise one launch per block over offset pointers.
    if (io != DType::BF16 || (a.kv_block * (a.h / a.hk)) % kBM != 0) {
      AttentionShape b = a;
      b.t = b.s = a.kv_block;
      b.kv_block = 0;
      b.q_stride = dn.qs, b.k_stride = dn.ks, b.v_stride = dn.vs, b.o_stride = dn.os;
      const size_t is = io == DType::BF16 ? 2 : 4, os = ot == DType::BF16 ? 2 : 4;
      for (int64_t t0 = 0; t0 < a.t; t0 += a.kv_block)
        VLAC_RETURN_IF_ERROR(attention(stream, b, io, static_cast<const uint8_t*>(q) + t0 * dn.qs * is,
                                       static_cast<const uint8_t*>(k) + t0 * dn.ks * is,
                                       static_cast<const uint8_t*>(v) + t0 * dn.vs * is, mask,
                                       static_cast<uint8_t*>(out) + t0 * dn.os * os, ot, scale, 1, nullptr, 0));
      return Status::ok();
    }
  }
  if (io == DType::F32) {
    if (a.dh > 256 || a.dv > 256) return unsupported("attention: f32 head dims above 256");
    const unsigned blocks = unsigned(cdiv(a.t * a.h, 4));
    if (ot == DType::F32)
      launch(attn_f32_kernel<float>, blocks, 128, 0, stream,
          static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v), mask.allow,
          mask.add, static_cast<float*>(out), a.t, a.h, a.hk, a.s, a.dh, a.dv, dn.qs, dn.ks, dn.vs, dn.os, scale);
    else
      launch(attn_f32_kernel<uint16_t>, blocks, 128, 0, stream,
          static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v), mask.allow,
          mask.add, static_cast<uint16_t*>(out), a.t, a.h, a.hk, a.s, a.dh, a.dv, dn.qs, dn.ks, dn.vs, dn.os, scale);
    return launch_status("attention_f32");
  }
  if (a.dh != a.dv || (a.dh != 256 && a.dh != 72))
    return unsupported("attention: bf16 kernel needs dh == dv in {72, 256}, got " + std::to_string(a.dh) + "/" +
                       std::to_string(a.dv));
  const auto misaligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) != 0; };
  if (misaligned(q) || misaligned(k) || misaligned(v) || dn.qs % 8 || dn.ks % 8 || dn.vs % 8)
    return invalid_argument("attention: bf16 q/k/v pointers and row strides must be 16-byte aligned");
  Params p{};
  p.q = static_cast<const uint16_t*>(q);
  p.k = static_cast<const uint16_t*>(k);
  p.v = static_cast<const uint16_t*>(v);
  p.allow = mask.allow;
  p.allow_pairs = mask.allow && a.s % 2 == 0 && (reinterpret_cast<uintptr_t>(mask.allow) & 1u) == 0;
  p.add = mask.add;
  p.out = out;
  p.t = a.t, p.h = a.h, p.hk = a.hk, p.s = a.s, p.group = a.h / a.hk, p.rows = a.t * (a.h / a.hk);
  p.qs = dn.qs, p.ks = dn.ks, p.vs = dn.vs, p.os = dn.os;
  p.scale = scale;
  if (rope) {
    p.qf = rope->q, p.kf = rope->k, p.vf = rope->v, p.sc = rope->sc;
    p.qfs = rope->q_stride, p.kfs = rope->k_stride, p.vfs = rope->v_stride, p.fresh0 = a.s - a.t;
  }
  // (The fused RoPE's kernel loads its first tiles after the wait: its fresh rows come from q|k|v.)
  p.early_keys = rope || a.kv_block > 0 ? 0 : std::clamp<int64_t>(a.stable_keys, 0, a.s);
  p.kv_block = a.kv_block;
  p.keys_per_split = a.kv_block > 0 ? a.s : keys_per_split(a.s, std::min(splits, kMaxSplits));
  p.splits = a.kv_block > 0 ? 1 : int(cdiv(a.s, p.keys_per_split));
  if (p.splits > 1) {
    const uint64_t need = attention_scratch_bytes(a, io, p.splits);
    if (scratch == nullptr || scratch_bytes < need || (reinterpret_cast<uintptr_t>(scratch) & 15u) != 0)
      return invalid_argument("attention: " + std::to_string(p.splits) + " key splits need " + std::to_string(need) +
                              " bytes of 16-byte aligned scratch, got " + std::to_string(scratch_bytes));
    p.part_o = static_cast<float*>(scratch);
    p.part_ml = p.part_o + uint64_t(p.splits) * uint64_t(p.hk) * uint64_t(p.rows) * uint64_t(a.dv);
  }
  static const int sms = device_sm_count();  // one GPU per process (as the shared-memory limits above)
  if (a.dh == 256)
    return ot == DType::F32 ? launch_bf16<256, float>(stream, p, sms) : launch_bf16<256, uint16_t>(stream, p, sms);
  return ot == DType::F32 ? launch_bf16<72, float>(stream, p, sms) : launch_bf16<72, uint16_t>(stream, p, sms);
}

}  // namespace vlac::cuda
