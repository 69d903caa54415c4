// DnnlLinear (oneDNN matmul on weights in place) against a double reference: fp32 weights, and
// bf16 weights whose reference uses the bf16-rounded activations and weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/dnnl_linear.h"
#include "cpu/cpu_test_util.h"

namespace vlac::cpu {
namespace {

using testutil::max_rel;
using testutil::reference;
using testutil::uniform;

TEST(CpuDnnlLinear, F32AndBf16MatchReferencesWithWeightsInPlace) {
  const int64_t m = 50, k = 96, n = 72;
  auto w = uniform(size_t(n * k), 1), b = uniform(size_t(n), 2);
  std::vector<uint16_t> wb(w.size());
  std::vector<float> wr(w.size());
  for (size_t i = 0; i < w.size(); ++i) wr[i] = bf16_to_f32(wb[i] = f32_to_bf16(w[i]));
  auto lin = DnnlLinear::create(m, k, n, DType::F32, true);
  ASSERT_TRUE(lin.is_ok()) << lin.status().message();
  auto lin_bf = DnnlLinear::create(m, k, n, DType::BF16, false);
  ASSERT_TRUE(lin_bf.is_ok()) << lin_bf.status().message();
  // bf16 stages the rounded activations in the scratch: at least M*K*2 bytes.
  EXPECT_GE(lin_bf->scratch_bytes(), uint64_t(m * k * 2));
  std::vector<uint8_t> scratch(std::max(lin->scratch_bytes(), lin_bf->scratch_bytes()) + 1);
  for (uint32_t seed : {3u, 4u}) {  // two runs with different inputs: handles are rebound
    auto x = uniform(size_t(m * k), seed);
    std::vector<float> y(size_t(m * n));
    // An odd scratch address: run() aligns inside its scratch_bytes().
    ASSERT_TRUE(lin->run(x.data(), w.data(), b.data(), y.data(), scratch.data() + 1).is_ok());
    EXPECT_LT(max_rel(y, reference(x, w, b, m, k, n)), 1e-5) << lin->impl();
    std::vector<float> xr(x.size());
    for (size_t i = 0; i < x.size(); ++i) xr[i] = bf16_to_f32(f32_to_bf16(x[i]));
    ASSERT_TRUE(lin_bf->run(x.data(), wb.data(), nullptr, y.data(), scratch.data()).is_ok());
    EXPECT_LT(max_rel(y, reference(xr, wr, {}, m, k, n)), 1e-5) << lin_bf->impl();
  }
}

TEST(CpuDnnlLinear, SingleRowGemvMatchesReferences) {
  const int64_t k = 517, n = 70;  // k not a multiple of the 16 lanes
  auto w = uniform(size_t(n * k), 11), b = uniform(size_t(n), 12), x = uniform(size_t(k), 13);
  std::vector<uint16_t> wb(w.size());
  std::vector<float> wr(w.size()), xr(x.size());
  for (size_t i = 0; i < w.size(); ++i) wr[i] = bf16_to_f32(wb[i] = f32_to_bf16(w[i]));
  for (size_t i = 0; i < x.size(); ++i) xr[i] = bf16_to_f32(f32_to_bf16(x[i]));
  auto lin = DnnlLinear::create(1, k, n, DType::F32, true);
  auto lin_bf = DnnlLinear::create(1, k, n, DType::BF16, false);
  ASSERT_TRUE(lin.is_ok() && lin_bf.is_ok());
  EXPECT_EQ(lin->impl(), "vlac:gemv");
  std::vector<uint8_t> scratch(std::max(lin->scratch_bytes(), lin_bf->scratch_bytes()));
  std::vector<float> y(static_cast<size_t>(n));
  ASSERT_TRUE(lin->run(x.data(), w.data(), b.data(), y.data(), scratch.data()).is_ok());
  EXPECT_LT(max_rel(y, reference(x, w, b, 1, k, n)), 1e-5);
  ASSERT_TRUE(lin_bf->run(x.data(), wb.data(), nullptr, y.data(), scratch.data()).is_ok());
  EXPECT_LT(max_rel(y, reference(xr, wr, {}, 1, k, n)), 1e-5);
}

TEST(CpuDnnlLinear, KnLayoutIsTheTransposedWeight) {
  const int64_t m = 9, k = 40, n = 24;
  auto w = uniform(size_t(n * k), 5), x = uniform(size_t(m * k), 6);
  std::vector<float> wt(w.size());  // [K,N]
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) wt[size_t(j * n + i)] = w[size_t(i * k + j)];
  auto lin = DnnlLinear::create(m, k, n, DType::F32, false, WeightLayout::KN);
  ASSERT_TRUE(lin.is_ok()) << lin.status().message();
  std::vector<uint8_t> scratch(lin->scratch_bytes());
  std::vector<float> y(size_t(m * n));
  ASSERT_TRUE(lin->run(x.data(), wt.data(), nullptr, y.data(), scratch.data()).is_ok());
  EXPECT_LT(max_rel(y, reference(x, w, {}, m, k, n)), 1e-5);
}

TEST(CpuDnnlAttention, MatchesBf16RoundedReferenceAndMasksExactly) {
  const int64_t t = 5, h = 4, s = 9, dh = 16, dv = 8;
  auto q = uniform(size_t(t * h * dh), 7), k = uniform(size_t(s * dh), 8), v = uniform(size_t(s * dv), 9);
  std::vector<uint8_t> allow(size_t(t * s));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < s; ++j) allow[size_t(i * s + j)] = (j + i) % 3 != 0;
  for (int64_t j = 0; j < dv; ++j) v[size_t(0 * dv + j)] = 1e30f;  // key 0: masked for t = 0 and 3
  const auto qr = testutil::rounded(q), kr = testutil::rounded(k), vr = testutil::rounded(v);
  const float scale = 0.25f;
  auto att = DnnlAttention::create(t, h, s, dh, dv);
  ASSERT_TRUE(att.is_ok()) << att.status().message();
  std::vector<uint8_t> scratch(att->scratch_bytes());
  std::vector<float> out(size_t(t * h * dv));
  ASSERT_TRUE(att->run(q.data(), k.data(), v.data(), allow.data(), nullptr, out.data(), scale, scratch.data()).is_ok());
  for (int64_t ti : {int64_t{0}, int64_t{3}}) {  // rows whose masked key 0 holds 1e30: exact zero weight
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t j = 0; j < dv; ++j) EXPECT_LT(std::abs(out[size_t((ti * h + hi) * dv + j)]), 10.0f);
  }
  // Reference in double over the rows without the huge key (probabilities rounded like the kernel's
  // bf16 P would be are not modelled: tolerance of bf16's 2^-8).
  for (int64_t ti : {int64_t{0}, int64_t{3}})
    for (int64_t hi = 0; hi < h; ++hi) {
      const std::vector<double> p = testutil::attention_probs(qr, kr, allow, ti, hi, h, s, dh, scale);
      for (int64_t c = 0; c < dv; ++c) {
        double o = 0;
        for (int64_t j = 0; j < s; ++j) o += p[size_t(j)] * vr[size_t(j * dv + c)];
        EXPECT_NEAR(out[size_t((ti * h + hi) * dv + c)], o, 1e-2) << ti << "," << hi << "," << c;
      }
    }
}

TEST(CpuDnnlLinear, RejectsUnsupportedDtypeAndEmptyShapes) {
  auto lin = DnnlLinear::create(1, 2, 2, DType::F16, false);
  ASSERT_FALSE(lin.is_ok());
  EXPECT_EQ(lin.status().code(), StatusCode::Unsupported);
  EXPECT_FALSE(DnnlLinear::create(0, 2, 2, DType::F32, false).is_ok());
}

}  // namespace
}  // namespace vlac::cpu
