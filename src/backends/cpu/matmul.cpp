// fp32 GEMM through oneDNN's sgemm (im2col patch embedding, tests, references) and the thread
// setting shared by every kernel. The executor's Linear nodes go through DnnlLinear instead.
#include <omp.h>

#include <algorithm>

#include <dnnl.h>

#include "backends/cpu/kernels.h"

namespace vlac::cpu {

void set_num_threads(int n) { omp_set_num_threads(std::max(1, n)); }

void linear_f32(const float* x, const float* w, const float* b, float* y, int64_t m, int64_t k,
                int64_t n) {
  if (m == 0 || n == 0) return;
  if (b)
    for (int64_t i = 0; i < m; ++i) std::copy(b, b + n, y + i * n);
  // Row-major y[M,N] = x[M,K] · W[N,K]ᵀ: oneDNN's sgemm takes row-major operands directly.
  const dnnl_status_t st = dnnl_sgemm('N', 'T', m, n, k, 1.0f, x, k, w, k, b ? 1.0f : 0.0f, y, n);
  VLAC_CHECK(st == dnnl_success);
}

}  // namespace vlac::cpu
