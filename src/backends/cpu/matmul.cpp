// Linear layers through OpenBLAS sgemm: fp32 weights directly, bf16 weights widened per tile.
// Never allocates; bf16 tiles live in caller scratch.
#include <cblas.h>

#include <algorithm>
#include <climits>

#include "backends/cpu/kernels.h"
#include "core/dtype.h"

namespace vlac::cpu {
namespace {

// One sgemm: y[M, n_cols] (+)= x[M,K] · W[n_cols,K]ᵀ with row stride ldy for y.
void sgemm_nt(const float* x, const float* w, float* y, int64_t m, int64_t k, int64_t n_cols,
              int64_t ldy, float beta) {
  VLAC_CHECK(m < INT_MAX && k < INT_MAX && n_cols < INT_MAX && ldy < INT_MAX);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n_cols), int(k), 1.0f, x,
              int(k), w, int(k), beta, y, int(ldy));
}

// Fill y[M,N] rows with b (so sgemm can accumulate with beta = 1).
void fill_bias(const float* b, float* y, int64_t m, int64_t n) {
  for (int64_t i = 0; i < m; ++i) std::copy(b, b + n, y + i * n);
}

}  // namespace

void set_num_threads(int n) { openblas_set_num_threads(std::max(1, n)); }

void linear_f32(const float* x, const float* w, const float* b, float* y, int64_t m, int64_t k,
                int64_t n) {
  if (m == 0 || n == 0) return;
  if (b) fill_bias(b, y, m, n);
  sgemm_nt(x, w, y, m, k, n, n, b ? 1.0f : 0.0f);
}

int64_t linear_bf16_scratch_floats(int64_t k, int64_t n) {
  // About 4 MiB of fp32 weights per tile (fits L2/L3 next to the activations), at least 64 rows.
  int64_t rows = std::max<int64_t>(64, (int64_t{1} << 20) / std::max<int64_t>(1, k));
  return std::min(rows, std::max<int64_t>(n, 1)) * k;
}

void linear_bf16(const float* x, const uint16_t* w, const float* b, float* y, int64_t m, int64_t k,
                 int64_t n, float* scratch, int64_t scratch_floats) {
  VLAC_CHECK(k > 0 && scratch_floats >= k);
  if (m == 0 || n == 0) return;
  if (b) fill_bias(b, y, m, n);
  const int64_t tile = std::min(n, scratch_floats / k);
  for (int64_t n0 = 0; n0 < n; n0 += tile) {
    const int64_t rows = std::min(tile, n - n0);
    const uint16_t* src = w + n0 * k;
    for (int64_t i = 0; i < rows * k; ++i) scratch[i] = bf16_to_f32(src[i]);
    sgemm_nt(x, scratch, y + n0, m, k, rows, n, b ? 1.0f : 0.0f);
  }
}

}  // namespace vlac::cpu
