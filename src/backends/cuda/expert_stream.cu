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
constexpr int kStageRow = int(kStreamStageCols) + kPad;
constexpr int kStageElems = 16 * kStageRow;
constexpr uint64_t kStageBytes = uint64_t(kStageElems) * 2;
constexpr int kXRow = int(kStreamMaxPartCols) + kPad;
constexpr uint64_t kXBytes = uint64_t(kStreamTokens) * kXRow * 2;
constexpr int kRS = kStreamTokens + 1;                    // red's row stride (floats)
constexpr uint64_t kRedBytes = uint64_t(4) * 16 * kRS * 4;  // [K quarter][16 rows][tokens]
constexpr int kMinStages = 2, kMaxStages = 8;
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
  unsigned* sync;
  unsigned long long* stamps;  // ExpertStreamProbe (benches): null otherwise
  int skip;
};

__device__ __forceinline__ int items_of(const Phase& P) { return (P.rows / 16) * P.parts; }
__device__ __forceinline__ int stages_per_item(const Phase& P) { return P.k / P.parts / int(kStreamStageCols); }

// Where the weight stream is: phase p, item (absolute index), stage s of the item. The stream is
// the same sequence the math consumes, computed from the shapes alone.
struct Cursor {
  int p, item, s;
};

__device__ __forceinline__ void settle(const Args& a, Cursor& c) {
  while (c.p < a.count && c.item >= items_of(a.ph[c.p])) ++c.p, c.item = int(blockIdx.x);
}
__device__ __forceinline__ void advance(const Args& a, Cursor& c) {
  if (c.p >= a.count) return;
  if (++c.s < stages_per_item(a.ph[c.p])) return;
  c.s = 0;
  c.item += int(gridDim.x);
  settle(a, c);
}

// The 16 rows × 512 columns of W at cursor c into ring slot `slot` (4 copies of 16 bytes a thread).
__device__ __forceinline__ void issue(const Args& a, const Cursor& c, uint16_t* ring, int slot) {
  if (c.p >= a.count) return;
  const Phase& P = a.ph[c.p];
  const int tile = c.item / P.parts, part = c.item % P.parts;
  const int64_t col0 = int64_t(part) * (P.k / P.parts) + int64_t(c.s) * kStreamStageCols;
  const bool geglu = (P.flags & kGeglu) != 0;
  uint16_t* dst = ring + slot * kStageElems;
  constexpr int kChunks = int(kStreamStageCols) / 8;  // 16-byte copies a row
#pragma unroll
  for (int q = int(threadIdx.x); q < 16 * kChunks; q += kThreads) {
    const int r = q / kChunks, ch = q % kChunks;
    // geglu: rows 0..7 are gate rows 8·tile.., rows 8..15 the same up rows (F = rows / 2 further).
    const int row = geglu ? (r < 8 ? 8 * tile + r : P.rows / 2 + 8 * tile + r - 8) : 16 * tile + r;
    cp_async16(dst + r * kStageRow + ch * 8, P.w + int64_t(row) * P.k + col0 + ch * 8);
  }
}

__device__ __forceinline__ void wait_ring(int stages) {  // the oldest committed stage has landed
  switch (stages) {
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
__device__ __forceinline__ void st_bf4(uint16_t* d, float a, float b, float c, float e) {
  uint2 v;
  v.x = uint32_t(f2bf(a)) | (uint32_t(f2bf(b)) << 16);
  v.y = uint32_t(f2bf(c)) | (uint32_t(f2bf(e)) << 16);
  *reinterpret_cast<uint2*>(d) = v;
}

// The input columns of K part `part` into xs as bf16 (rows < m; rows m..55 stay zero).
__device__ void load_input(const Phase& P, int m, int part, uint16_t* xs) {
  const int kc = P.k / P.parts, col0 = part * kc;
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  if (P.flags & kInF32) {
    // A warp a row at a time, two rows in flight: lane l holds columns 4l + 128j (j < kc / 128 ≤ 8).
    const float* in = static_cast<const float*>(P.in);
    const int nj = kc / 128;
    const bool norm = (P.flags & kNorm) != 0;
    for (int r0 = warp; r0 < m; r0 += 2 * kWarps) {
      float4 v[2][8];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + h * kWarps;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (j < nj && r < m) v[h][j] = ldcg_f4(in + int64_t(r) * P.in_stride + col0 + 4 * lane + 128 * j);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + h * kWarps;
        if (r >= m) break;
        float scale = 1.f;
        if (norm) {
          float ss = 0.f;
#pragma unroll
          for (int j = 0; j < 8; ++j)
            if (j < nj) ss += v[h][j].x * v[h][j].x + v[h][j].y * v[h][j].y + v[h][j].z * v[h][j].z + v[h][j].w * v[h][j].w;
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
          scale = rsqrtf(ss / float(P.k) + P.eps);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (j < nj)
            st_bf4(xs + r * kXRow + 4 * lane + 128 * j, v[h][j].x * scale, v[h][j].y * scale, v[h][j].z * scale,
                   v[h][j].w * scale);
      }
    }
    return;
  }
  // bf16: 16-byte copies, four in flight a thread.
  const uint16_t* in = static_cast<const uint16_t*>(P.in);
  const int per_row = kc / 8, n = m * per_row;
  for (int q0 = int(threadIdx.x); q0 < n; q0 += 4 * kThreads) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int q = q0 + u * kThreads;
      if (q < n) v[u] = ldcg16(in + int64_t(q / per_row) * P.in_stride + col0 + (q % per_row) * 8);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int q = q0 + u * kThreads;
      if (q < n) *reinterpret_cast<uint4*>(xs + (q / per_row) * kXRow + (q % per_row) * 8) = v[u];
    }
  }
}

// One stage: warp w takes the stage's K quarter w % 4 (two 64-column MMA steps) for token tiles
// 0..3 (w < 4) or 4..6 (w ≥ 4). acc[j] is token tile 4·(w / 4) + j.
__device__ __forceinline__ void stage_math(const uint16_t* st, const uint16_t* xs, int xoff, int ntiles,
                                           float (&acc)[4][4]) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, g = lane >> 2, t = lane & 3;
  const int kq = warp & 3, nh = warp >> 2;
  const uint16_t* wa = st + g * kStageRow + 128 * kq + 8 * t;
  const uint16_t* wb = wa + 8 * kStageRow;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const int col = kMmaStep * s;
    const uint4 a0[2] = {lds16(wa + col), lds16(wa + col + 32)};
    const uint4 a1[2] = {lds16(wb + col), lds16(wb + col + 32)};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int nt = 4 * nh + j;
      if (nt >= ntiles) break;
      const uint16_t* xp = xs + (8 * nt + g) * kXRow + xoff + 128 * kq + col + 8 * t;
      const uint4 b[2] = {lds16(xp), lds16(xp + 32)};
      mma_step(acc[j], a0, a1, b);
    }
  }
}

// The item's sums over the four K quarters, in that order, and the phase's epilogue for its 16
// rows of W (tile) and the m tokens.
__device__ void epilogue(const Phase& P, int m, int ntiles, int tile, float* red, const float (&acc)[4][4]) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, g = lane >> 2, t = lane & 3;
  const int kq = warp & 3, nh = warp >> 2;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int nt = 4 * nh + j;
    if (nt >= ntiles) break;
    float* r0 = red + (kq * 16 + g) * kRS + 8 * nt + 2 * t;
    r0[0] = acc[j][0], r0[1] = acc[j][1];
    r0[8 * kRS] = acc[j][2], r0[8 * kRS + 1] = acc[j][3];
  }
  __syncthreads();
  auto sum = [&](int r, int c) {
    return ((red[r * kRS + c] + red[(16 + r) * kRS + c]) + red[(32 + r) * kRS + c]) + red[(48 + r) * kRS + c];
  };
  if (P.flags & kGeglu) {
    uint16_t* out = static_cast<uint16_t*>(P.out);
    for (int e = int(threadIdx.x); e < 8 * m; e += kThreads) {
      const int r = e % 8, c = e / 8;
      const float gl = round_bf(gelu_tanh_1(round_bf(sum(r, c))));
      out[int64_t(c) * P.out_stride + 8 * tile + r] = f2bf(gl * round_bf(sum(r + 8, c)));
    }
    return;
  }
  for (int e = int(threadIdx.x); e < 16 * m; e += kThreads) {
    const int r = e % 16, c = e / 16;
    const float s = sum(r, c);
    const int64_t at = int64_t(c) * P.out_stride + 16 * tile + r;
    if (P.flags & kAccum) atomicAdd(static_cast<float*>(P.out) + at, s);
    else if (P.flags & kOutF32) static_cast<float*>(P.out)[at] = s;
    else static_cast<uint16_t*>(P.out)[at] = f2bf(s);
  }
}

__global__ void __launch_bounds__(kThreads, 1) expert_stream_kernel(Args a) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);
  float* red = reinterpret_cast<float*>(smem + kXBytes);
  uint16_t* ring = reinterpret_cast<uint16_t*>(smem + kXBytes + kRedBytes);
  const int S = a.stages, G = int(gridDim.x), m = a.m, ntiles = (m + 7) / 8;

  // Token rows past m are never loaded: zero them once (their sums are computed, never stored).
  for (int q = int(threadIdx.x); q < (kStreamTokens - m) * kXRow / 8; q += kThreads)
    reinterpret_cast<uint4*>(xs + m * kXRow)[q] = make_uint4(0, 0, 0, 0);

  // The weights depend on nothing: S − 1 stages are in flight before the wait for the kernel
  // before this one, and stay S − 1 ahead of the math from then on, across every barrier.
  Cursor prod{0, int(blockIdx.x), 0};
  settle(a, prod);
  for (int s = 0; s + 1 < S; ++s) {
    issue(a, prod, ring, s);
    cp_async_commit();
    advance(a, prod);
  }
  pdl_wait();

  int it = 0;  // stages consumed
  for (int pi = 0; pi < a.count; ++pi) {
    const Phase P = a.ph[pi];
    if (pi > 0 && !(a.skip & 2)) grid_barrier(a.sync);
    stamp(a, pi, 0);
    const int items = items_of(P), spi = stages_per_item(P);
    int loaded = -1;
    bool stamped = false;
    for (int item = int(blockIdx.x); item < items; item += G) {
      const int tile = item / P.parts, part = item % P.parts;
      if (part != loaded) {
        __syncthreads();  // every warp is done with xs
        if (!(a.skip & 4)) load_input(P, m, part, xs);
        __syncthreads();
        loaded = part;
      }
      if (!stamped) stamp(a, pi, 1), stamped = true;
      float acc[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
      for (int s = 0; s < spi; ++s, ++it) {
        wait_ring(S);
        __syncthreads();  // the stage is visible to all; slot (it − 1) % S is free again
        issue(a, prod, ring, (it + S - 1) % S);
        cp_async_commit();
        advance(a, prod);
        if (!(a.skip & 1)) stage_math(ring + (it % S) * kStageElems, xs, s * int(kStreamStageCols), ntiles, acc);
      }
      if (!(a.skip & 1)) epilogue(P, m, ntiles, tile, red, acc);
      // red is written again only after the next item's first stage barrier.
    }
    if (!stamped) stamp(a, pi, 1);
    __threadfence();
    stamp(a, pi, 2);
  }
  cp_async_wait<0>();  // (empty groups only: the stream ends with the last phase)
}

bool plan_ok(const ExpertStreamPlan& p) {
  return p.m >= 1 && p.m <= kStreamTokens && p.blocks >= 1 && p.stages >= kMinStages && p.stages <= kMaxStages &&
         p.smem >= kXBytes + kRedBytes + uint64_t(p.stages) * kStageBytes;
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
    const uint64_t smem = kXBytes + kRedBytes + uint64_t(s) * kStageBytes;
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
    if (s.k < kStreamStageCols || s.k % (kStreamStageCols * s.parts) != 0 || s.k / s.parts > kStreamMaxPartCols)
      return bad("k (" + std::to_string(s.k) + ") must be a multiple of 512 x parts (" + std::to_string(s.parts) +
                 ") with at most 1024 columns a part");
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
  const Args a{static_cast<const Phase*>(phases) + first, int(count), int(p.m), p.stages, sync,
               probe ? probe->stamps : nullptr, probe ? probe->skip : 0};
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
