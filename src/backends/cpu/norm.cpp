// LayerNorm, RMSNorm (1 + w) and adaptive RMSNorm; statistics accumulated in double, output fp32.
// Never allocates. Rows are split across the OpenMP threads (each row computed the same way).
#include <cmath>

#include "backends/cpu/kernels.h"

namespace vlac::cpu {

void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t d,
                float eps) {
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElems && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    double sum = 0;
    for (int64_t i = 0; i < d; ++i) sum += xr[i];
    const double mean = sum / double(d);
    double var = 0;
    for (int64_t i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    const float inv = float(1.0 / std::sqrt(var / double(d) + double(eps)));
    const float meanf = float(mean);
    for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] - meanf) * inv * w[i] + b[i];
  }
}

// rsqrt(mean(x²) + eps) of one row, computed in double and rounded once.
static float rms_inv(const float* xr, int64_t d, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
  return float(1.0 / std::sqrt(ss / double(d) + double(eps)));
}

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t d, float eps) {
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElems && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    const float inv = rms_inv(xr, d, eps);
    for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] * inv) * (1.0f + w[i]);
  }
}

void ada_rms_norm(const float* x, const float* mod, float* y, float* gate, int64_t rows, int64_t d,
                  float eps) {
  const float* scale = mod;
  const float* shift = mod + d;
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElems && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    const float inv = rms_inv(xr, d, eps);
    for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] * inv) * (1.0f + scale[i]) + shift[i];
  }
  if (gate)
    for (int64_t i = 0; i < d; ++i) gate[i] = mod[2 * d + i];
}

}  // namespace vlac::cpu
