// The bf16 Linear's kernel for AVX2+FMA (see bf16_gemm.h): packed W panels and a 6x16
// outer-product microkernel.
//
// W is bf16 [N,K] (K-contiguous), x is staged as rounded fp32 [M,K]. K is walked in blocks of
// kKc; for each block, each 16-row panel of W is widened (exact) and transposed once into an
// fp32 panel [kKc][16] (16 KiB: stays in L1) and then reused by every row tile of x, so the
// widening costs O(N·K) against the O(M·N·K) FMAs and W's bf16 bytes are read once per call.
// The microkernel keeps MR x 16 outputs in 2·MR ymm accumulators; per k it loads the panel's 16
// values (2 ymm), broadcasts MR values of x and issues 2·MR FMAs: no shuffle and no widening in
// the FMA loop. M is cut into ceil(M/6) tiles of as equal a size as possible (M = 50: five of 6
// rows and four of 5), so no tile runs with fewer than 8 accumulators unless M < 8 rows.
//
// Numerics: every output is one fp32 sum per K block, in k order (FMA: the products of two
// bf16 values are exact in fp32), the blocks added in order, then the bias. The tiling of M and N
// and the threads change which core computes an output, never its order of adds.
//
// Compiled for AVX2 through target attributes and chosen at run time from cpu_isa().active (the
// same scheme as elementwise.cpp), so VLAC_MAX_CPU_ISA=scalar takes it off and arm64 never
// builds it.
#include "backends/cpu/bf16_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backends/cpu/cpu_isa.h"
#include "core/dtype.h"
#include "core/status.h"

namespace vlac::cpu {

// Staged x: the rounded activations in fp32, per block of K the row tiles one after the other,
// each as [k][row in tile] (what the microkernel broadcasts from, one stream); M·K floats.
uint64_t bf16_gemm_x_bytes(int64_t m, int64_t k) { return uint64_t(m * k) * 4; }

#if defined(__x86_64__) && defined(__GNUC__)
#define VLAC_AVX2 __attribute__((target("avx2,fma")))

namespace {

constexpr int kMr = 6;        // rows per tile: 12 accumulators + 2 panel values + 1 broadcast = 15 ymm
constexpr int64_t kNr = 16;   // W rows (output columns) per panel: 2 ymm
constexpr int64_t kKc = 256;  // K block: the packed panel is kKc x 16 fp32 = 16 KiB, in L1

// Row tiles: ceil(M/6) tiles, sizes as equal as possible (each 1..6 rows).
struct Tiles {
  int64_t count, q, rem;
  explicit Tiles(int64_t m) : count((m + kMr - 1) / kMr), q(m / count), rem(m % count) {}
  int64_t row(int64_t t) const { return t * q + std::min(t, rem); }
};

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

// 8 values of x from `x` (fp32, rounded to bf16) or from bf16 (widened); `n` < 8 reads only n.
struct FromF32 {
  const float* x;
  VLAC_AVX2 __m256 load8(int64_t at) const { return round8(_mm256_loadu_ps(x + at)); }
  float load1(int64_t at) const { return bf16_to_f32(f32_to_bf16(x[at])); }
};
struct FromBf16 {
  const uint16_t* x;
  VLAC_AVX2 __m256 load8(int64_t at) const {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + at))), 16));
  }
  float load1(int64_t at) const { return bf16_to_f32(x[at]); }
};

// c[j] = column j of the 8x8 matrix whose rows are r[0..7] (32-bit lanes).
VLAC_AVX2 inline void transpose8(const __m256 r[8], __m256 c[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  c[0] = _mm256_permute2f128_ps(u0, u4, 0x20), c[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  c[2] = _mm256_permute2f128_ps(u2, u6, 0x20), c[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  c[4] = _mm256_permute2f128_ps(u0, u4, 0x31), c[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  c[6] = _mm256_permute2f128_ps(u2, u6, 0x31), c[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Tile t of x (rows r0..r0+mr) into the staged layout (bf16_gemm_x_bytes): per K block, the
// tile's [kc][mr] values. 8 k at a time: the mr rows' 8 values, an 8x8 transpose, and each k's
// mr values stored under a lane mask.
template <class Src>
VLAC_AVX2 void stage_tile(Src src, float* xs, int64_t m, int64_t k, int64_t r0, int64_t mr) {
  alignas(32) int32_t lanes[8];
  for (int i = 0; i < 8; ++i) lanes[i] = i < mr ? -1 : 0;
  const __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
  for (int64_t k0 = 0; k0 < k; k0 += kKc) {
    const int64_t kc = std::min(kKc, k - k0), kc8 = kc / 8 * 8;
    float* out = xs + m * k0 + r0 * kc;
    for (int64_t kk = 0; kk < kc8; kk += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = i < mr ? src.load8((r0 + i) * k + k0 + kk) : _mm256_setzero_ps();
      __m256 c[8];
      transpose8(r, c);
      float* o = out + kk * mr;
      for (int i = 0; i < 8; ++i) _mm256_maskstore_ps(o + i * mr, mask, c[i]);
    }
    for (int64_t kk = kc8; kk < kc; ++kk)
      for (int64_t i = 0; i < mr; ++i) out[kk * mr + i] = src.load1((r0 + i) * k + k0 + kk);
  }
}

// The panel of W rows [0, nr) (nr <= 16, w at row 0 and column k0 of the block, row stride ldw)
// over kc columns, widened and transposed: bp[kk·16 + c] = W[c][kk], 0 for c >= nr. In 16-column
// steps, 8 rows at a time: each row's 16 bf16 are 8 pairs (one 32-bit lane each), an 8x8
// transpose of the lanes gathers pair j of the 8 rows, and `<< 16` / `& 0xFFFF0000` split it
// into columns 2j and 2j+1 in fp32, with no further shuffle.
VLAC_AVX2 void pack_panel(const uint16_t* w, int64_t ldw, int64_t nr, int64_t kc, float* bp) {
  const int64_t kc16 = kc / 16 * 16;
  const __m256i hi = _mm256_set1_epi32(int(0xFFFF0000u));
  for (int64_t kk = 0; kk < kc16; kk += 16)
    for (int64_t h = 0; h < kNr; h += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i)
        r[i] = h + i < nr ? _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (h + i) * ldw + kk)))
                           : _mm256_setzero_ps();
      __m256 c[8];
      transpose8(r, c);
      for (int j = 0; j < 8; ++j) {  // c[j]: pair j (columns kk+2j, kk+2j+1) of the 8 rows
        const __m256i v = _mm256_castps_si256(c[j]);
        _mm256_store_ps(bp + (kk + 2 * j) * kNr + h, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        _mm256_store_ps(bp + (kk + 2 * j + 1) * kNr + h, _mm256_castsi256_ps(_mm256_and_si256(v, hi)));
      }
    }
  for (int64_t kk = kc16; kk < kc; ++kk)
    for (int64_t c = 0; c < kNr; ++c) bp[kk * kNr + c] = c < nr ? bf16_to_f32(w[c * ldw + kk]) : 0.0f;
}

// y[MR, nr] (=, or += when !first) x[MR, kc] · panel, then + bias[nr] when bias is set. x is the
// tile's staged [kc][MR], the panel from pack_panel, y at stride ldy. Every loop over the rows
// is unrolled so the accumulators stay in registers.
template <int MR>
VLAC_AVX2 void micro(const float* x, const float* bp, int64_t kc, float* y, int64_t ldy, int64_t nr,
                     bool first, const float* bias) {
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) c0[i] = c1[i] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < kc; ++kk, bp += kNr, x += MR) {
    const __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(x + i);
      c0[i] = _mm256_fmadd_ps(a, b0, c0[i]);
      c1[i] = _mm256_fmadd_ps(a, b1, c1[i]);
    }
  }
  if (nr == kNr) {
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      float* yi = y + i * ldy;
      __m256 s0 = c0[i], s1 = c1[i];
      if (!first) s0 = _mm256_add_ps(_mm256_loadu_ps(yi), s0), s1 = _mm256_add_ps(_mm256_loadu_ps(yi + 8), s1);
      if (bias) s0 = _mm256_add_ps(s0, _mm256_loadu_ps(bias)), s1 = _mm256_add_ps(s1, _mm256_loadu_ps(bias + 8));
      _mm256_storeu_ps(yi, s0);
      _mm256_storeu_ps(yi + 8, s1);
    }
    return;
  }
  // A last panel of fewer than 16 columns: the same adds, in scalar, from the accumulators.
  alignas(32) float acc[MR][kNr];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) _mm256_store_ps(acc[i], c0[i]), _mm256_store_ps(acc[i] + 8, c1[i]);
  for (int i = 0; i < MR; ++i)
    for (int64_t c = 0; c < nr; ++c) {
      float s = first ? acc[i][c] : y[i * ldy + c] + acc[i][c];
      y[i * ldy + c] = bias ? s + bias[c] : s;
    }
}

using MicroFn = void (*)(const float*, const float*, int64_t, float*, int64_t, int64_t, bool, const float*);
constexpr MicroFn kMicro[kMr] = {micro<1>, micro<2>, micro<3>, micro<4>, micro<5>, micro<6>};

// Row tiles [t0, t1) of x against W rows [n0, n1) (n0 a multiple of 16 or the last panel).
VLAC_AVX2 void gemm_task(const float* xs, const uint16_t* w, const float* b, float* y, int64_t m, int64_t k,
                         int64_t n, int64_t t0, int64_t t1, int64_t n0, int64_t n1) {
  alignas(64) float bp[kKc * kNr];
  const Tiles tiles(m);
  for (int64_t k0 = 0; k0 < k; k0 += kKc) {
    const int64_t kc = std::min(kKc, k - k0);
    const bool first = k0 == 0, last = k0 + kc == k;
    for (int64_t j = n0; j < n1; j += kNr) {
      const int64_t nr = std::min(kNr, n1 - j);
      pack_panel(w + j * k + k0, k, nr, kc, bp);
      // The next panel's W rows on their way to L2 while this one runs (16 rows x kc bf16).
      if (j + kNr < n1)
        for (int64_t r = 0; r < std::min(kNr, n1 - j - kNr); ++r)
          for (int64_t c = 0; c < kc; c += 32) _mm_prefetch(reinterpret_cast<const char*>(w + (j + kNr + r) * k + k0 + c), _MM_HINT_T1);
      const float* bias = last && b ? b + j : nullptr;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t r0 = tiles.row(t), mr = tiles.row(t + 1) - r0;
        // The tile's outputs, read after the K loop: ask for them now (they are far apart in y
        // and out of cache for large M·N; waiting for them would stall every tile).
        if (!first)
          for (int64_t i = 0; i < mr; ++i) {
            _mm_prefetch(reinterpret_cast<const char*>(y + (r0 + i) * n + j), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(y + (r0 + i) * n + j + nr - 1), _MM_HINT_T0);
          }
        kMicro[mr - 1](xs + m * k0 + r0 * kc, bp, kc, y + r0 * n + j, n, nr, first, bias);
      }
    }
  }
}

}  // namespace

bool bf16_gemm_available() { return cpu_isa().active >= CpuIsa::Avx2; }

void bf16_gemm_stage(const float* x, float* xs, int64_t m, int64_t k) {
  VLAC_CHECK(bf16_gemm_available());
  const Tiles tiles(m);
#pragma omp parallel for schedule(static) if (m * k >= 65536)
  for (int64_t t = 0; t < tiles.count; ++t)
    stage_tile(FromF32{x}, xs, m, k, tiles.row(t), tiles.row(t + 1) - tiles.row(t));
}

void bf16_gemm_stage_bf16(const uint16_t* x, float* xs, int64_t m, int64_t k) {
  VLAC_CHECK(bf16_gemm_available());
  const Tiles tiles(m);
#pragma omp parallel for schedule(static) if (m * k >= 65536)
  for (int64_t t = 0; t < tiles.count; ++t)
    stage_tile(FromBf16{x}, xs, m, k, tiles.row(t), tiles.row(t + 1) - tiles.row(t));
}

void bf16_gemm_nk(const float* xs, const uint16_t* w, const float* b, float* y, int64_t m, int64_t k, int64_t n,
                  int threads) {
  VLAC_CHECK(bf16_gemm_available() && m > 0 && k > 0 && n > 0);
  // Tasks: the 16-row panels of W split into n_chunks; when that leaves threads idle (few W
  // rows), the row tiles of x into m_chunks too (each task then packs its panels itself).
  const Tiles tiles(m);
  const int64_t t = std::max(1, threads);
  const int64_t panels = (n + kNr - 1) / kNr;
  const int64_t nt = std::min<int64_t>(t, panels);
  const int64_t chunk_n = (panels + nt - 1) / nt * kNr;
  const int64_t n_chunks = (n + chunk_n - 1) / chunk_n;
  const int64_t mt = std::clamp<int64_t>(t / n_chunks, 1, tiles.count);
  const int64_t chunk_t = (tiles.count + mt - 1) / mt;
  const int64_t m_chunks = (tiles.count + chunk_t - 1) / chunk_t;
  const int64_t tasks = n_chunks * m_chunks;
#pragma omp parallel for schedule(static) num_threads(int(t)) if (t > 1 && tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t ni = task % n_chunks, mi = task / n_chunks;
    gemm_task(xs, w, b, y, m, k, n, mi * chunk_t, std::min(tiles.count, (mi + 1) * chunk_t), ni * chunk_n,
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
