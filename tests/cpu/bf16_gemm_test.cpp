// The AVX2 register-blocked bf16 GEMM (bf16_gemm.h) against a double reference over the rounded
// operands: shapes off every tile edge (uneven row tiles, partial W panels, K tails of the
// pack and the staging, K < 16, K past one K block),
// with and without bias; the same bits whatever the thread count; staging from bf16 equals
// staging from fp32. Skipped with a message where the active ISA is below AVX2.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/bf16_gemm.h"
#include "backends/cpu/cpu_isa.h"
#include "core/dtype.h"
#include "cpu/cpu_test_util.h"

namespace vlac::cpu {
namespace {

#define SKIP_WITHOUT_KERNEL()                                                                               \
  if (!bf16_gemm_available())                                                                               \
  GTEST_SKIP() << "bf16 register-blocked kernel: needs avx2 (active " << cpu_isa().name << ", native "   \
               << cpu_isa().native_name << ")"

struct Case {
  std::vector<uint16_t> wb;
  std::vector<float> x, wr, b;
};

Case make_case(int64_t m, int64_t k, int64_t n, bool bias, uint32_t seed) {
  Case c;
  c.x = testutil::uniform(size_t(m * k), seed);
  const auto w = testutil::uniform(size_t(n * k), seed + 1);
  c.wb = testutil::to_bf16(w);
  c.wr = testutil::widened(c.wb);
  if (bias) c.b = testutil::uniform(size_t(n), seed + 2);
  return c;
}

std::vector<float> run(const Case& c, int64_t m, int64_t k, int64_t n, int threads) {
  std::vector<float> xs(bf16_gemm_x_bytes(m, k) / 4 + 16), y(size_t(m * n), -1.0f);
  float* aligned = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(xs.data()) + 63) / 64 * 64);
  bf16_gemm_stage(c.x.data(), aligned, m, k);
  bf16_gemm_nk(aligned, c.wb.data(), c.b.empty() ? nullptr : c.b.data(), y.data(), m, k, n, threads);
  return y;
}

TEST(CpuBf16Gemm, MatchesTheRoundedReferenceOnEveryTileEdge) {
  SKIP_WITHOUT_KERNEL();
  for (int64_t m : {1, 5, 6, 7, 13, 50})
    // K: under one 8-step, odd, past one 256-block with an odd tail, 4 blocks + 48; N: partial
    // 16-column panels (1, 2, 3, 17), several panels with a tail, whole panels.
    for (int64_t k : {8, 16, 40, 53, 301, 1072})
      for (int64_t n : {1, 2, 3, 17, 65, 130})
        for (bool bias : {false, true}) {
          const Case c = make_case(m, k, n, bias, uint32_t(m * 1000 + k + n));
          const auto y = run(c, m, k, n, 2);
          const auto ref = testutil::reference(testutil::rounded(c.x), c.wr, c.b, m, k, n);
          ASSERT_LT(testutil::max_rel(y, ref), 1e-5) << "m=" << m << " k=" << k << " n=" << n << " bias=" << bias;
        }
}

TEST(CpuBf16Gemm, SameBitsWhateverTheThreadCount) {
  SKIP_WITHOUT_KERNEL();
  const int64_t m = 50, k = 520, n = 77;
  const Case c = make_case(m, k, n, true, 7);
  const auto y1 = run(c, m, k, n, 1);
  for (int t : {2, 3, 5}) EXPECT_EQ(run(c, m, k, n, t), y1) << t << " threads";
}

TEST(CpuBf16Gemm, StagingFromBf16EqualsStagingFromFp32) {
  SKIP_WITHOUT_KERNEL();
  const int64_t m = 9, k = 53;
  auto x = testutil::uniform(size_t(m * k), 11);
  x[3] = std::numeric_limits<float>::quiet_NaN();  // stays a NaN through the rounding
  x[4] = std::numeric_limits<float>::infinity();
  const auto xb = testutil::to_bf16(x);
  std::vector<float> a(bf16_gemm_x_bytes(m, k) / 4 + 16), b(a.size());
  auto align = [](std::vector<float>& v) {
    return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(v.data()) + 63) / 64 * 64);
  };
  const size_t used = bf16_gemm_x_bytes(m, k) / 4;
  float* pa = align(a);
  float* pb = align(b);
  std::fill(pa, pa + used, 0.0f);
  std::fill(pb, pb + used, 0.0f);
  bf16_gemm_stage(x.data(), pa, m, k);
  bf16_gemm_stage_bf16(xb.data(), pb, m, k);
  for (size_t i = 0; i < used; ++i) {
    if (std::isnan(pa[i])) {
      EXPECT_TRUE(std::isnan(pb[i])) << i;
    } else {
      EXPECT_EQ(pa[i], pb[i]) << i;
    }
  }
}

}  // namespace
}  // namespace vlac::cpu
