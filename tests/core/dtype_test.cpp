// Spot checks of the float conversions (the exhaustive bf16 check lives in tests/io).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/dtype.h"

namespace vlac {

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtype_from_name("BF16"), DType::BF16);
  EXPECT_EQ(dtype_from_name("F8_E4M3"), DType::F8_E4M3);
  EXPECT_FALSE(dtype_from_name("F128").has_value());
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::BOOL), 1u);
  EXPECT_TRUE(dtype_is_float(DType::BF16));
  EXPECT_FALSE(dtype_is_float(DType::I64));
}

TEST(DType, Fp16Specials) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // halfway to 65536 rounds to even: Inf
  EXPECT_EQ(f32_to_f16(-1e9f), 0xFC00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);   // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);   // tie to even: 0
  EXPECT_EQ(f32_to_f16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);   // smallest normal
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
}

TEST(DType, Bf16Specials) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x7F7FFFFF)), 0x7F80);  // overflow to Inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f32_from_bits(0x7F800001)))));
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0xFF800000)), 0xFF80);
}

TEST(DType, F8Decoders) {
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x7E), 448.0f);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7F)));
  EXPECT_EQ(f8e5m2_to_f32(0x3C), 1.0f);
  EXPECT_TRUE(std::isinf(f8e5m2_to_f32(0x7C)));
}

// The E4M3 encoder inverts the decoder on every finite code (both zeros and the subnormals
// included), rounds to nearest even between neighbours, saturates at ±448 and keeps NaN.
TEST(DType, F8E4M3Encoder) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN
    const float f = f8e4m3_to_f32(uint8_t(c));
    EXPECT_EQ(f32_to_f8e4m3(f), c) << "code " << c << " value " << f;
  }
  for (int c = 0; c < 0x7E; ++c) {  // each pair of positive neighbours: the midpoint and either side
    const float lo = f8e4m3_to_f32(uint8_t(c)), hi = f8e4m3_to_f32(uint8_t(c + 1));
    const float mid = (lo + hi) / 2;  // exact: neighbours share at most one binade step
    EXPECT_EQ(f32_to_f8e4m3(mid), (c % 2 == 0) ? c : c + 1) << "midpoint after code " << c;
    EXPECT_EQ(f32_to_f8e4m3(std::nextafter(mid, 0.0f)), c) << "below the midpoint after code " << c;
    EXPECT_EQ(f32_to_f8e4m3(std::nextafter(mid, 1000.0f)), c + 1) << "above the midpoint after code " << c;
    EXPECT_EQ(f32_to_f8e4m3(-mid), 0x80 | ((c % 2 == 0) ? c : c + 1));
  }
  EXPECT_EQ(f32_to_f8e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_f8e4m3(460.0f), 0x7E);
  EXPECT_EQ(f32_to_f8e4m3(1e30f), 0x7E);
  EXPECT_EQ(f32_to_f8e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -11)), 0x00);  // below half the smallest subnormal
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 steps of 2^-9: to even (2)
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(3.0f, -11)), 0x01);  // 0.75 of a step: up to 1
  EXPECT_EQ(f32_to_f8e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_f8e4m3(std::nanf("")) & 0x7F, 0x7F);
}

}  // namespace vlac
