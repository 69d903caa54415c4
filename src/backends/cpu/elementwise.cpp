// Elementwise kernels (GELU-tanh, GeGLU, SiLU), RoPE, softmax, time embedding and Euler step.
// fp32 math; never allocates. Loops over large arrays are split across the OpenMP threads
// (set_num_threads); each element is computed the same way whatever the thread count.
//
// ISA dispatch: the span kernels below are compiled once per instruction set (x86-64: AVX-512,
// AVX2+FMA and the baseline; aarch64: the baseline, whose Advanced SIMD the compiler uses) and one
// set is chosen at first use from cpu_isa().active, so VLAC_MAX_CPU_ISA takes the AVX-512 code off
// too (GCC's target_clones pick by hardware alone and cannot be capped).
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/kernels.h"
#include "core/dtype.h"

// Bodies are forced inline into each ISA's wrapper, so each is compiled with that ISA's flags.
#if defined(__GNUC__)
#define VLAC_INLINE inline __attribute__((always_inline))
#else
#define VLAC_INLINE inline
#endif

namespace vlac::cpu {
namespace {

// exp(x) for fp32 in plain arithmetic (no libm call, no branch) so the loops below vectorize:
// x = n·ln2 + r with |r| <= ln2/2, exp(r) from a degree-6 minimax polynomial (Cephes' expf
// coefficients), 2^n put into the exponent bits. Within 2 ulp of expf over the range; below
// exp's underflow it returns exactly 0 (masked logits must get zero probability), above it
// saturates at e^88.3 (callers only divide by 1 + that).
VLAC_INLINE float fast_exp(float x) {
  constexpr float kLo = -87.33f, kHi = 88.3f;
  const float xc = std::min(std::max(x, kLo), kHi);
  const float shifter = 12582912.0f;  // 1.5·2^23: adding it rounds to the nearest integer
  const float t = xc * 1.44269504088896341f + shifter;
  const float fn = t - shifter;
  const int32_t n = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(shifter);
  float r = xc - fn * 0.693359375f;  // ln2 split in two for an exact first product
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((n + 127) << 23);
  return x < kLo ? 0.0f : er * scale;
}

// 0.5·v·(1 + tanh(z)) = v / (1 + e^(−2z)), z = √(2/π)·(v + 0.044715·v³)
VLAC_INLINE float gelu_tanh_1(float v) {
  constexpr float kC2 = 2.0f * 0.7978845608028654f;
  return v / (1.0f + fast_exp(-kC2 * (v + 0.044715f * v * v * v)));
}

constexpr int64_t kLanes = 16;

// The ISA-independent bodies (plain loops the compiler vectorizes for the wrapper's ISA).
namespace body {

VLAC_INLINE void gelu_span(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_tanh_1(x[i]);
}
VLAC_INLINE void geglu_span(const float* gate, const float* up, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_tanh_1(gate[i]) * up[i];
}
VLAC_INLINE void silu_span(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + fast_exp(-x[i]));
}
// max of x[0..n), n >= 1. GCC does not vectorize a float max reduction without -ffast-math, so
// the x86 sets have explicit ones (a NaN in the row makes the softmax NaN either way).
VLAC_INLINE float row_max(const float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  return mx;
}
// One softmax row in place given its max: exp(x - max) and sum, scale. The sum keeps 16 partial
// lanes (a fixed order, so the compiler may vectorize it without -ffast-math).
VLAC_INLINE void softmax_row(float* x, int64_t n, float mx) {
  float lane_sum[kLanes] = {};
  const int64_t full = n / kLanes * kLanes;
  for (int64_t i = 0; i < full; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane_sum[l] += (x[i + l] = fast_exp(x[i + l] - mx));
  float sum = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) sum += lane_sum[l];
  for (int64_t i = full; i < n; ++i) sum += (x[i] = fast_exp(x[i] - mx));
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}
VLAC_INLINE void round_span(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}
VLAC_INLINE void round_f32_span(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(f32_to_bf16(x[i]));
}
VLAC_INLINE void widen_span(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}
// row = row·scale + mask row.
VLAC_INLINE void scale_mask_row(float* row, int64_t n, float scale, const uint8_t* allow, const float* add) {
  if (allow) {
    for (int64_t j = 0; j < n; ++j) row[j] = row[j] * scale + (allow[j] ? 0.0f : kMaskValue);
  } else if (add) {
    for (int64_t j = 0; j < n; ++j) row[j] = row[j] * scale + add[j];
  } else if (scale != 1.0f) {
    for (int64_t j = 0; j < n; ++j) row[j] *= scale;
  }
}
// Dot products of x with rows [0, rows) of W: 16 partial lanes, then their sum.
template <typename W>
VLAC_INLINE void gemv_rows(const float* x, const W* w, float* y, int64_t k, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    const W* wr = w + r * k;
    float lane[kLanes] = {};
    const int64_t full = k / kLanes * kLanes;
    for (int64_t i = 0; i < full; i += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) {
        float wv;
        if constexpr (sizeof(W) == 2) wv = bf16_to_f32(wr[i + l]);
        else wv = wr[i + l];
        lane[l] += x[i + l] * wv;
      }
    float sum = 0.0f;
    for (int64_t l = 0; l < kLanes; ++l) sum += lane[l];
    for (int64_t i = full; i < k; ++i) {
      if constexpr (sizeof(W) == 2) sum += x[i] * bf16_to_f32(wr[i]);
      else sum += x[i] * wr[i];
    }
    y[r] = sum;
  }
}

}  // namespace body

// One ISA's kernels, chosen once (see kernels()).
struct SpanKernels {
  CpuIsa isa;
  void (*gelu)(const float*, float*, int64_t);
  void (*geglu)(const float*, const float*, float*, int64_t);
  void (*silu)(const float*, float*, int64_t);
  float (*row_max)(const float*, int64_t);
  void (*softmax_row)(float*, int64_t);
  void (*round)(const float*, uint16_t*, int64_t);
  void (*round_f32)(const float*, float*, int64_t);
  void (*widen)(const uint16_t*, float*, int64_t);
  void (*scale_mask_row)(float*, int64_t, float, const uint8_t*, const float*);
  void (*gemv_f32)(const float*, const float*, float*, int64_t, int64_t);
  void (*gemv_bf16)(const float*, const uint16_t*, float*, int64_t, int64_t);
  // The softmax row rounded to bf16 in one fused pass (null: softmax_row, then round).
  void (*softmax_row_bf16)(const float*, uint16_t*, int64_t, float, const uint8_t*, const float*, float*);
};

// Wrappers of the bodies with one ISA's target attribute, and that ISA's table.
#define VLAC_SPAN_KERNELS(NS, ISA, ATTR, ROW_MAX, SOFTMAX_BF16)                                                  \
  namespace NS {                                                                                               \
  ATTR void gelu(const float* x, float* y, int64_t n) { body::gelu_span(x, y, n); }                            \
  ATTR void geglu(const float* g, const float* u, float* y, int64_t n) { body::geglu_span(g, u, y, n); }       \
  ATTR void silu(const float* x, float* y, int64_t n) { body::silu_span(x, y, n); }                            \
  ATTR void softmax_row(float* x, int64_t n) { body::softmax_row(x, n, ROW_MAX(x, n)); }                       \
  ATTR void round(const float* x, uint16_t* y, int64_t n) { body::round_span(x, y, n); }                       \
  ATTR void round_f32(const float* x, float* y, int64_t n) { body::round_f32_span(x, y, n); }                  \
  ATTR void widen(const uint16_t* x, float* y, int64_t n) { body::widen_span(x, y, n); }                       \
  ATTR void scale_mask_row(float* r, int64_t n, float s, const uint8_t* a, const float* d) {                   \
    body::scale_mask_row(r, n, s, a, d);                                                                       \
  }                                                                                                            \
  ATTR void gemv_f32(const float* x, const float* w, float* y, int64_t k, int64_t rows) {                      \
    body::gemv_rows(x, w, y, k, rows);                                                                         \
  }                                                                                                            \
  ATTR void gemv_bf16(const float* x, const uint16_t* w, float* y, int64_t k, int64_t rows) {                  \
    body::gemv_rows(x, w, y, k, rows);                                                                         \
  }                                                                                                            \
  constexpr SpanKernels kSet = {ISA,   gelu,  geglu,     silu,           ROW_MAX,  softmax_row, round,            \
                                round_f32, widen, scale_mask_row, gemv_f32, gemv_bf16,    SOFTMAX_BF16};          \
  }

VLAC_SPAN_KERNELS(base, kIsX86 ? CpuIsa::Scalar : CpuIsa::Neon, , body::row_max, nullptr)

#if defined(__x86_64__) && defined(__GNUC__)
#define VLAC_AVX2 __attribute__((target("avx2,fma")))
#define VLAC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#if !defined(__clang__)  // GCC 12 warns inside _mm512_* (their _mm512_undefined_ps), a known false positive
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// The vector max of a row for one ISA (its vector type, width and intrinsics): GCC does not
// vectorize body::row_max's reduction without -ffast-math.
#define VLAC_ROW_MAX(NAME, ATTR, VEC, LANES, SET1, LOADU, MAX, STORE)            \
  ATTR float NAME(const float* x, int64_t n) {                                  \
    VEC m = SET1(x[0]);                                                         \
    int64_t i = 0;                                                              \
    for (; i + (LANES) <= n; i += (LANES)) m = MAX(m, LOADU(x + i));            \
    alignas(64) float lanes[LANES];                                             \
    STORE(lanes, m);                                                            \
    float mx = x[0];                                                            \
    for (float l : lanes) mx = l > mx ? l : mx;                                 \
    for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;                              \
    return mx;                                                                  \
  }
VLAC_ROW_MAX(row_max_avx2, VLAC_AVX2, __m256, 8, _mm256_set1_ps, _mm256_loadu_ps, _mm256_max_ps, _mm256_store_ps)
VLAC_ROW_MAX(row_max_avx512, VLAC_AVX512, __m512, 16, _mm512_set1_ps, _mm512_loadu_ps, _mm512_max_ps,
             _mm512_store_ps)
#undef VLAC_ROW_MAX

// fast_exp on 16 lanes: the same reduction and polynomial (with fused multiply-adds).
VLAC_AVX512 inline __m512 fast_exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33f), hi = _mm512_set1_ps(88.3f);
  const __m512 shifter = _mm512_set1_ps(12582912.0f);
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 t = _mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), shifter);
  const __m512 fn = _mm512_sub_ps(t, shifter);
  const __m512i n = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(shifter));
  __m512 r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 er = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512 sc = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23));
  return _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), er, sc);  // x < lo: exactly 0
}

// masked_softmax_row_bf16 in three passes over a working copy `tmp` in L1: scale + mask and max;
// exp and sum; normalize and round to bf16 (round to nearest even, NaN kept quiet, as
// f32_to_bf16). The score row is read once and never written (no write-back of a streamed buffer).
VLAC_AVX512 void softmax_row_bf16_avx512(const float* row, uint16_t* out, int64_t n, float scale, const uint8_t* allow,
                                         const float* add, float* tmp) {
  auto lanes = [n](int64_t i) -> __mmask16 { return i + 16 <= n ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1u); };
  const __m512 vs = _mm512_set1_ps(scale), masked = _mm512_set1_ps(kMaskValue);
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(i);
    __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + i), vs);
    if (allow) {
      const __mmask16 off = _mm_mask_cmpeq_epi8_mask(m, _mm_maskz_loadu_epi8(m, allow + i), _mm_setzero_si128());
      x = _mm512_mask_add_ps(x, off, x, masked);
    } else if (add) {
      x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, add + i));
    }
    _mm512_mask_storeu_ps(tmp + i, m, x);
    vmax = _mm512_mask_max_ps(vmax, m, vmax, x);
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(i);
    const __m512 e = fast_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, tmp + i), mx));
    _mm512_mask_storeu_ps(tmp + i, m, e);
    vsum = _mm512_mask_add_ps(vsum, m, vsum, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(i);
    const __m512i b = _mm512_castps_si512(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, tmp + i), inv));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, abs_mask), inf);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtepi32_epi16(r));
  }
}

VLAC_SPAN_KERNELS(avx2, CpuIsa::Avx2, VLAC_AVX2, row_max_avx2, nullptr)
VLAC_SPAN_KERNELS(avx512, CpuIsa::Avx512, VLAC_AVX512, row_max_avx512, softmax_row_bf16_avx512)
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

const SpanKernels* pick(CpuIsa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (isa >= CpuIsa::Avx512) return &avx512::kSet;
  if (isa >= CpuIsa::Avx2) return &avx2::kSet;
#endif
  (void)isa;
  return &base::kSet;
}

std::atomic<const SpanKernels*> g_kernels{nullptr};

// The set for cpu_isa().active, chosen at the first call.
const SpanKernels& kernels() {
  const SpanKernels* k = g_kernels.load(std::memory_order_acquire);
  if (!k) {
    k = pick(cpu_isa().active);
    g_kernels.store(k, std::memory_order_release);
  }
  return *k;
}

// Splits [0, n) into equal spans, one per thread (same per-element math whatever the split).
template <typename Fn>
void for_spans(int64_t n, Fn fn) {
  constexpr int64_t kSpan = 4096;
  const int64_t spans = (n + kSpan - 1) / kSpan;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t s = 0; s < spans; ++s) fn(s * kSpan, std::min(kSpan, n - s * kSpan));
}

}  // namespace

const char* kernel_isa() { return cpu_isa_name(kernels().isa); }

Status set_kernel_isa(CpuIsa isa) {
  if (isa > cpu_isa().native || (kIsX86 && isa == CpuIsa::Neon) || (!kIsX86 && isa > CpuIsa::Neon))
    return unsupported(std::string("cpu kernels: this CPU cannot run ") + cpu_isa_name(isa) + " (native " +
                       cpu_isa().native_name + ")");
  g_kernels.store(pick(isa), std::memory_order_release);
  return Status::ok();
}

void gelu_tanh(const float* x, float* y, int64_t n) {
  const auto f = kernels().gelu;
  for_spans(n, [&](int64_t i, int64_t len) { f(x + i, y + i, len); });
}

void geglu(const float* gate, const float* up, float* y, int64_t n) {
  const auto f = kernels().geglu;
  for_spans(n, [&](int64_t i, int64_t len) { f(gate + i, up + i, y + i, len); });
}

void silu(const float* x, float* y, int64_t n) {
  const auto f = kernels().silu;
  for_spans(n, [&](int64_t i, int64_t len) { f(x + i, y + i, len); });
}

void rope_table(const int64_t* pos, int64_t t, int64_t dh, float base, float* cs) {
  VLAC_CHECK(dh % 2 == 0 && dh <= 1024);
  const int64_t half = dh / 2;
  float inv_freq[512];
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = 1.0f / float(std::pow(double(base), double(float(2 * i) / float(dh))));
#pragma omp parallel for schedule(static) if (t * half >= kParallelMinElems / 4)
  for (int64_t ti = 0; ti < t; ++ti) {
    const float p = float(pos[ti]);
    for (int64_t i = 0; i < half; ++i) {
      const float a = p * inv_freq[i];
      cs[(ti * half + i) * 2] = std::cos(a);
      cs[(ti * half + i) * 2 + 1] = std::sin(a);
    }
  }
}

void rope_apply(const float* x, float* y, const float* cs, int64_t t, int64_t h, int64_t dh) {
  const int64_t half = dh / 2;
#pragma omp parallel for schedule(static) if (t * h * dh >= kParallelMinElems)
  for (int64_t ti = 0; ti < t; ++ti)
    for (int64_t hi = 0; hi < h; ++hi) {
      const float* xr = x + (ti * h + hi) * dh;
      float* yr = y + (ti * h + hi) * dh;
      const float* c = cs + ti * half * 2;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = xr[i], x1 = xr[i + half];
        yr[i] = x0 * c[2 * i] - x1 * c[2 * i + 1];
        yr[i + half] = x1 * c[2 * i] + x0 * c[2 * i + 1];
      }
    }
}

void parallel_copy(void* dst, const void* src, uint64_t bytes) {
  constexpr uint64_t kChunk = 64 * 1024;
  const int64_t chunks = int64_t((bytes + kChunk - 1) / kChunk);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
#pragma omp parallel for schedule(static) if (bytes >= 4 * kChunk)
  for (int64_t c = 0; c < chunks; ++c) {
    const uint64_t at = uint64_t(c) * kChunk;
    std::memcpy(d + at, s + at, std::min(kChunk, bytes - at));
  }
}

void rope(float* x, const int64_t* pos, int64_t t, int64_t h, int64_t dh, float base) {
  // One token at a time through the table path (its cos/sin row fits on the stack).
  float cs[1024];
  for (int64_t ti = 0; ti < t; ++ti) {
    rope_table(pos + ti, 1, dh, base, cs);
    rope_apply(x + ti * h * dh, x + ti * h * dh, cs, 1, h, dh);
  }
}

void time_embedding(double t, float* out, int64_t dim, double min_period, double max_period) {
  VLAC_CHECK(dim % 2 == 0 && dim >= 2);
  const int64_t half = dim / 2;
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t i = 0; i < half; ++i) {
    const double frac = half == 1 ? 0.0 : double(i) / double(half - 1);
    const double period = min_period * std::pow(max_period / min_period, frac);
    const double a = (1.0 / period * kTwoPi) * t;  // lerobot's order of operations
    out[i] = float(std::sin(a));
    out[half + i] = float(std::cos(a));
  }
}

void euler_step(float* x, const float* v, float dt, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t i = 0; i < n; ++i) x[i] += dt * v[i];
}

void softmax(float* x, int64_t rows, int64_t n) {
  const auto f = kernels().softmax_row;
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMinElems && rows > 1)
  for (int64_t r = 0; r < rows; ++r) f(x + r * n, n);
}

void round_to_bf16(const float* x, uint16_t* y, int64_t n) {
  const auto f = kernels().round;
  for_spans(n, [&](int64_t i, int64_t len) { f(x + i, y + i, len); });
}

void round_to_bf16_f32(const float* x, float* y, int64_t n) {
  const auto f = kernels().round_f32;
  for_spans(n, [&](int64_t i, int64_t len) { f(x + i, y + i, len); });
}

void widen_bf16(const uint16_t* x, float* y, int64_t n) { kernels().widen(x, y, n); }

void round_to_bf16_f32_1t(const float* x, float* y, int64_t n) { kernels().round_f32(x, y, n); }

void gemv(const float* x, const void* w, bool w_bf16, const float* b, float* y, int64_t k, int64_t n) {
  constexpr int64_t kRows = 16;  // rows per task
  const int64_t tasks = (n + kRows - 1) / kRows;
  const SpanKernels& ks = kernels();
#pragma omp parallel for schedule(static) if (n * k >= 8 * kParallelMinElems)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t r0 = t * kRows, rows = std::min(kRows, n - r0);
    if (w_bf16) ks.gemv_bf16(x, static_cast<const uint16_t*>(w) + r0 * k, y + r0, k, rows);
    else ks.gemv_f32(x, static_cast<const float*>(w) + r0 * k, y + r0, k, rows);
    if (b)
      for (int64_t r = r0; r < r0 + rows; ++r) y[r] += b[r];
  }
}

void masked_softmax_row(float* row, int64_t n, float scale, const uint8_t* allow, const float* add) {
  const SpanKernels& ks = kernels();
  ks.scale_mask_row(row, n, scale, allow, add);
  ks.softmax_row(row, n);
}

void masked_softmax_row_bf16(float* row, uint16_t* out, int64_t n, float scale, const uint8_t* allow, const float* add) {
  const SpanKernels& ks = kernels();
  constexpr int64_t kMaxRow = 4096;  // the fused pass's working copy lives on the stack (in L1)
  if (ks.softmax_row_bf16 && n > 0 && n <= kMaxRow) {
    alignas(64) float tmp[kMaxRow];
    ks.softmax_row_bf16(row, out, n, scale, allow, add, tmp);
    return;
  }
  ks.scale_mask_row(row, n, scale, allow, add);
  ks.softmax_row(row, n);
  ks.round(row, out, n);
}

void masked_softmax_row_bf16_f32(float* row, int64_t n, float scale, const uint8_t* allow, const float* add) {
  const SpanKernels& ks = kernels();
  ks.scale_mask_row(row, n, scale, allow, add);
  ks.softmax_row(row, n);
  ks.round_f32(row, row, n);
}

void binary_op(BinaryOp op, const float* a, int64_t na, const float* b, int64_t nb, float* y, int64_t n) {
  // Same sizes, or one operand a block repeated over rows (pi0.5's gates and biases): contiguous
  // inner loops without a modulo per element; anything else (never built today) takes the modulo.
  auto run = [&](auto fn) {
    if (na == n && nb == n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
      for (int64_t i = 0; i < n; ++i) y[i] = fn(a[i], b[i]);
    } else if ((na == n || nb == n) && n % std::min(na, nb) == 0) {
      const int64_t d = std::min(na, nb), rows = n / d;
      const bool a_full = na == n;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems && rows > 1)
      for (int64_t r = 0; r < rows; ++r) {
        const float* ar = a_full ? a + r * d : a;
        const float* br = a_full ? b : b + r * d;
        float* yr = y + r * d;
        for (int64_t j = 0; j < d; ++j) yr[j] = fn(ar[j], br[j]);
      }
    } else {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
      for (int64_t i = 0; i < n; ++i) y[i] = fn(a[i % na], b[i % nb]);
    }
  };
  switch (op) {
    case BinaryOp::Add: run([](float u, float v) { return u + v; }); break;
    case BinaryOp::Sub: run([](float u, float v) { return u - v; }); break;
    case BinaryOp::Mul: run([](float u, float v) { return u * v; }); break;
  }
}

void scale(const float* x, float s, float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
}

}  // namespace vlac::cpu
