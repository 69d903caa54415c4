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

/// The attention probabilities of query row (ti, hi) in double: softmax over the keys j of
/// q[ti, hi]·k[j]·scale, a key with allow[ti·S + j] == 0 at exactly zero. q [T,H,Dh], k [S,Dh].
inline std::vector<double> attention_probs(const std::vector<float>& q, const std::vector<float>& k,
                                           const std::vector<uint8_t>& allow, int64_t ti, int64_t hi, int64_t h,
                                           int64_t s, int64_t dh, float scale) {
  std::vector<double> p(static_cast<size_t>(s));
  double mx = -1e300, sum = 0;
  for (int64_t j = 0; j < s; ++j) {
    double d = 0;
    for (int64_t c = 0; c < dh; ++c) d += double(q[size_t((ti * h + hi) * dh + c)]) * k[size_t(j * dh + c)];
    p[size_t(j)] = allow[size_t(ti * s + j)] ? d * scale : -1e300;
    mx = std::max(mx, p[size_t(j)]);
  }
  for (double& e : p) sum += (e = e < -1e299 ? 0.0 : std::exp(e - mx));
  for (double& e : p) e /= sum;
  return p;
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
