// Activation statistics and GPTQ rounding for 8-bit weights (see quant_calib.h).
#include "ir/quant_calib.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/quant.h"

namespace vlac::ir {

namespace {

int64_t block_width(int64_t k, int64_t block, int64_t b0) { return std::min(block, k - b0); }

// In-place lower Cholesky of the n×n row-major `a` (the upper triangle is left alone); false when
// a pivot is not positive.
bool cholesky_lower(std::vector<double>& a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    double d = a[size_t(j * n + j)];
    for (int64_t p = 0; p < j; ++p) d -= a[size_t(j * n + p)] * a[size_t(j * n + p)];
    if (!(d > 0.0)) return false;
    d = std::sqrt(d);
    a[size_t(j * n + j)] = d;
    for (int64_t i = j + 1; i < n; ++i) {
      double v = a[size_t(i * n + j)];
      for (int64_t p = 0; p < j; ++p) v -= a[size_t(i * n + p)] * a[size_t(j * n + p)];
      a[size_t(i * n + j)] = v / d;
    }
  }
  return true;
}

// U upper with (H + λI)⁻¹ = UᵀU for one block (w×w, doubles); false when indefinite.
bool block_factor(const float* h, int64_t w, double damp, std::vector<float>& u_out) {
  std::vector<double> a(size_t(w * w));
  double mean = 0.0;
  for (int64_t i = 0; i < w; ++i) {
    for (int64_t j = 0; j < w; ++j) a[size_t(i * w + j)] = h[i * w + j];
    if (a[size_t(i * w + i)] <= 0.0) {  // an input never seen non-zero
      for (int64_t j = 0; j < w; ++j) a[size_t(i * w + j)] = a[size_t(j * w + i)] = 0.0;
      a[size_t(i * w + i)] = 1.0;
    }
    mean += a[size_t(i * w + i)];
  }
  mean /= double(w);
  double lambda = damp * mean;
  for (int tries = 0; tries < 6; ++tries, lambda *= 10.0) {
    std::vector<double> l = a;
    for (int64_t i = 0; i < w; ++i) l[size_t(i * w + i)] += lambda;
    if (!cholesky_lower(l, w)) continue;
    // L⁻¹ (lower), then (LLᵀ)⁻¹ = L⁻ᵀL⁻¹.
    std::vector<double> li(size_t(w * w), 0.0);
    for (int64_t j = 0; j < w; ++j) {
      li[size_t(j * w + j)] = 1.0 / l[size_t(j * w + j)];
      for (int64_t i = j + 1; i < w; ++i) {
        double v = 0.0;
        for (int64_t p = j; p < i; ++p) v -= l[size_t(i * w + p)] * li[size_t(p * w + j)];
        li[size_t(i * w + j)] = v / l[size_t(i * w + i)];
      }
    }
    std::vector<double> inv(size_t(w * w), 0.0);
    for (int64_t i = 0; i < w; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        double v = 0.0;
        for (int64_t p = i; p < w; ++p) v += li[size_t(p * w + i)] * li[size_t(p * w + j)];
        inv[size_t(i * w + j)] = inv[size_t(j * w + i)] = v;
      }
    // Upper Cholesky of the inverse: its lower factor, transposed.
    if (!cholesky_lower(inv, w)) continue;
    for (int64_t i = 0; i < w; ++i)
      for (int64_t j = 0; j < w; ++j) u_out[size_t(i * w + j)] = j >= i ? float(inv[size_t(j * w + i)]) : 0.0f;
    return true;
  }
  return false;
}

}  // namespace

double default_gptq_damp(DType weights) { return weights == DType::I8 ? 1.0 : 0.01; }

QuantCalibration::QuantCalibration(int64_t block, double damp, bool act_order, int threads)
    : block_(std::max<int64_t>(1, block)), damp_(damp), act_order_(act_order), threads_(std::max(1, threads)) {}

void QuantCalibration::observe(const std::string& weight, const float* x, int64_t rows, int64_t k) {
  if (rows <= 0 || k <= 0) return;
  InputStats& s = stats_[weight];
  if (s.k == 0) {
    s.k = k;
    s.block = std::min(block_, k);
    const int64_t full = k / s.block, last = k - full * s.block;
    s.h.assign(size_t(full * s.block * s.block + last * last), 0.0f);
  }
  if (s.k != k) return;
  // Blocks [first, last): each block's sums see the rows in order, so the statistics are the same
  // bits for any thread count. Block by block, every row through one block before the next: a
  // block (64 KiB at 128 inputs) stays in cache while the rows stream past, where a row through
  // every block would sweep the whole k·block statistics (8 MiB for k = 16384) once per row.
  const int64_t blocks = (k + s.block - 1) / s.block;
  auto add = [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const int64_t b0 = b * s.block, w = block_width(k, s.block, b0);
      float* hb = s.h.data() + b0 * s.block;
      for (int64_t r = 0; r < rows; ++r) {
        const float* xb = x + r * k + b0;
        for (int64_t i = 0; i < w; ++i) {
          const float xi = xb[i];
          if (xi == 0.0f) continue;
          float* hr = hb + i * w;
          for (int64_t j = 0; j < w; ++j) hr[j] += xi * xb[j];
        }
      }
    }
  };
  // Threads only where the work pays for starting them (~1 M multiply-adds each).
  const int64_t work = rows * k * s.block;
  const int64_t nt = std::min<int64_t>({threads_, blocks, std::max<int64_t>(1, work >> 20)});
  // The calibration run calls this between the CPU backend's OpenMP loops and oneDNN's, whose
  // workers still spin for work: threads of its own would compete with them for the cores
  // (session 40: 2 threads observed slower than 1), so the same pool takes this loop. Builds
  // without OpenMP (the clang fuzz build) run it serially: the same ranges, the same bits.
#if defined(_OPENMP)
#pragma omp parallel for schedule(static, 1) num_threads(int(nt)) if (nt > 1)
#endif
  for (int64_t t = 0; t < nt; ++t) add(blocks * t / nt, blocks * (t + 1) / nt);
  s.rows += uint64_t(rows);
}

const InputStats* QuantCalibration::find(const std::string& weight) const {
  auto it = stats_.find(weight);
  return it == stats_.end() ? nullptr : &it->second;
}

uint64_t QuantCalibration::bytes() const {
  uint64_t b = 0;
  for (const auto& [name, s] : stats_) b += uint64_t(s.h.size()) * 4;
  return b;
}

Result<GptqFactor> gptq_factor(const InputStats& s, double damp, const std::string& name, bool act_order) {
  GptqFactor f;
  f.k = s.k;
  f.block = s.block;
  f.u.assign(s.h.size(), 0.0f);
  f.order.resize(size_t(s.k));
  std::vector<float> u, hp;
  for (int64_t b0 = 0; b0 < s.k; b0 += s.block) {
    const int64_t w = block_width(s.k, s.block, b0);
    const float* h = s.h.data() + b0 * s.block;
    int32_t* ord = f.order.data() + b0;
    for (int64_t i = 0; i < w; ++i) ord[i] = int32_t(i);
    if (act_order)
      std::stable_sort(ord, ord + w, [&](int32_t a, int32_t b) { return h[a * w + a] > h[b * w + b]; });
    hp.resize(size_t(w * w));
    for (int64_t i = 0; i < w; ++i)
      for (int64_t j = 0; j < w; ++j) hp[size_t(i * w + j)] = h[ord[i] * w + ord[j]];
    u.assign(size_t(w * w), 0.0f);
    if (!block_factor(hp.data(), w, damp, u))
      return invalid_argument("calibration of '" + name + "': the input statistics of columns " + std::to_string(b0) +
                              ".." + std::to_string(b0 + w - 1) + " are not positive definite, even damped");
    std::copy(u.begin(), u.end(), f.u.begin() + b0 * s.block);
  }
  return f;
}

float quantize_row_gptq(float* row, int64_t k, DType dt, uint8_t* codes, const GptqFactor& f) {
  const float scale = quant_row_scale(row, k, dt);
  if (!(scale == scale) || scale == 0.0f || f.k != k) return quantize_row(row, k, dt, codes);
  for (int64_t b0 = 0; b0 < k; b0 += f.block) {
    const int64_t w = block_width(k, f.block, b0);
    const float* u = f.u.data() + b0 * f.block;
    const int32_t* ord = f.order.data() + b0;
    // The block in rounding order, contiguous, so the update loop vectorizes.
    thread_local std::vector<float> t;
    t.resize(size_t(w));
    for (int64_t i = 0; i < w; ++i) t[size_t(i)] = row[b0 + ord[i]];
    float* tb = t.data();
    for (int64_t i = 0; i < w; ++i) {
      const uint8_t c = quant_code(tb[i] / scale, dt);
      codes[b0 + ord[i]] = c;
      const float err = (tb[i] - quant_decode(dt, c) * scale) / u[i * w + i];
      const float* ui = u + i * w;
      for (int64_t j = i + 1; j < w; ++j) tb[j] -= err * ui[j];
    }
    for (int64_t i = 0; i < w; ++i) row[b0 + ord[i]] = tb[i];
  }
  return scale;
}

}  // namespace vlac::ir
