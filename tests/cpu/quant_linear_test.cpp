// 8-bit weight matrices on the CPU (DnnlLinear with I8 / F8_E4M3 blobs, quant_gemm.h) against a
// double reference of the same arithmetic: activations rounded to bf16, codes decoded, each
// output's sum times its row's scale, plus the bias. Runs on every ISA cap (scripts/test.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backends/cpu/dnnl_linear.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/quant_gemm.h"
#include "core/quant.h"
#include "cpu/cpu_test_util.h"

namespace vlac::cpu {
namespace {

using testutil::uniform;

// W [n, k] -> its blob (codes, padding, scales).
std::vector<uint8_t> blob_of(const std::vector<float>& w, int64_t n, int64_t k, DType dt) {
  std::vector<uint8_t> b(stored_weight_bytes(dt, {n, k}), 0);
  auto* scales = reinterpret_cast<float*>(b.data() + quant_scales_offset(n, k));
  for (int64_t r = 0; r < n; ++r) scales[r] = quantize_row(w.data() + r * k, k, dt, b.data() + r * k);
  return b;
}

std::vector<double> quant_reference(const std::vector<float>& x, const std::vector<uint8_t>& blob, DType dt,
                                    const std::vector<float>& b, int64_t m, int64_t k, int64_t n) {
  const auto* scales = reinterpret_cast<const float*>(blob.data() + quant_scales_offset(n, k));
  std::vector<double> y(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t kk = 0; kk < k; ++kk)
        s += double(bf16_to_f32(f32_to_bf16(x[size_t(i * k + kk)]))) * double(quant_decode(dt, blob[size_t(j * k + kk)]));
      y[size_t(i * n + j)] = s * double(scales[j]) + (b.empty() ? 0.0 : double(b[size_t(j)]));
    }
  return y;
}

double max_abs_rel(const std::vector<float>& y, const std::vector<double>& ref) {
  double scale = 0, d = 0;
  for (size_t i = 0; i < y.size(); ++i) scale = std::max(scale, std::fabs(ref[i]));
  for (size_t i = 0; i < y.size(); ++i) d = std::max(d, std::fabs(double(y[i]) - ref[i]));
  return d / std::max(scale, 1e-30);
}

TEST(CpuQuantLinear, MatchesTheReferenceForRowsGemvAndBothCodes) {
  struct Shape { int64_t m, k, n; };
  // The expert's 50 rows, a prefix-like block, one row (the gemv), odd sizes (k not a multiple of
  // any vector width, n not of the blocks).
  for (Shape s : {Shape{50, 96, 72}, Shape{130, 256, 200}, Shape{1, 517, 70}, Shape{7, 33, 5}})
    for (DType dt : {DType::I8, DType::F8_E4M3})
      for (bool bias : {false, true}) {
        SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n) + " " +
                     dtype_name(dt) + (bias ? " bias" : ""));
        auto w = uniform(size_t(s.n * s.k), 21, -0.7f, 0.9f), x = uniform(size_t(s.m * s.k), 22);
        std::vector<float> b = bias ? uniform(size_t(s.n), 23) : std::vector<float>{};
        const std::vector<uint8_t> blob = blob_of(w, s.n, s.k, dt);
        auto lin = DnnlLinear::create(s.m, s.k, s.n, dt, bias);
        ASSERT_TRUE(lin.is_ok()) << lin.status().message();
        EXPECT_NE(lin->impl().find(dtype_name(dt)), std::string::npos) << lin->impl();
        EXPECT_EQ(lin->packed_bytes(), 0u);  // codes read in place
        std::vector<uint8_t> scratch(lin->scratch_bytes() + 1);
        std::vector<float> y(size_t(s.m * s.n), NAN);
        ASSERT_TRUE(lin->run(x.data(), blob.data(), bias ? b.data() : nullptr, y.data(), scratch.data() + 1).is_ok());
        EXPECT_LT(max_abs_rel(y, quant_reference(x, blob, dt, b, s.m, s.k, s.n)), 2e-6) << lin->impl();
      }
}

TEST(CpuQuantLinear, SameBitsForAnyThreadCount) {
  const int64_t m = 50, k = 320, n = 260;
  auto w = uniform(size_t(n * k), 31), x = uniform(size_t(m * k), 32), b = uniform(size_t(n), 33);
  const std::vector<uint8_t> blob = blob_of(w, n, k, DType::I8);
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    auto lin = DnnlLinear::create(m, k, n, DType::I8, true);
    ASSERT_TRUE(lin.is_ok());
    std::vector<uint8_t> scratch(lin->scratch_bytes());
    std::vector<float> y(size_t(m * n));
    ASSERT_TRUE(lin->run(x.data(), blob.data(), b.data(), y.data(), scratch.data()).is_ok());
    if (first.empty()) first = y;
    else EXPECT_EQ(y, first) << threads << " threads";
  }
  set_num_threads(1);
}

TEST(CpuQuantLinear, RefusesTheKnLayout) {
  auto lin = DnnlLinear::create(4, 16, 8, DType::I8, false, WeightLayout::KN);
  ASSERT_FALSE(lin.is_ok());
  EXPECT_NE(lin.status().message().find("[N, K]"), std::string::npos) << lin.status().message();
}

TEST(CpuQuantLinear, EmbeddingRowsAreCodesTimesTheirScale) {
  const int64_t v = 9, d = 20;
  auto table = uniform(size_t(v * d), 41);
  const std::vector<uint8_t> blob = blob_of(table, v, d, DType::I8);
  const auto* scales = reinterpret_cast<const float*>(blob.data() + quant_scales_offset(v, d));
  const std::vector<int64_t> ids = {3, 0, 8, 3};
  std::vector<float> out(ids.size() * size_t(d));
  ASSERT_TRUE(embedding_quant(blob.data(), DType::I8, v, d, ids.data(), int64_t(ids.size()), 2.0f, out.data()).is_ok());
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t j = 0; j < d; ++j)
      EXPECT_EQ(out[i * size_t(d) + size_t(j)],
                float(int8_t(blob[size_t(ids[i] * d + j)])) * scales[ids[i]] * 2.0f);
  const int64_t bad = 9;
  EXPECT_FALSE(embedding_quant(blob.data(), DType::I8, v, d, &bad, 1, 1.0f, out.data()).is_ok());
}

// VLAC_CPU_FP8_ACT's rounding (the GPU's W8A8 x): each row to e4m3 codes at its own scale and
// back; zero rows stay zero, and a row's largest magnitude survives exactly.
TEST(QuantLinear, RoundRowsE4m3IsTheCodesOfEachRowAtItsScale) {
  const int64_t m = 3, k = 40;
  std::vector<float> x = uniform(m * k, 11, -3.0f, 3.0f);
  for (int64_t i = 0; i < k; ++i) x[size_t(k + i)] = 0.0f;  // row 1: zeros
  std::vector<float> y = x;
  round_rows_e4m3(y.data(), m, k);
  for (int64_t r = 0; r < m; ++r) {
    const float s = quant_row_scale(x.data() + r * k, k, DType::F8_E4M3);
    float amax = 0.0f;
    for (int64_t i = 0; i < k; ++i) amax = std::fmax(amax, std::fabs(x[size_t(r * k + i)]));
    for (int64_t i = 0; i < k; ++i) {
      const float v = x[size_t(r * k + i)], got = y[size_t(r * k + i)];
      if (s == 0.0f) {
        EXPECT_EQ(got, 0.0f);
        continue;
      }
      EXPECT_EQ(got, quant_decode(DType::F8_E4M3, quant_code(v / s, DType::F8_E4M3)) * s) << r << "," << i;
      // 3 fraction bits; below 2^-6 of the scale, subnormal steps of 2^-9 · scale.
      EXPECT_LE(std::fabs(got - v), 0.0625f * std::fabs(v) + 2.5e-6f * amax) << r << "," << i;
      if (std::fabs(v) == amax) {
        EXPECT_FLOAT_EQ(got, v);
      }
    }
  }
}

}  // namespace
}  // namespace vlac::cpu
