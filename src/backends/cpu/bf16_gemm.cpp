// The bf16 Linear's register-blocked kernel for AVX2+FMA (see bf16_gemm.h).
//
// Both operands are K-contiguous (x[M,K], W[N,K]), so the kernel takes dot products along K:
// a tile of kMr rows of x by kNr rows of W keeps kMr·kNr accumulators of 8 lanes each and, per
// group of 16 k, loads 16 bf16 of each W row once (32 bytes, half of fp32's) and widens them
// without a shuffle: the 32-bit lane l holds the pair (w[2l], w[2l+1]), so `<< 16` is w[2l] in
// fp32 and `& 0xFFFF0000` is w[2l+1]. The staged x holds each group as its 8 even then 8 odd
// elements to match. Lane sums are reduced once per block of K (kKcGroups groups).
//
// Blocking: each OpenMP task owns rows of W (and, when W has few rows, a range of x rows), walks
// K in blocks, and within a block a kNc-row panel of W (bf16, sized for L2) against every kMr-row
// micro-panel of x (in L1 across the panel). The per-output sum order (block by block, lanes,
// then the K tail and the bias) does not depend on the tiling or the thread count.
//
// Compiled for AVX2 through target attributes and chosen at run time from cpu_isa().active (the
// same scheme as elementwise.cpp), so VLAC_MAX_CPU_ISA=scalar takes it off and arm64 never
// builds it.
#include "backends/cpu/bf16_gemm.h"

#include <omp.h>

#include <algorithm>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backends/cpu/cpu_isa.h"
#include "core/dtype.h"
#include "core/status.h"

namespace vlac::cpu {
namespace {

constexpr int64_t kGroup = 16;     // k per widened load of a W row (one 256-bit load of bf16)
constexpr int kMr = 6, kNr = 2;    // tile: 12 accumulators + 2 widened W + 1 x + 1 mask = 16 ymm
// k block = 512: the x micro-panel (6 x 512 fp32 = 12 KiB) stays in a 32 KiB L1 with the W rows
// streaming past and the next panel arriving (1024 left too few ways of an 8-way L1 free).
constexpr int64_t kKcGroups = 32;
constexpr int64_t kNc = 128;  // W panel rows per block: 128 x 512 bf16 = 128 KiB, in L2

// x rows rounded up to whole panels.
int64_t panel_rows(int64_t m) { return (m + kMr - 1) / kMr * kMr; }

}  // namespace

// Staged x: the 16-groups of K as panels of kMr rows, [panel][group][row in panel][16] (rows past
// M left unset: never read into an output), then the rows' K tails [M][K mod 16] in order.
uint64_t bf16_gemm_x_bytes(int64_t m, int64_t k) {
  const int64_t k16 = k / kGroup * kGroup;
  return uint64_t(panel_rows(m) * k16 + m * (k - k16)) * 4;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define VLAC_AVX2 __attribute__((target("avx2,fma")))

namespace {

// Rounds 8 fp32 to bf16 (nearest even, NaN kept quiet: f32_to_bf16) and back to fp32.
VLAC_AVX2 inline __m256 round8(__m256 v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFFFF)),
                                         _mm256_set1_epi32(0x7F800000));
  const __m256i q = _mm256_or_si256(b, _mm256_set1_epi32(0x00400000));
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_blendv_epi8(r, q, nan), _mm256_set1_epi32(int(0xFFFF0000u))));
}

// One row of xs from 16-groups of (already rounded) fp32: even elements, then odd ones.
VLAC_AVX2 inline void deinterleave16(__m256 a, __m256 b, float* out) {
  const __m256 ev = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));  // x0 x2 x8 x10 | x4 x6 x12 x14
  const __m256 od = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
  _mm256_store_ps(out, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), _MM_SHUFFLE(3, 1, 2, 0))));
  _mm256_store_ps(out + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), _MM_SHUFFLE(3, 1, 2, 0))));
}

// Row r of x into the staged layout (see bf16_gemm_x_bytes): its 16-groups into panel r / kMr,
// its K tail into the tail rows.
VLAC_AVX2 void stage_row_f32(const float* x, float* xs, int64_t r, int64_t m, int64_t k) {
  const int64_t k16 = k / kGroup * kGroup;
  float* out = xs + (r / kMr) * kMr * k16 + (r % kMr) * kGroup;
  for (int64_t i = 0; i < k16; i += kGroup, out += kMr * kGroup)
    deinterleave16(round8(_mm256_loadu_ps(x + i)), round8(_mm256_loadu_ps(x + i + 8)), out);
  float* tail = xs + panel_rows(m) * k16 + r * (k - k16);
  for (int64_t i = k16; i < k; ++i) tail[i - k16] = bf16_to_f32(f32_to_bf16(x[i]));
}

VLAC_AVX2 void stage_row_bf16(const uint16_t* x, float* xs, int64_t r, int64_t m, int64_t k) {
  const int64_t k16 = k / kGroup * kGroup;
  float* out = xs + (r / kMr) * kMr * k16 + (r % kMr) * kGroup;
  const __m256i hi = _mm256_set1_epi32(int(0xFFFF0000u));
  for (int64_t i = 0; i < k16; i += kGroup, out += kMr * kGroup) {  // the same lane trick as the weights
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    _mm256_store_ps(out, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    _mm256_store_ps(out + 8, _mm256_castsi256_ps(_mm256_and_si256(v, hi)));
  }
  float* tail = xs + panel_rows(m) * k16 + r * (k - k16);
  for (int64_t i = k16; i < k; ++i) tail[i - k16] = bf16_to_f32(x[i]);
}

// Sum of the 8 lanes of a and of b: {Σa, Σb}, stored or added to y[0], y[1] (NR = 2); NR = 1
// uses a only. A fixed order of adds.
VLAC_AVX2 inline void reduce_store(__m256 a, __m256 b, float* y, int nr, bool accumulate) {
  const __m256 h = _mm256_hadd_ps(a, b);  // a01 a23 b01 b23 | a45 a67 b45 b67
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));  // a0145 a2367 b.. b..
  const __m128 t = _mm_hadd_ps(s, s);                                                   // Σa Σb Σa Σb
  if (accumulate) {
    y[0] += _mm_cvtss_f32(t);
    if (nr == 2) y[1] += _mm_cvtss_f32(_mm_shuffle_ps(t, t, 1));
  } else {
    y[0] = _mm_cvtss_f32(t);
    if (nr == 2) y[1] = _mm_cvtss_f32(_mm_shuffle_ps(t, t, 1));
  }
}

// y[MR, NR] (=|+=) a panel of staged x (MR <= kMr rows, kMr·16 floats per group) times
// w[NR, groups·16]ᵀ; ldw, ldy in elements.
template <int MR, int NR>
VLAC_AVX2 void tile(const float* xp, const uint16_t* w, int64_t ldw, int64_t groups, float* y, int64_t ldy,
                    bool accumulate, const char* /*pf_x*/, const uint16_t* /*pf_w*/) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  const __m256i hi = _mm256_set1_epi32(int(0xFFFF0000u));
  const uint16_t* w1 = w + (NR - 1) * ldw;
  for (int64_t g = 0; g < groups; ++g, xp += kMr * kGroup, w += kGroup, w1 += kGroup) {
    __m256 wv[NR];
    wv[0] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), 16));
    if constexpr (NR == 2)
      wv[1] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w1)), 16));
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_load_ps(xp + i * kGroup);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
    wv[0] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), hi));
    if constexpr (NR == 2)
      wv[1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w1)), hi));
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_load_ps(xp + i * kGroup + 8);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) reduce_store(acc[i][0], acc[i][NR - 1], y + i * ldy, NR, accumulate);
}

// The full tile in inline asm. Given the intrinsics above, GCC folds every use of an x vector
// into its FMA as a memory operand (24 loads of x per group instead of 12), or hoists the odd
// half's loads and spills accumulators. Here, per group: 4 loads of W (each row once shifted,
// once masked), 12 loads of x, 24 FMAs, in ymm0-11 (accumulators), ymm12-14 and the mask ymm15;
// and three prefetches: a line of the next x panel (pf_x, 64 bytes a group) and the next tile's
// two W rows (pf_w, pf_w + ldw, 32 bytes a group), so neither waits on memory when its turn comes.
template <>
VLAC_AVX2 void tile<kMr, kNr>(const float* xp, const uint16_t* w, int64_t ldw, int64_t groups, float* y,
                              int64_t ldy, bool accumulate, const char* pf_x, const uint16_t* pf_w) {
  static_assert(kMr == 6 && kNr == 2 && kGroup == 16, "the asm below is written for 6 x 2 tiles of 16-groups");
  alignas(32) float acc[kMr * kNr][8];
  if (groups > 0) {
    const uint16_t* w0 = w;
    const uint16_t* w1 = w + ldw;
    const uint16_t* pw1 = pf_w + ldw;
    const uint32_t hi = 0xFFFF0000u;
    __asm__ volatile(
      "vxorps %%xmm0, %%xmm0, %%xmm0\n\t"
      "vxorps %%xmm1, %%xmm1, %%xmm1\n\t"
      "vxorps %%xmm2, %%xmm2, %%xmm2\n\t"
      "vxorps %%xmm3, %%xmm3, %%xmm3\n\t"
      "vxorps %%xmm4, %%xmm4, %%xmm4\n\t"
      "vxorps %%xmm5, %%xmm5, %%xmm5\n\t"
      "vxorps %%xmm6, %%xmm6, %%xmm6\n\t"
      "vxorps %%xmm7, %%xmm7, %%xmm7\n\t"
      "vxorps %%xmm8, %%xmm8, %%xmm8\n\t"
      "vxorps %%xmm9, %%xmm9, %%xmm9\n\t"
      "vxorps %%xmm10, %%xmm10, %%xmm10\n\t"
      "vxorps %%xmm11, %%xmm11, %%xmm11\n\t"
      "vpbroadcastd %[hi], %%ymm15\n\t"
      "1:\n\t"
      "prefetcht0 (%[px])\n\t"
      "prefetcht0 (%[pw0])\n\t"
      "prefetcht0 (%[pw1])\n\t"
      "vmovdqu (%[w0]), %%ymm12\n\t"
      "vpslld $16, %%ymm12, %%ymm12\n\t"
      "vmovdqu (%[w1]), %%ymm13\n\t"
      "vpslld $16, %%ymm13, %%ymm13\n\t"
      "vmovaps 0(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm0\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm1\n\t"
      "vmovaps 64(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm2\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm3\n\t"
      "vmovaps 128(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm4\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm5\n\t"
      "vmovaps 192(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm6\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm7\n\t"
      "vmovaps 256(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm8\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm9\n\t"
      "vmovaps 320(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm10\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm11\n\t"
      "vpand (%[w0]), %%ymm15, %%ymm12\n\t"
      "vpand (%[w1]), %%ymm15, %%ymm13\n\t"
      "vmovaps 32(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm0\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm1\n\t"
      "vmovaps 96(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm2\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm3\n\t"
      "vmovaps 160(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm4\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm5\n\t"
      "vmovaps 224(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm6\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm7\n\t"
      "vmovaps 288(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm8\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm9\n\t"
      "vmovaps 352(%[x]), %%ymm14\n\t"
      "vfmadd231ps %%ymm12, %%ymm14, %%ymm10\n\t"
      "vfmadd231ps %%ymm13, %%ymm14, %%ymm11\n\t"
      "add $384, %[x]\n\t"
      "add $32, %[w0]\n\t"
      "add $32, %[w1]\n\t"
      "add $64, %[px]\n\t"
      "add $32, %[pw0]\n\t"
      "add $32, %[pw1]\n\t"
      "dec %[g]\n\t"
      "jnz 1b\n\t"
      "vmovaps %%ymm0, 0(%[out])\n\t"
      "vmovaps %%ymm1, 32(%[out])\n\t"
      "vmovaps %%ymm2, 64(%[out])\n\t"
      "vmovaps %%ymm3, 96(%[out])\n\t"
      "vmovaps %%ymm4, 128(%[out])\n\t"
      "vmovaps %%ymm5, 160(%[out])\n\t"
      "vmovaps %%ymm6, 192(%[out])\n\t"
      "vmovaps %%ymm7, 224(%[out])\n\t"
      "vmovaps %%ymm8, 256(%[out])\n\t"
      "vmovaps %%ymm9, 288(%[out])\n\t"
      "vmovaps %%ymm10, 320(%[out])\n\t"
      "vmovaps %%ymm11, 352(%[out])\n\t"
      : [x] "+r"(xp), [w0] "+r"(w0), [w1] "+r"(w1), [g] "+r"(groups), [px] "+r"(pf_x), [pw0] "+r"(pf_w),
        [pw1] "+r"(pw1)
      : [hi] "m"(hi), [out] "r"(&acc[0][0])
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc", "memory");
  } else {
    for (auto& v : acc) std::fill(v, v + 8, 0.0f);
  }
  for (int i = 0; i < kMr; ++i)
    reduce_store(_mm256_load_ps(acc[2 * i]), _mm256_load_ps(acc[2 * i + 1]), y + i * ldy, kNr, accumulate);
}

using TileFn = void (*)(const float*, const uint16_t*, int64_t, int64_t, float*, int64_t, bool, const char*,
                       const uint16_t*);

template <int... M>
constexpr auto tile_table(std::integer_sequence<int, M...>) {
  struct Table {
    TileFn f[kMr][kNr];
  };
  return Table{{{tile<M + 1, 1>, tile<M + 1, 2>}...}};
}
constexpr auto kTiles = tile_table(std::make_integer_sequence<int, kMr>{});
static_assert(kNr == 2, "tile_table lists NR = 1 and 2");

// Rows [m0, m1) of x (m0 a multiple of kMr) against rows [n0, n1) of W.
VLAC_AVX2 void gemm_task(const float* xs, const uint16_t* w, const float* b, float* y, int64_t m, int64_t k,
                         int64_t n, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int64_t groups = k / kGroup, k16 = groups * kGroup;
  for (int64_t g0 = 0; g0 < groups; g0 += kKcGroups) {
    const int64_t gl = std::min(kKcGroups, groups - g0);
    for (int64_t j0 = n0; j0 < n1; j0 += kNc) {
      const int64_t j1 = std::min(j0 + kNc, n1);
      for (int64_t i = m0; i < m1; i += kMr) {
        const int mr = int(std::min<int64_t>(kMr, m1 - i));
        const float* xp = xs + i * k16 + g0 * kMr * kGroup;  // panel i / kMr at group g0
        // The next x panel (or, after the last, the first one of the next W panel), prefetched a
        // slice per tile over the first tiles; later tiles touch the current panel (in L1).
        const int64_t i_next = i + kMr < m1 ? i + kMr : m0;
        const char* next = reinterpret_cast<const char*>(xs + i_next * k16 + g0 * kMr * kGroup);
        const int64_t slice = gl * 64, panel_bytes = gl * kMr * kGroup * 4;
        for (int64_t j = j0; j < j1; j += kNr) {
          const int nr = int(std::min<int64_t>(kNr, j1 - j));
          const int64_t at = (j - j0) / kNr * slice;
          const char* pf_x = at < panel_bytes ? next + at : reinterpret_cast<const char*>(xp);
          const uint16_t* pf_w = w + (j + 2 * kNr <= j1 ? j + kNr : j) * k + g0 * kGroup;
          kTiles.f[mr - 1][nr - 1](xp, w + j * k + g0 * kGroup, k, gl, y + i * n + j, n, g0 > 0, pf_x, pf_w);
        }
      }
    }
  }
  if (k16 == k && !b) return;
  const float* tail = xs + panel_rows(m) * k16;  // rows of the K tail, in order
  for (int64_t i = m0; i < m1; ++i)
    for (int64_t j = n0; j < n1; ++j) {
      float s = groups ? y[i * n + j] : 0.0f;
      for (int64_t l = k16; l < k; ++l) s += tail[i * (k - k16) + (l - k16)] * bf16_to_f32(w[j * k + l]);
      y[i * n + j] = b ? s + b[j] : s;
    }
}

}  // namespace

bool bf16_gemm_available() { return cpu_isa().active >= CpuIsa::Avx2; }

void bf16_gemm_stage(const float* x, float* xs, int64_t m, int64_t k) {
  VLAC_CHECK(bf16_gemm_available());
#pragma omp parallel for schedule(static) if (m * k >= 65536)
  for (int64_t i = 0; i < m; ++i) stage_row_f32(x + i * k, xs, i, m, k);
}

void bf16_gemm_stage_bf16(const uint16_t* x, float* xs, int64_t m, int64_t k) {
  VLAC_CHECK(bf16_gemm_available());
#pragma omp parallel for schedule(static) if (m * k >= 65536)
  for (int64_t i = 0; i < m; ++i) stage_row_bf16(x + i * k, xs, i, m, k);
}

void bf16_gemm_nk(const float* xs, const uint16_t* w, const float* b, float* y, int64_t m, int64_t k, int64_t n,
                  int threads) {
  VLAC_CHECK(bf16_gemm_available() && m > 0 && k > 0 && n > 0);
  // Tasks: W rows split into nt chunks (multiples of kNr); when that leaves threads idle (few W
  // rows), x rows into mt chunks too (each at least one full tile).
  const int64_t t = std::max(1, threads);
  const int64_t nt = std::min<int64_t>(t, (n + kNr - 1) / kNr);
  const int64_t rows_n = (n + nt - 1) / nt + kNr - 1;
  const int64_t chunk_n = rows_n / kNr * kNr;
  const int64_t n_chunks = (n + chunk_n - 1) / chunk_n;
  const int64_t mt = std::clamp<int64_t>(t / n_chunks, 1, std::max<int64_t>(1, m / kMr));
  const int64_t chunk_m = ((m + mt - 1) / mt + kMr - 1) / kMr * kMr;
  const int64_t m_chunks = (m + chunk_m - 1) / chunk_m;
  const int64_t tasks = n_chunks * m_chunks;
#pragma omp parallel for schedule(static) num_threads(int(t)) if (t > 1 && tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t ni = task % n_chunks, mi = task / n_chunks;
    gemm_task(xs, w, b, y, m, k, n, mi * chunk_m, std::min(m, (mi + 1) * chunk_m), ni * chunk_n,
              std::min(n, (ni + 1) * chunk_n));
  }
}

#else  // no AVX2 kernel in this build (arm64, other compilers): callers use widen + sgemm

bool bf16_gemm_available() { return false; }
void bf16_gemm_stage(const float*, float*, int64_t, int64_t) { VLAC_CHECK(false); }
void bf16_gemm_stage_bf16(const uint16_t*, float*, int64_t, int64_t) { VLAC_CHECK(false); }
void bf16_gemm_nk(const float*, const uint16_t*, const float*, float*, int64_t, int64_t, int64_t, int) {
  VLAC_CHECK(false);
}

#endif

}  // namespace vlac::cpu
