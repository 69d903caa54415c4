// Per-row 8-bit weight quantization (see quant.h).
#include "core/quant.h"

#include <array>
#include <cmath>

namespace vlac {

bool is_quant_dtype(DType dt) { return dt == DType::I8 || dt == DType::F8_E4M3; }

bool is_quant_matrix(DType dt, const std::vector<int64_t>& shape) { return is_quant_dtype(dt) && shape.size() == 2; }

float quant_max(DType dt) { return dt == DType::I8 ? 127.0f : 448.0f; }

uint64_t quant_scales_offset(int64_t rows, int64_t cols) { return (uint64_t(rows) * uint64_t(cols) + 63) / 64 * 64; }

uint64_t stored_weight_bytes(DType dt, const std::vector<int64_t>& shape) {
  uint64_t n = is_quant_matrix(dt, shape) ? 1 : dtype_size(dt);
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, uint64_t(d), &n)) return UINT64_MAX;
  if (!is_quant_matrix(dt, shape)) return n;
  if (n > UINT64_MAX / 2) return UINT64_MAX;  // (no real matrix comes near; keeps the sums below exact)
  return quant_scales_offset(shape[0], shape[1]) + uint64_t(shape[0]) * 4;
}

float quant_decode(DType dt, uint8_t code) {
  return dt == DType::I8 ? float(int8_t(code)) : f8e4m3_to_f32(code);
}

const float* quant_table(DType dt) {
  static const auto tables = [] {
    std::array<std::array<float, 256>, 2> t{};
    for (int c = 0; c < 256; ++c) {
      t[0][size_t(c)] = quant_decode(DType::I8, uint8_t(c));
      t[1][size_t(c)] = quant_decode(DType::F8_E4M3, uint8_t(c));
    }
    return t;
  }();
  return tables[dt == DType::I8 ? 0 : 1].data();
}

uint8_t quant_code(float q, DType dt) {
  if (dt != DType::I8) return f32_to_f8e4m3(q);
  const float r = std::nearbyint(std::fmin(std::fmax(q, -127.0f), 127.0f));  // default mode: nearest even
  return uint8_t(int8_t(r));
}

float quant_row_scale(const float* row, int64_t k, DType dt) {
  float amax = 0.0f;
  for (int64_t i = 0; i < k; ++i) {
    const float a = std::fabs(row[i]);
    if (!std::isfinite(a)) return std::nanf("");
    amax = std::fmax(amax, a);
  }
  return amax / quant_max(dt);
}

float quantize_row(const float* row, int64_t k, DType dt, uint8_t* codes) {
  const float scale = quant_row_scale(row, k, dt);
  if (!(scale == scale)) return scale;
  if (scale == 0.0f) {
    for (int64_t i = 0; i < k; ++i) codes[i] = 0;
    return 0.0f;
  }
  for (int64_t i = 0; i < k; ++i) codes[i] = quant_code(row[i] / scale, dt);
  return scale;
}

}  // namespace vlac
