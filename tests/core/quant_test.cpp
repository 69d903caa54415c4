// Per-row 8-bit weights (core/quant.h): the blob layout, the scale from the row's largest
// magnitude, rounding, zero rows, non-finite rows, and sizes that overflow.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/quant.h"

namespace vlac {
namespace {

TEST(Quant, BlobLayoutPadsTheCodesTo64Bytes) {
  EXPECT_EQ(quant_scales_offset(3, 40), 128u);  // 120 codes -> 128
  EXPECT_EQ(quant_scales_offset(2, 32), 64u);
  EXPECT_EQ(stored_weight_bytes(DType::I8, {3, 40}), 128u + 12u);
  EXPECT_EQ(stored_weight_bytes(DType::F8_E4M3, {1024, 2048}), 1024u * 2048u + 4096u);
  // Not a matrix, or not 8-bit: numel x size as before.
  EXPECT_EQ(stored_weight_bytes(DType::I8, {7}), 7u);
  EXPECT_EQ(stored_weight_bytes(DType::BF16, {3, 40}), 240u);
  EXPECT_TRUE(is_quant_matrix(DType::I8, {3, 40}));
  EXPECT_FALSE(is_quant_matrix(DType::I8, {3, 4, 5}));
  EXPECT_FALSE(is_quant_matrix(DType::BF16, {3, 40}));
  // A corrupt shape cannot wrap around to a small size.
  EXPECT_EQ(stored_weight_bytes(DType::I8, {int64_t(1) << 40, int64_t(1) << 40}), UINT64_MAX);
  EXPECT_EQ(stored_weight_bytes(DType::F32, {int64_t(1) << 40, int64_t(1) << 30}), UINT64_MAX);
}

TEST(Quant, Int8RowMapsItsLargestMagnitudeTo127AndRoundsToNearest) {
  const std::vector<float> row = {0.5f, -2.0f, 1.0f, 0.0078125f, -0.01f, 1.99f};
  std::vector<uint8_t> c(row.size());
  const float s = quantize_row(row.data(), int64_t(row.size()), DType::I8, c.data());
  EXPECT_FLOAT_EQ(s, 2.0f / 127.0f);
  EXPECT_EQ(int8_t(c[1]), -127);
  for (size_t i = 0; i < row.size(); ++i) {
    const float back = quant_decode(DType::I8, c[i]) * s;
    EXPECT_LE(std::fabs(back - row[i]), s / 2 * (1 + 1e-6f)) << i;  // nearest code
    EXPECT_GE(int8_t(c[i]), -127);
  }
}

TEST(Quant, Fp8RowMapsItsLargestMagnitudeTo448) {
  std::vector<float> row;
  for (int i = 0; i < 64; ++i) row.push_back(std::sin(float(i)) * 3.0f);
  row[5] = -7.5f;
  std::vector<uint8_t> c(row.size());
  const float s = quantize_row(row.data(), int64_t(row.size()), DType::F8_E4M3, c.data());
  EXPECT_FLOAT_EQ(s, 7.5f / 448.0f);
  EXPECT_EQ(quant_decode(DType::F8_E4M3, c[5]), -448.0f);
  for (size_t i = 0; i < row.size(); ++i) {
    const float back = quant_decode(DType::F8_E4M3, c[i]) * s;
    // e4m3 keeps 3 fraction bits: within half a step, 1/16 of the value's binade.
    EXPECT_LE(std::fabs(back - row[i]), std::fabs(row[i]) / 16 + s * 0x1p-9f) << i;
  }
  // The table agrees with the decoder on every code.
  for (int code = 0; code < 256; ++code) {
    const float a = quant_table(DType::F8_E4M3)[code], b = quant_decode(DType::F8_E4M3, uint8_t(code));
    EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << code;
    EXPECT_EQ(quant_table(DType::I8)[code], float(int8_t(code)));
  }
}

TEST(Quant, ZeroRowHasScaleZeroAndNonFiniteRowsAreRefused) {
  std::vector<float> zeros(10, 0.0f);
  std::vector<uint8_t> c(10, 0xAB);
  EXPECT_EQ(quantize_row(zeros.data(), 10, DType::I8, c.data()), 0.0f);
  for (uint8_t v : c) EXPECT_EQ(v, 0);
  std::vector<float> bad = {1.0f, NAN, 2.0f};
  EXPECT_TRUE(std::isnan(quantize_row(bad.data(), 3, DType::I8, c.data())));
  bad[1] = INFINITY;
  EXPECT_TRUE(std::isnan(quantize_row(bad.data(), 3, DType::F8_E4M3, c.data())));
}

}  // namespace
}  // namespace vlac
