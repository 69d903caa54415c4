// Elementwise kernels (GELU-tanh, GeGLU, SiLU), RoPE, softmax, time embedding and Euler step.
// fp32 math; never allocates. Loops over large arrays are split across the OpenMP threads
// (set_num_threads); each element is computed the same way whatever the thread count.
#include <algorithm>
#include <cmath>

#include "backends/cpu/kernels.h"
#include "core/dtype.h"

namespace vlac::cpu {
namespace {

inline float gelu_tanh_1(float v) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * v * (1.0f + std::tanh(kC * (v + 0.044715f * v * v * v)));
}

}  // namespace

void gelu_tanh(const float* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_tanh_1(x[i]);
}

void geglu(const float* gate, const float* up, float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_tanh_1(gate[i]) * up[i];
}

void silu(const float* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
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
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * n;
    float mx = xr[0];
    for (int64_t i = 1; i < n; ++i) mx = std::max(mx, xr[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += (xr[i] = std::exp(xr[i] - mx));
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) xr[i] *= inv;
  }
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
