// Helpers the CPU kernel tests share: seeded random matrices, bf16 rounding of whole vectors, and
// the double-precision reference y = x·Wᵀ (+ b) with its max relative error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace vlac::cpu::testutil {

/// n values uniform in [lo, hi) from a fixed seed.
inline std::vector<float> uniform(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& a) {
  std::vector<uint16_t> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = f32_to_bf16(a[i]);
  return out;
}

inline std::vector<float> widened(const std::vector<uint16_t>& a) {
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = bf16_to_f32(a[i]);
  return out;
}

/// Each value rounded to bf16 and kept in fp32.
inline std::vector<float> rounded(std::vector<float> a) {
  for (float& x : a) x = bf16_to_f32(f32_to_bf16(x));
  return a;
}

/// y[M,N] = x·Wᵀ (+ b) in double, W [N,K] row-major; b empty for none.
inline std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w,
                                     const std::vector<float>& b, int64_t m, int64_t k, int64_t n) {
  std::vector<double> y(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = b.empty() ? 0.0 : b[size_t(j)];
      for (int64_t l = 0; l < k; ++l) s += double(x[size_t(i * k + l)]) * w[size_t(j * k + l)];
      y[size_t(i * n + j)] = s;
    }
  return y;
}

/// max |y - ref| / max |ref|.
inline double max_rel(const std::vector<float>& y, const std::vector<double>& ref) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < y.size(); ++i) {
    num = std::max(num, std::abs(y[i] - ref[i]));
    den = std::max(den, std::abs(ref[i]));
  }
  return num / den;
}

}  // namespace vlac::cpu::testutil
