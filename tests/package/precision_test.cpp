// The manifest precisions' derived defaults (package/pi05_precision.h).
#include "package/pi05_precision.h"

#include <gtest/gtest.h>

namespace vlac {
namespace {

namespace pp = pi05_precision;

TEST(Pi05Precision, W8a8PackagesKeepOneLaneByDefault) {
  for (std::string_view p : {pp::kInt8Weights, pp::kFp8Weights, pp::kFp8W8a8}) EXPECT_TRUE(pp::eight_bit(p)) << p;
  EXPECT_FALSE(pp::step_overlap_default(pp::kFp8W8a8)) << "slower with a second lane (session 35)";
  // The W8A16 packages have room for it since their vision plans no fp32 GEMM with cuBLASLt (session 38).
  for (std::string_view p : {pp::kInt8Weights, pp::kFp8Weights}) EXPECT_TRUE(pp::step_overlap_default(p)) << p;
  for (std::string_view p : {pp::kFp32, pp::kBf16Lerobot, pp::kBf16All, std::string_view()}) {
    EXPECT_FALSE(pp::eight_bit(p)) << p;
    EXPECT_TRUE(pp::step_overlap_default(p)) << p;
  }
}

TEST(Pi05Precision, FastVisionAndShortNames) {
  EXPECT_FALSE(pp::fast_vision(pp::kFp32));
  EXPECT_FALSE(pp::fast_vision(pp::kBf16Lerobot));
  EXPECT_FALSE(pp::fast_vision(""));
  EXPECT_TRUE(pp::fast_vision(pp::kBf16All));
  EXPECT_TRUE(pp::fast_vision(pp::kInt8Weights));
  EXPECT_EQ(pp::short_name(pp::kInt8Weights, true), "int8");
  EXPECT_EQ(pp::short_name(pp::kFp8W8a8, true), "fp8-w8a8");
  EXPECT_EQ(pp::short_name(pp::kBf16All, true), "bf16");
  EXPECT_EQ(pp::short_name(pp::kFp32, false), "fp32");
}

}  // namespace
}  // namespace vlac
