// Elementwise kernels (GELU-tanh, GeGLU, SiLU), RoPE, softmax, time embedding and Euler step.
// fp32 math; never allocates. Loops over large arrays are split across the OpenMP threads
// (set_num_threads); each element is computed the same way whatever the thread count.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "backends/cpu/kernels.h"
#include "core/dtype.h"

namespace vlac::cpu {
namespace {

// exp(x) for fp32 in plain arithmetic (no libm call, no branch) so the loops below vectorize:
// x = n·ln2 + r with |r| <= ln2/2, exp(r) from a degree-6 minimax polynomial (Cephes' expf
// coefficients), 2^n put into the exponent bits. Within 2 ulp of expf over the range; below
// exp's underflow it returns exactly 0 (masked logits must get zero probability), above it
// saturates at e^88.3 (callers only divide by 1 + that).
inline float fast_exp(float x) {
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
inline float gelu_tanh_1(float v) {
  constexpr float kC2 = 2.0f * 0.7978845608028654f;
  return v / (1.0f + fast_exp(-kC2 * (v + 0.044715f * v * v * v)));
}

// Spans run on one thread each; the clones let the same binary use AVX-512/AVX2 where present.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define VLAC_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VLAC_SIMD_CLONES
#endif

VLAC_SIMD_CLONES void gelu_span(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_tanh_1(x[i]);
}
VLAC_SIMD_CLONES void geglu_span(const float* gate, const float* up, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_tanh_1(gate[i]) * up[i];
}
VLAC_SIMD_CLONES void silu_span(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + fast_exp(-x[i]));
}
// One softmax row in place: max, exp(x - max) and sum, scale.
VLAC_SIMD_CLONES void softmax_row(float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  for (int64_t i = 0; i < n; ++i) x[i] = fast_exp(x[i] - mx);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
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

void gelu_tanh(const float* x, float* y, int64_t n) {
  for_spans(n, [&](int64_t i, int64_t len) { gelu_span(x + i, y + i, len); });
}

void geglu(const float* gate, const float* up, float* y, int64_t n) {
  for_spans(n, [&](int64_t i, int64_t len) { geglu_span(gate + i, up + i, y + i, len); });
}

void silu(const float* x, float* y, int64_t n) {
  for_spans(n, [&](int64_t i, int64_t len) { silu_span(x + i, y + i, len); });
}

void rope(float* x, const int64_t* pos, int64_t t, int64_t h, int64_t dh, float base) {
  VLAC_CHECK(dh % 2 == 0);
  const int64_t half = dh / 2;
#pragma omp parallel for schedule(static) if (t * h * dh >= kParallelMinElems)
  for (int64_t ti = 0; ti < t; ++ti) {
    const float p = float(pos[ti]);
    for (int64_t i = 0; i < half; ++i) {
      // As HF: inv_freq = 1 / base^(2i/dh) in fp32 steps, angle = pos * inv_freq in fp32.
      const float e = float(2 * i) / float(dh);
      const float inv_freq = 1.0f / float(std::pow(double(base), double(e)));
      const float a = p * inv_freq;
      const float c = std::cos(a), s = std::sin(a);
      for (int64_t hi = 0; hi < h; ++hi) {
        float* xr = x + (ti * h + hi) * dh;
        const float x0 = xr[i], x1 = xr[i + half];
        xr[i] = x0 * c - x1 * s;
        xr[i + half] = x1 * c + x0 * s;
      }
    }
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
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMinElems && rows > 1)
  for (int64_t r = 0; r < rows; ++r) softmax_row(x + r * n, n);
}

void round_to_bf16(const float* x, uint16_t* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

void binary_op(BinaryOp op, const float* a, int64_t na, const float* b, int64_t nb, float* y, int64_t n) {
  // The common cases (same size, or a row vector broadcast over rows) without a modulo per element.
  auto run = [&](auto fn) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
    for (int64_t i = 0; i < n; ++i) y[i] = fn(a[na == n ? i : i % na], b[nb == n ? i : i % nb]);
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
