// 8-bit weight kernels of the CPU backend (see quant_gemm.h). Plain loops: GCC vectorizes the
// int8 widening (sign-extend + convert) at every ISA level; e4m3 goes through the 256-entry table.
#include "backends/cpu/quant_gemm.h"

#include <omp.h>

#include <cstdlib>
#include <string>

#include "core/quant.h"

namespace vlac::cpu {

void widen_codes(const uint8_t* c, DType dt, float* y, int64_t n) {
  if (dt == DType::I8) {
    const auto* s = reinterpret_cast<const int8_t*>(c);
    for (int64_t i = 0; i < n; ++i) y[i] = float(s[i]);
    return;
  }
  const float* t = quant_table(dt);
  for (int64_t i = 0; i < n; ++i) y[i] = t[c[i]];
}

bool emulate_fp8_activations() {
  static const bool on = [] {
    const char* e = std::getenv("VLAC_CPU_FP8_ACT");
    return e && std::string(e) == "1";
  }();
  return on;
}

void round_rows_e4m3(float* x, int64_t m, int64_t k) {
  for (int64_t r = 0; r < m; ++r) {
    float* row = x + r * k;
    const float s = quant_row_scale(row, k, DType::F8_E4M3);
    if (!(s > 0.0f)) continue;  // zero rows stay, non-finite ones stay as they are
    for (int64_t i = 0; i < k; ++i) row[i] = quant_decode(DType::F8_E4M3, quant_code(row[i] / s, DType::F8_E4M3)) * s;
  }
}

void quant_gemv(const float* x, const uint8_t* codes, const float* scales, DType dt, const float* b, float* y,
                int64_t k, int64_t n) {
  constexpr int64_t kLanes = 16, kStep = 256;
#pragma omp parallel for schedule(static) if (n * k >= (1 << 16))
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* wr = codes + r * k;
    float lane[kLanes] = {};
    float wf[kStep];
    for (int64_t i0 = 0; i0 < k; i0 += kStep) {
      const int64_t len = k - i0 < kStep ? k - i0 : kStep;
      widen_codes(wr + i0, dt, wf, len);
      for (int64_t i = 0; i < len; ++i) lane[i % kLanes] += x[i0 + i] * wf[i];
    }
    float sum = 0.0f;
    for (int64_t l = 0; l < kLanes; ++l) sum += lane[l];
    y[r] = sum * scales[r] + (b ? b[r] : 0.0f);
  }
}

}  // namespace vlac::cpu
