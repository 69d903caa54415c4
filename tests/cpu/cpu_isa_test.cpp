// The CPU ISA layer: the VLAC_MAX_CPU_ISA cap's parsing, what cpu_isa() reports, every kernel set
// this CPU can run against the scalar one, and the blocked bf16→fp32 fallback (forced, so it runs
// on every machine) against the bf16-rounded fp32 reference. A path the CPU cannot run is skipped
// with a message naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/dnnl_linear.h"
#include "backends/cpu/kernels.h"
#include "core/dtype.h"
#include "cpu/cpu_test_util.h"

namespace vlac::cpu {
namespace {

using testutil::max_rel;
using testutil::reference;
using testutil::rounded;
using testutil::uniform;

// Restores the automatic choice when a test ends.
struct ForceFallback {
  ForceFallback() { set_force_bf16_fallback(true); }
  ~ForceFallback() { set_force_bf16_fallback(false); }
};

TEST(CpuIsa, ParsesCapsCaseInsensitivelyAndRejectsOthers) {
  EXPECT_EQ(parse_cpu_isa("avx2", true).value(), CpuIsa::Avx2);
  EXPECT_EQ(parse_cpu_isa("AVX2", true).value(), CpuIsa::Avx2);
  EXPECT_EQ(parse_cpu_isa("Avx512", true).value(), CpuIsa::Avx512);
  EXPECT_EQ(parse_cpu_isa("avx512_bf16", true).value(), CpuIsa::Avx512Bf16);
  EXPECT_EQ(parse_cpu_isa("AVX512-BF16", true).value(), CpuIsa::Avx512Bf16);
  EXPECT_EQ(parse_cpu_isa("avx512_core_amx", true).value(), CpuIsa::Amx);
  EXPECT_EQ(parse_cpu_isa("amx", true).value(), CpuIsa::Amx);
  EXPECT_EQ(parse_cpu_isa("scalar", true).value(), CpuIsa::Scalar);
  EXPECT_EQ(parse_cpu_isa("NEON", false).value(), CpuIsa::Neon);
  EXPECT_EQ(parse_cpu_isa("scalar", false).value(), CpuIsa::Scalar);
  for (const char* bad : {"avx3", "", "sse4", "avx2 "}) {
    auto r = parse_cpu_isa(bad, true);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::InvalidArgument);
    EXPECT_NE(r.status().message().find(std::string("VLAC_MAX_CPU_ISA=") + bad + ":"), std::string::npos);
    EXPECT_NE(r.status().message().find("scalar, avx2, avx512, avx512_bf16, amx"), std::string::npos);
  }
  EXPECT_FALSE(parse_cpu_isa("neon", true).is_ok());  // not an x86 cap
  EXPECT_FALSE(parse_cpu_isa("avx2", false).is_ok());  // not an arm cap
}

TEST(CpuIsa, ReportsTheCappedIsaAndWhatOneDnnBuilds) {
  const CpuIsaInfo& i = cpu_isa();
  EXPECT_LE(i.active, i.native);
  EXPECT_EQ(i.name, cpu_isa_name(i.active));
  EXPECT_EQ(i.native_name, cpu_isa_name(i.native));
  const char* cap = std::getenv("VLAC_MAX_CPU_ISA");
  EXPECT_EQ(i.cap, cap ? cap : "");
  if (cap && *cap) {
    auto c = parse_cpu_isa(cap, kIsX86);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    EXPECT_EQ(i.active, std::min(i.native, c.value()));
    EXPECT_TRUE(cpu_isa_status().is_ok());
  }
  // The kernels follow the active ISA (x86: the best set at or below it).
  const std::string k = kernel_isa();
  if (kIsX86) {
    const CpuIsa want = i.active >= CpuIsa::Avx512 ? CpuIsa::Avx512 : i.active >= CpuIsa::Avx2 ? CpuIsa::Avx2 : CpuIsa::Scalar;
    EXPECT_EQ(k, cpu_isa_name(want));
  }
  // Below AVX-512, oneDNN 2.6 has no bf16 matmul: the blocked fallback is the path.
  if (kIsX86 && i.active <= CpuIsa::Avx2) {
    EXPECT_FALSE(i.bf16_matmul);
  }
  if (i.active >= CpuIsa::Avx512Bf16) {
    EXPECT_TRUE(i.bf16_matmul);
  }
  EXPECT_EQ(use_bf16_fallback(), !i.bf16_matmul);
  const std::string line = cpu_path_summary();
  EXPECT_EQ(line.rfind(i.name, 0), 0u) << line;
  EXPECT_NE(line.find(bf16_path_name()), std::string::npos) << line;
}

TEST(CpuIsa, AmxRunsWhereTheCpuHasIt) {
  if (cpu_isa().active < CpuIsa::Amx)
    GTEST_SKIP() << "AMX: not on this CPU or capped (active " << cpu_isa().name << ", native " << cpu_isa().native_name
                 << ")";
  auto lin = DnnlLinear::create(64, 128, 64, DType::BF16, false);
  ASSERT_TRUE(lin.is_ok()) << lin.status().message();
  EXPECT_NE(lin->impl().find("amx"), std::string::npos) << lin->impl();
}

TEST(CpuIsa, OneDnnBf16MatmulRunsWhereTheCpuHasIt) {
  if (!cpu_isa().bf16_matmul)
    GTEST_SKIP() << "oneDNN bf16 matmul: none on " << cpu_isa().name << " (oneDNN isa " << cpu_isa().onednn_isa << ")";
  auto lin = DnnlLinear::create(64, 128, 64, DType::BF16, false);
  ASSERT_TRUE(lin.is_ok()) << lin.status().message();
  EXPECT_FALSE(lin->bf16_fallback()) << lin->impl();
}

// Each kernel set this CPU can run, against the scalar set: the same math, vectorized.
class CpuKernelSets : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void TearDown() override { ASSERT_TRUE(set_kernel_isa(cpu_isa().active).is_ok()); }
};

TEST_P(CpuKernelSets, MatchTheScalarSet) {
  const CpuIsa isa = GetParam();
  if ((isa == CpuIsa::Neon) == kIsX86) GTEST_SKIP() << cpu_isa_name(isa) << ": not an ISA of this architecture";
  if (isa > cpu_isa().native) GTEST_SKIP() << cpu_isa_name(isa) << ": not on this CPU (native " << cpu_isa().native_name << ")";
  const int64_t n = 1000, k = 261, rows = 37;  // not multiples of any vector width
  auto x = uniform(size_t(n), 21, -12.0f, 12.0f), up = uniform(size_t(n), 22);
  auto w = uniform(size_t(rows * k), 23), xv = uniform(size_t(k), 24);
  std::vector<uint16_t> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
  std::vector<uint8_t> allow(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) allow[size_t(i)] = i % 7 != 3;
  struct Out { std::vector<float> gelu, geglu, silu, sm, smr, rf, gv, gvb; std::vector<uint16_t> r, smb; };
  auto run = [&](CpuIsa set) {
    EXPECT_TRUE(set_kernel_isa(set).is_ok());
    EXPECT_STREQ(kernel_isa(), cpu_isa_name(set == CpuIsa::Avx512Bf16 || set == CpuIsa::Amx ? CpuIsa::Avx512 : set));
    Out o;
    o.gelu.resize(size_t(n)), o.geglu.resize(size_t(n)), o.silu.resize(size_t(n)), o.rf.resize(size_t(n));
    o.r.resize(size_t(n)), o.smb.resize(size_t(n)), o.gv.resize(size_t(rows)), o.gvb.resize(size_t(rows));
    gelu_tanh(x.data(), o.gelu.data(), n);
    geglu(x.data(), up.data(), o.geglu.data(), n);
    silu(x.data(), o.silu.data(), n);
    o.sm = x;
    masked_softmax_row(o.sm.data(), n, 0.5f, allow.data(), nullptr);
    std::vector<float> tmp = x;
    masked_softmax_row_bf16(tmp.data(), o.smb.data(), n, 0.5f, allow.data(), nullptr);
    o.smr = x;
    masked_softmax_row_bf16_f32(o.smr.data(), n, 0.5f, allow.data(), nullptr);
    round_to_bf16(x.data(), o.r.data(), n);
    round_to_bf16_f32(x.data(), o.rf.data(), n);
    gemv(xv.data(), w.data(), false, nullptr, o.gv.data(), k, rows);
    gemv(xv.data(), wb.data(), true, nullptr, o.gvb.data(), k, rows);
    return o;
  };
  const Out ref = run(CpuIsa::Scalar), got = run(isa);
  auto close = [](const std::vector<float>& a, const std::vector<float>& b, float tol, const char* what) {
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_LE(std::abs(a[i] - b[i]), tol * std::max(1.0f, std::abs(b[i]))) << what << " at " << i;
  };
  close(got.gelu, ref.gelu, 2e-6f, "gelu");
  close(got.geglu, ref.geglu, 2e-6f, "geglu");
  close(got.silu, ref.silu, 2e-6f, "silu");
  close(got.sm, ref.sm, 1e-6f, "softmax");
  close(got.gv, ref.gv, 1e-5f, "gemv f32");
  close(got.gvb, ref.gvb, 1e-5f, "gemv bf16");
  EXPECT_EQ(got.r, ref.r);  // rounding is exact on every ISA
  EXPECT_EQ(got.rf, ref.rf);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(got.rf[size_t(i)], bf16_to_f32(got.r[size_t(i)]));
    // The probabilities rounded to bf16: within one bf16 ulp of the rounded scalar ones.
    EXPECT_LE(std::abs(bf16_to_f32(got.smb[size_t(i)]) - ref.smr[size_t(i)]), ref.smr[size_t(i)] * 0.0079f + 1e-30f);
    EXPECT_LE(std::abs(got.smr[size_t(i)] - ref.smr[size_t(i)]), ref.smr[size_t(i)] * 0.0079f + 1e-30f);
    if (!allow[size_t(i)]) {
      EXPECT_EQ(got.smr[size_t(i)], 0.0f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, CpuKernelSets,
                         ::testing::Values(CpuIsa::Scalar, CpuIsa::Neon, CpuIsa::Avx2, CpuIsa::Avx512),
                         [](const auto& param_info) { return std::string(cpu_isa_name(param_info.param)); });

TEST(CpuIsa, SetKernelIsaRefusesWhatTheCpuLacks) {
  const CpuIsa above = kIsX86 ? CpuIsa::Amx : CpuIsa::Avx2;
  if (cpu_isa().native >= above) GTEST_SKIP() << "this CPU has every ISA vlac dispatches on";
  auto st = set_kernel_isa(above);
  EXPECT_EQ(st.code(), StatusCode::Unsupported);
  EXPECT_NE(st.message().find(cpu_isa_name(above)), std::string::npos) << st.message();
}

// The blocked bf16→fp32 path, forced: NK and KN weights, with and without bias, several M (1 is
// the GEMV), N not a multiple of the block.
TEST(CpuBf16Fallback, BlockedLinearMatchesTheRoundedFp32Reference) {
  ForceFallback force;
  for (int64_t m : {1, 7, 50, 300})
    for (auto layout : {WeightLayout::NK, WeightLayout::KN})
      for (bool bias : {false, true}) {
        if (layout == WeightLayout::KN && (bias || m == 1)) continue;  // as the executor uses them
        const int64_t k = 200, n = 333;
        auto w = uniform(size_t(n * k), 31), b = bias ? uniform(size_t(n), 32) : std::vector<float>{};
        std::vector<uint16_t> wb(w.size());
        for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
        std::vector<uint16_t> wt(w.size());  // [K,N]
        for (int64_t j = 0; j < n; ++j)
          for (int64_t l = 0; l < k; ++l) wt[size_t(l * n + j)] = wb[size_t(j * k + l)];
        auto lin = DnnlLinear::create(m, k, n, DType::BF16, bias, layout);
        ASSERT_TRUE(lin.is_ok()) << lin.status().message();
        if (m > 1) {
          EXPECT_TRUE(lin->bf16_fallback()) << lin->impl();
          EXPECT_NE(lin->impl().find("blocked"), std::string::npos) << lin->impl();
        }
        std::vector<uint8_t> scratch(lin->scratch_bytes() + 1);
        auto x = uniform(size_t(m * k), 33);
        std::vector<float> y(size_t(m * n));
        ASSERT_TRUE(lin->run(x.data(), layout == WeightLayout::NK ? wb.data() : wt.data(), bias ? b.data() : nullptr,
                             y.data(), scratch.data() + 1)
                        .is_ok());
        std::vector<float> wr(w.size());
        for (size_t i = 0; i < w.size(); ++i) wr[i] = bf16_to_f32(wb[i]);
        EXPECT_LT(max_rel(y, reference(rounded(x), wr, b, m, k, n)), 1e-5) << "m=" << m << " " << lin->impl();
        if (m > 1 && layout == WeightLayout::NK) {  // the pre-rounded source gives the same result
          std::vector<uint16_t> xb(x.size());
          for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
          std::vector<float> y2(y.size());
          ASSERT_TRUE(lin->run_bf16_src(xb.data(), wb.data(), bias ? b.data() : nullptr, y2.data(), scratch.data()).is_ok());
          EXPECT_EQ(y2, y);
        }
      }
}

TEST(CpuBf16Fallback, PackedWeightsAreWidenedOnceAndMatch) {
  ForceFallback force;
  const int64_t m = 50, k = 96, n = 72;
  auto w = uniform(size_t(n * k), 41), x = uniform(size_t(m * k), 42);
  std::vector<uint16_t> wb(w.size());
  std::vector<float> wr(w.size());
  for (size_t i = 0; i < w.size(); ++i) wr[i] = bf16_to_f32(wb[i] = f32_to_bf16(w[i]));
  auto lin = DnnlLinear::create(m, k, n, DType::BF16, false, WeightLayout::NK, wb.data());
  ASSERT_TRUE(lin.is_ok()) << lin.status().message();
  EXPECT_TRUE(lin->bf16_fallback());
  EXPECT_GE(lin->packed_bytes(), uint64_t(n * k * 4));  // widened to fp32
  std::vector<uint8_t> scratch(lin->scratch_bytes());
  std::vector<float> y(size_t(m * n));
  ASSERT_TRUE(lin->run(x.data(), nullptr, nullptr, y.data(), scratch.data()).is_ok());
  EXPECT_LT(max_rel(y, reference(rounded(x), wr, {}, m, k, n)), 1e-5) << lin->impl();
}

// Forced fallback against oneDNN's bf16 matmul where this CPU has one: the same rounding points,
// so the two agree to fp32 accumulation-order differences.
TEST(CpuBf16Fallback, AgreesWithOneDnnBf16Matmul) {
  if (!cpu_isa().bf16_matmul)
    GTEST_SKIP() << "oneDNN bf16 matmul: none on " << cpu_isa().name << " to compare with";
  const int64_t m = 64, k = 512, n = 200;
  auto w = uniform(size_t(n * k), 51), x = uniform(size_t(m * k), 52);
  std::vector<uint16_t> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
  auto native = DnnlLinear::create(m, k, n, DType::BF16, false);
  ASSERT_TRUE(native.is_ok());
  std::vector<float> y0(size_t(m * n)), y1(y0.size());
  {
    std::vector<uint8_t> scratch(native->scratch_bytes());
    ASSERT_TRUE(native->run(x.data(), wb.data(), nullptr, y0.data(), scratch.data()).is_ok());
  }
  ForceFallback force;
  auto blocked = DnnlLinear::create(m, k, n, DType::BF16, false);
  ASSERT_TRUE(blocked.is_ok());
  std::vector<uint8_t> scratch(blocked->scratch_bytes());
  ASSERT_TRUE(blocked->run(x.data(), wb.data(), nullptr, y1.data(), scratch.data()).is_ok());
  std::vector<double> ref(y0.begin(), y0.end());
  EXPECT_LT(max_rel(y1, ref), 1e-5);
}

TEST(CpuBf16Fallback, AttentionMatchesTheRoundedReference) {
  ForceFallback force;
  const int64_t t = 6, h = 4, s = 37, dh = 16, dv = 8;
  auto q = uniform(size_t(t * h * dh), 61), k = uniform(size_t(s * dh), 62), v = uniform(size_t(s * dv), 63);
  std::vector<uint8_t> allow(size_t(t * s));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < s; ++j) allow[size_t(i * s + j)] = (j + i) % 4 != 0;
  const float scale = 0.25f;
  auto att = DnnlAttention::create(t, h, s, dh, dv);
  ASSERT_TRUE(att.is_ok()) << att.status().message();
  EXPECT_TRUE(att->bf16_fallback());
  std::vector<uint8_t> scratch(att->scratch_bytes());
  std::vector<float> out(size_t(t * h * dv));
  ASSERT_TRUE(att->run(q.data(), k.data(), v.data(), allow.data(), nullptr, out.data(), scale, scratch.data()).is_ok());
  const auto qr = rounded(q), kr = rounded(k), vr = rounded(v);
  for (int64_t ti = 0; ti < t; ++ti)
    for (int64_t hi = 0; hi < h; ++hi) {
      std::vector<double> p = testutil::attention_probs(qr, kr, allow, ti, hi, h, s, dh, scale);
      for (double& e : p) e = double(bf16_to_f32(f32_to_bf16(float(e))));  // the bf16 probabilities
      for (int64_t c = 0; c < dv; ++c) {
        double o = 0;
        for (int64_t j = 0; j < s; ++j) o += p[size_t(j)] * vr[size_t(j * dv + c)];
        EXPECT_NEAR(out[size_t((ti * h + hi) * dv + c)], o, 2e-3) << ti << "," << hi << "," << c;
      }
    }
}

}  // namespace
}  // namespace vlac::cpu
