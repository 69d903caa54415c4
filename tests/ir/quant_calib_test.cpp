// GPTQ rounding from activation statistics (ir/quant_calib.h): the statistics, the factor, and
// that the rounding lowers the output error it is meant to lower.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/quant.h"
#include "ir/quant_calib.h"

namespace vlac::ir {
namespace {

// Σ_rows |x·(w − ŵ)|² for one weight row against inputs x [rows, k].
double output_error(const std::vector<float>& x, int64_t rows, int64_t k, const std::vector<float>& w,
                    const std::vector<uint8_t>& codes, float scale, DType dt) {
  double e = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double d = 0.0;
    for (int64_t i = 0; i < k; ++i) d += double(x[size_t(r * k + i)]) * (w[size_t(i)] - quant_decode(dt, codes[size_t(i)]) * scale);
    e += d * d;
  }
  return e;
}

// Inputs that move together (a few shared factors plus noise), as a layer's activations do.
std::vector<float> correlated_inputs(int64_t rows, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int64_t factors = 4;
  std::vector<float> mix(size_t(factors * k));
  for (float& v : mix) v = n(rng);
  std::vector<float> x(size_t(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    float f[factors];
    for (float& v : f) v = n(rng);
    for (int64_t i = 0; i < k; ++i) {
      float v = 0.1f * n(rng);
      for (int64_t j = 0; j < factors; ++j) v += f[j] * mix[size_t(j * k + i)];
      x[size_t(r * k + i)] = v;
    }
  }
  return x;
}

TEST(QuantCalib, StatisticsAreTheBlockDiagonalOfXtX) {
  QuantCalibration c(2, 0.01);
  const std::vector<float> x = {1, 2, 3, 4, 5,  //
                                -1, 0, 2, 1, 3};
  c.observe("w", x.data(), 2, 5);
  const InputStats* s = c.find("w");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->k, 5);
  EXPECT_EQ(s->block, 2);
  EXPECT_EQ(s->rows, 2u);
  // Blocks [0,1], [2,3], [4]: 4 + 4 + 1 floats.
  ASSERT_EQ(s->h.size(), 9u);
  EXPECT_EQ(s->h, (std::vector<float>{2, 2, 2, 4, 13, 14, 14, 17, 34}));
  c.observe("w", x.data(), 1, 4);  // another width: ignored
  EXPECT_EQ(c.find("w")->rows, 2u);
  EXPECT_EQ(c.find("v"), nullptr);
  EXPECT_EQ(c.bytes(), 36u);
}

// observe splits the blocks over its threads: the same bits for any count, a last short block too.
TEST(QuantCalib, StatisticsAreTheSameForAnyThreadCount) {
  std::mt19937 rng(3);
  const int64_t rows = 64, k = 1000;  // 7 full blocks of 128 and one of 104
  const std::vector<float> x = correlated_inputs(rows, k, rng);
  std::vector<float> h1;
  for (int threads : {1, 3, 8}) {
    QuantCalibration c(128, 0.01, true, threads);
    c.observe("w", x.data(), rows, k);
    c.observe("w", x.data() + 10 * k, 20, k);
    const InputStats* s = c.find("w");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->rows, uint64_t(rows + 20));
    if (threads == 1) h1 = s->h;
    else EXPECT_EQ(s->h, h1) << threads << " threads";
  }
}

TEST(QuantCalib, UncorrelatedInputsRoundToNearest) {
  // H = diag: no error has anywhere to go, so the codes are quantize_row's, bit for bit.
  const int64_t k = 24;
  std::vector<float> x(size_t(k * k), 0.0f);
  for (int64_t i = 0; i < k; ++i) x[size_t(i * k + i)] = 1.0f + 0.1f * float(i);
  QuantCalibration c(8, 0.01);
  c.observe("w", x.data(), k, k);
  auto f = gptq_factor(*c.find("w"), c.damp(), "w");
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (DType dt : {DType::I8, DType::F8_E4M3}) {
    std::vector<float> w(static_cast<size_t>(k));
    for (float& v : w) v = u(rng);
    std::vector<uint8_t> a(static_cast<size_t>(k)), b(static_cast<size_t>(k));
    const float sa = quantize_row(w.data(), k, dt, a.data());
    std::vector<float> work = w;
    const float sb = quantize_row_gptq(work.data(), k, dt, b.data(), *f);
    EXPECT_EQ(sa, sb);
    EXPECT_EQ(a, b);
  }
}

TEST(QuantCalib, GptqLowersTheOutputErrorOnCorrelatedInputs) {
  const int64_t k = 96, rows = 256, nrows = 32;
  std::mt19937 rng(7);
  const std::vector<float> x = correlated_inputs(rows, k, rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t block : {int64_t(128), int64_t(32)}) {
    QuantCalibration c(block, 0.01);
    c.observe("w", x.data(), rows, k);
    auto f = gptq_factor(*c.find("w"), c.damp(), "w");
    ASSERT_TRUE(f.is_ok()) << f.status().message();
    for (DType dt : {DType::I8, DType::F8_E4M3}) {
      double rtn = 0.0, gptq = 0.0;
      for (int64_t n = 0; n < nrows; ++n) {
        std::vector<float> w(static_cast<size_t>(k));
        for (float& v : w) v = u(rng);
        std::vector<uint8_t> a(static_cast<size_t>(k)), b(static_cast<size_t>(k));
        const float sa = quantize_row(w.data(), k, dt, a.data());
        std::vector<float> work = w;
        const float sb = quantize_row_gptq(work.data(), k, dt, b.data(), *f);
        EXPECT_EQ(sa, sb);  // the row's own scale either way
        rtn += output_error(x, rows, k, w, a, sa, dt);
        gptq += output_error(x, rows, k, w, b, sb, dt);
      }
      std::printf("[ gptq     ] block %lld %s: output error %.4g (nearest) -> %.4g (GPTQ), %.2fx\n", (long long)block,
                  dt == DType::I8 ? "int8" : "fp8", rtn, gptq, rtn / gptq);
      EXPECT_LT(gptq, 0.5 * rtn) << block;
    }
  }
}

TEST(QuantCalib, NonFiniteAndZeroRowsKeepTheirMeaning) {
  const int64_t k = 8;
  std::vector<float> x(size_t(4 * k));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 5) - 2.0f;
  QuantCalibration c(128, 0.01);
  c.observe("w", x.data(), 4, k);
  auto f = gptq_factor(*c.find("w"), c.damp(), "w");
  ASSERT_TRUE(f.is_ok());
  std::vector<uint8_t> codes(size_t(k), 9);
  std::vector<float> zero(size_t(k), 0.0f);
  EXPECT_EQ(quantize_row_gptq(zero.data(), k, DType::I8, codes.data(), *f), 0.0f);
  for (uint8_t cd : codes) EXPECT_EQ(cd, 0);
  std::vector<float> bad(size_t(k), 1.0f);
  bad[3] = std::nanf("");
  EXPECT_TRUE(std::isnan(quantize_row_gptq(bad.data(), k, DType::I8, codes.data(), *f)));
}

TEST(QuantCalib, AnIndefiniteBlockIsAnErrorNamingTheWeight) {
  InputStats s;
  s.k = 2;
  s.block = 2;
  s.rows = 1;
  s.h = {1.0f, 0.0f, 0.0f, std::nanf("")};
  auto f = gptq_factor(s, 0.01, "layer.q_proj.weight");
  ASSERT_FALSE(f.is_ok());
  EXPECT_NE(f.status().message().find("layer.q_proj.weight"), std::string::npos) << f.status().message();
}

}  // namespace
}  // namespace vlac::ir
