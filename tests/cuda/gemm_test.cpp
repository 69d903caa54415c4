// cuBLASLt GEMMs against the CPU's fp32 sgemm on the same (bf16-representable) values, at every
// GEMM shape of pi0.5 that differs in kind, and at odd sizes. Tolerances (max |Δ| / max |ref|):
//   bf16 in, fp32 out: 1e-4 — exact products, fp32 accumulation in another order (K up to 16384);
//   bf16 in, bf16 out: 8e-3 — plus one rounding of the output to bf16;
//   fp32 in (TF32 off): 2e-5 — fp32 FMA throughout; TF32 would show as ~1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "backends/cpu/kernels.h"
#include "backends/cuda/capture_edge.h"
#include "backends/cuda/cublaslt_api.h"
#include "backends/cuda/env.h"
#include "backends/cuda/gemm.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/expert_mlp.h"
#include "backends/cuda/skinny_gemm.h"
#include "backends/cuda/small_gemm.h"
#include "core/quant.h"
#include "cuda_test_util.h"

namespace vlac::cuda::testing {
namespace {

class CudaGemm : public CudaTest {};

// cuBLASLt is loaded, not linked (cublaslt_api.h): the library is found next to the toolkit's
// libcudart and every function the backend calls resolves; its version matches the header's
// major. Needs no GPU, so it runs in CI wherever the CUDA backend is built.
TEST(CublasLtLoad, ResolvesEveryFunction) {
  const Status s = cublaslt_load();
  ASSERT_TRUE(s.is_ok()) << s.message();
  const CublasLt& f = lt();
#define VLAC_EXPECT_RESOLVED(name) EXPECT_NE(f.name, nullptr) << "cublasLt" #name;
  VLAC_CUBLASLT_FUNCTIONS(VLAC_EXPECT_RESOLVED)
#undef VLAC_EXPECT_RESOLVED
  EXPECT_EQ(f.GetVersion() / 10000, size_t(CUBLAS_VER_MAJOR));
  EXPECT_STREQ(f.GetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
}

struct Case { int64_t m, k, n; const char* what; };
const Case kCases[] = {
    {968, 2048, 2560, "prefix fused qkv"},   {968, 16384, 2048, "prefix down"},
    {50, 1024, 8192, "expert fused gate+up"}, {50, 4096, 1024, "expert down"},
    {256, 1152, 4304, "siglip fc1"},          {256, 588, 1152, "patch embedding"},
    {1, 1024, 3072, "adaRMS modulation"},     {37, 104, 77, "odd"},
    {5, 24, 8, "tiny"},
};

void ref_gemm(const std::vector<float>& x, const std::vector<float>& w, const float* bias, bool gelu,
              const std::vector<float>* acc, std::vector<float>& y, int64_t m, int64_t k, int64_t n) {
  cpu::linear_f32(x.data(), w.data(), bias, y.data(), m, k, n);
  if (gelu) cpu::gelu_tanh(y.data(), y.data(), m * n);
  if (acc)
    for (size_t i = 0; i < y.size(); ++i) y[i] += (*acc)[i];
}

TEST_F(CudaGemm, MatchesCpuAtPi05Shapes) {
  auto runner = GemmRunner::create();
  ASSERT_TRUE(runner.is_ok()) << runner.status().message();
  DevBuf ws(runner->workspace_bytes());
  uint32_t seed = 1;
  for (const auto& c : kCases) {
    const size_t xn = size_t(c.m * c.k), wn = size_t(c.n * c.k), yn = size_t(c.m * c.n);
    const float wsd = 1.0f / std::sqrt(float(c.k));
    for (DType in : {DType::BF16, DType::F32})
      for (DType out : {DType::F32, DType::BF16}) {
        if (in == DType::F32 && out == DType::BF16) continue;
        for (Epilogue epi : {Epilogue::None, Epilogue::Bias, Epilogue::BiasGelu, Epilogue::Gelu})
          for (bool accumulate : {false, true}) {
            if (accumulate && (epi == Epilogue::Gelu || epi == Epilogue::BiasGelu)) continue;
            if (c.k >= 4096 && epi != Epilogue::Bias) continue;  // big K: one epilogue keeps the CPU reference cheap
            auto x = randn(xn, ++seed), w = randn(wn, ++seed, wsd), b = randn(size_t(c.n), ++seed);
            auto y0 = randn(yn, ++seed);
            const bool bf = in == DType::BF16;
            if (bf) x = bf16_values(x), w = bf16_values(w);
            if (out == DType::BF16) b = bf16_values(b), y0 = bf16_values(y0);
            auto dx = bf ? to_device(to_bf16(x)) : to_device(x);
            auto dw = bf ? to_device(to_bf16(w)) : to_device(w);
            auto db = out == DType::BF16 ? to_device(to_bf16(b)) : to_device(b);
            auto dy = out == DType::BF16 ? to_device(to_bf16(y0)) : to_device(y0);
            if (!accumulate) dy->poison();
            GemmDesc d{c.m, c.n, c.k, in, out, epi, accumulate};
            const bool has_b = epi == Epilogue::Bias || epi == Epilogue::BiasGelu;
            VLAC_CUDA_OK(runner->run(stream_, d, dx->get(), dw->get(), has_b ? db->get() : nullptr, dy->get(), ws.get()));
            sync();
            std::vector<float> ref(yn);
            ref_gemm(x, w, has_b ? b.data() : nullptr, epi == Epilogue::Gelu || epi == Epilogue::BiasGelu,
                     accumulate ? &y0 : nullptr, ref, c.m, c.k, c.n);
            const auto y = out == DType::F32 ? download<float>(*dy, yn) : from_bf16(download<uint16_t>(*dy, yn));
            const double tol = !bf ? 2e-5 : out == DType::F32 ? 1e-4 : 8e-3;
            EXPECT_LT(rel_err(y, ref), tol) << c.what << " " << c.m << "x" << c.k << "x" << c.n << " "
                                            << dtype_name(in) << "->" << dtype_name(out) << " epilogue " << int(epi)
                                            << " accumulate " << accumulate;
          }
      }
  }
  EXPECT_GT(runner->plans(), size_t(20));
  // What the chosen algorithms need fits the workspace they were planned for; the M <= 64 subset
  // (the expert's shapes) needs no more than all of them.
  EXPECT_LE(runner->chosen_workspace_max(), runner->workspace_bytes());
  EXPECT_LE(runner->chosen_workspace_max(64), runner->chosen_workspace_max());
  EXPECT_LE(runner->chosen_workspace_max(1), runner->chosen_workspace_max(64));  // the one-row shapes alone
}

// GemmDesc::k_parts: the partial products over K chunks, summed in order by residual_norm_to
// (the executor's fused norm), equal the whole product added the same way; bad requests are
// refused with a message.
TEST_F(CudaGemm, KPartsSummedByTheResidualNormMatchTheWholeProduct) {
  auto runner = GemmRunner::create();
  ASSERT_TRUE(runner.is_ok()) << runner.status().message();
  DevBuf ws(runner->workspace_bytes());
  const int64_t m = 50, k = 4096, n = 1024;
  auto x = bf16_values(randn(size_t(m * k), 91)), w = bf16_values(randn(size_t(n * k), 92, 1.0f / 64));
  auto h = randn(size_t(m * n), 93), gate = randn(size_t(n), 94);
  std::vector<float> ref(size_t(m * n));
  ref_gemm(x, w, nullptr, false, nullptr, ref, m, k, n);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = h[i] + ref[i] * gate[i % size_t(n)];  // h + branch ⊙ gate
  auto dx = to_device(to_bf16(x)), dw = to_device(to_bf16(w)), dgate = to_device(gate);
  for (int parts : {1, 2, 4, 8}) {
    DevBuf dy(uint64_t(parts) * uint64_t(m * n) * 4), dh_out(uint64_t(m * n) * 4);
    auto dh = to_device(h);
    GemmDesc d{m, n, k, DType::BF16, DType::F32, Epilogue::None, false};
    d.k_parts = parts;
    VLAC_CUDA_OK(runner->run(stream_, d, dx->get(), dw->get(), nullptr, dy.get(), ws.get()));
    NormArgs none;  // the sum only
    VLAC_CUDA_OK(residual_norm_to(stream_, dh->get(), dh_out.get(), DType::F32, dy.get(), DType::F32,
                                  static_cast<const float*>(dgate->get()), none, nullptr, DType::F32, m, n, parts, m * n));
    sync();
    EXPECT_LT(rel_err(download<float>(dh_out, size_t(m * n)), ref), 1e-4) << parts << " K parts";
  }
  GemmDesc bad{m, n, 100, DType::BF16, DType::F32, Epilogue::None, false};
  bad.k_parts = 3;  // 100 is no multiple of 8·3
  DevBuf dy(uint64_t(m * n) * 12);
  const Status st = runner->run(stream_, bad, dx->get(), dw->get(), nullptr, dy.get(), ws.get());
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("K parts"), std::string::npos) << st.message();
}

// GemmDesc::ldy: y as a column slice of a wider y (the executor's sliced widening of 8-bit
// weights: a slice of W's rows into the matching columns of y), with each epilogue, accumulation
// and K parts, equals the whole GEMM on the CPU.
TEST_F(CudaGemm, ColumnSlicesOfYMatchTheWholeProduct) {
  auto runner = GemmRunner::create();
  ASSERT_TRUE(runner.is_ok()) << runner.status().message();
  DevBuf ws(runner->workspace_bytes());
  const int64_t k = 256, n = 384, slices = 3, per = n / slices;
  uint32_t seed = 300;
  for (int64_t m : {50, 300})
    for (DType out : {DType::F32, DType::BF16})
      for (Epilogue epi : {Epilogue::None, Epilogue::Bias, Epilogue::BiasGelu})
        for (bool accumulate : {false, true}) {
          if (accumulate && epi == Epilogue::BiasGelu) continue;
          auto x = bf16_values(randn(size_t(m * k), ++seed)), w = bf16_values(randn(size_t(n * k), ++seed, 1.0f / 16));
          auto b = randn(size_t(n), ++seed), y0 = randn(size_t(m * n), ++seed);
          if (out == DType::BF16) b = bf16_values(b), y0 = bf16_values(y0);
          auto dx = to_device(to_bf16(x)), dw = to_device(to_bf16(w));
          auto db = out == DType::BF16 ? to_device(to_bf16(b)) : to_device(b);
          auto dy = out == DType::BF16 ? to_device(to_bf16(y0)) : to_device(y0);
          if (!accumulate) dy->poison();
          const bool has_b = epi != Epilogue::None;
          const uint64_t ye = dtype_size(out);
          for (int64_t s0 = 0; s0 < n; s0 += per) {
            GemmDesc d{m, per, k, DType::BF16, out, epi, accumulate};
            d.ldy = n;
            VLAC_CUDA_OK(runner->run(stream_, d, dx->get(), static_cast<const uint16_t*>(dw->get()) + s0 * k,
                                     has_b ? static_cast<const uint8_t*>(db->get()) + uint64_t(s0) * ye : nullptr,
                                     static_cast<uint8_t*>(dy->get()) + uint64_t(s0) * ye, ws.get()));
          }
          sync();
          std::vector<float> ref(size_t(m * n));
          ref_gemm(x, w, has_b ? b.data() : nullptr, epi == Epilogue::BiasGelu, accumulate ? &y0 : nullptr, ref, m, k, n);
          const auto y = out == DType::F32 ? download<float>(*dy, size_t(m * n))
                                           : from_bf16(download<uint16_t>(*dy, size_t(m * n)));
          EXPECT_LT(rel_err(y, ref), out == DType::F32 ? 1e-4 : 8e-3)
              << m << "x" << k << "x" << n << " " << dtype_name(out) << " epilogue " << int(epi) << " accumulate "
              << accumulate;
        }
  // K parts into slices: [parts][m][n] with each slice's columns.
  const int64_t m = 50, parts = 2;
  auto x = bf16_values(randn(size_t(m * k), 401)), w = bf16_values(randn(size_t(n * k), 402, 1.0f / 16));
  auto dx = to_device(to_bf16(x)), dw = to_device(to_bf16(w));
  DevBuf dy(uint64_t(parts * m * n) * 4);
  for (int64_t s0 = 0; s0 < n; s0 += per) {
    GemmDesc d{m, per, k, DType::BF16, DType::F32, Epilogue::None, false};
    d.ldy = n;
    d.k_parts = int(parts);
    VLAC_CUDA_OK(runner->run(stream_, d, dx->get(), static_cast<const uint16_t*>(dw->get()) + s0 * k, nullptr,
                             static_cast<float*>(dy.get()) + s0, ws.get()));
  }
  sync();
  const auto yp = download<float>(dy, size_t(parts * m * n));
  std::vector<float> y(size_t(m * n)), ref(size_t(m * n));
  for (size_t i = 0; i < y.size(); ++i) y[i] = yp[i] + yp[i + size_t(m * n)];
  ref_gemm(x, w, nullptr, false, nullptr, ref, m, k, n);
  EXPECT_LT(rel_err(y, ref), 1e-4) << "K parts in column slices";
  GemmDesc bad{m, n, k, DType::BF16, DType::F32, Epilogue::None, false};
  bad.ldy = n - 1;
  EXPECT_FALSE(runner->plan(bad).is_ok()) << "ldy below n";
}

// The premise of the programmatic-edge probe (capture_edge.h): inside a graph, a kernel on a
// programmatic edge after late_copy reads the copy's destination before it is written unless it
// waits (late_copy does not wait: zeros); a vlac kernel, which waits first (pdl_wait), reads the
// copied values.
TEST_F(CudaGemm, ProgrammaticEdgeRacesUnlessTheKernelWaits) {
  if (!pdl_enabled()) GTEST_SKIP() << "programmatic dependent launch needs sm_90 (and VLAC_CUDA_PDL not 0)";
  const size_t n = 4096;
  std::vector<float> src(n);
  for (size_t i = 0; i < n; ++i) src[i] = float(i + 1);
  DevBuf s(n * 4), mid(n * 4), out(n * 4);
  upload(s, src);
  for (int waits = 0; waits < 2; ++waits) {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    VLAC_CUDART_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    VLAC_CUDART_OK(cudaMemsetAsync(mid.get(), 0, n * 4, stream_));
    VLAC_CUDART_OK(cudaMemsetAsync(out.get(), 0xFF, n * 4, stream_));
    const bool ok = late_copy(stream_, s.get(), mid.get(), n * 4, 200000).is_ok();
    const bool edge = set_capture_edge(stream_, EdgePort::Programmatic);
    const Status second = waits ? cast(stream_, mid.get(), DType::F32, out.get(), DType::F32, int64_t(n))
                                : late_copy(stream_, mid.get(), out.get(), n * 4, 0);
    VLAC_CUDART_OK(cudaStreamEndCapture(stream_, &g));
    ASSERT_TRUE(ok && edge && second.is_ok()) << second.message();
    VLAC_CUDART_OK(cudaGraphInstantiate(&ge, g, 0));
    VLAC_CUDART_OK(cudaGraphLaunch(ge, stream_));
    sync();
    const auto got = download<float>(out, n);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    if (waits) EXPECT_EQ(got, src) << "a kernel that waits read before its predecessor's end";
    else EXPECT_EQ(got, std::vector<float>(n, 0.0f)) << "the kernel that does not wait was not started early";
  }
  EXPECT_FALSE(set_capture_edge(stream_, EdgePort::Programmatic)) << "set while not capturing";
}

// VLAC_GEMM_PDL: the expert's four GEMM shapes (M = 50) with programmatic edges on. Each is run
// plainly first (tuned, then probed), then captured after late_copy as x's producer; the recorded
// GEMM gives the plain run's bits whether its probe passed (programmatic edge) or not.
TEST_F(CudaGemm, ProgrammaticEdgesKeepTheResults) {
  auto runner = GemmRunner::create();
  ASSERT_TRUE(runner.is_ok()) << runner.status().message();
  runner->set_programmatic_edges(true);
  DevBuf ws(runner->workspace_bytes());
  const Case shapes[] = {{50, 1024, 2560, "q|k|v"}, {50, 2048, 1024, "o"}, {50, 1024, 8192, "gate|up"},
                         {50, 4096, 1024, "down"}};
  uint32_t seed = 700;
  for (const Case& c : shapes) {
    for (DType out : {DType::BF16, DType::F32}) {
      const GemmDesc d{c.m, c.n, c.k, DType::BF16, out};
      const size_t xn = size_t(c.m * c.k), yn = size_t(c.m * c.n), yb = yn * dtype_size(out);
      auto xs = to_device(to_bf16(randn(xn, seed++))), w = to_device(to_bf16(randn(size_t(c.n * c.k), seed++, 0.03f)));
      DevBuf xt(xn * 2), y0(yb), y1(yb);
      ASSERT_TRUE(runner->run(stream_, d, xs->get(), w->get(), nullptr, y0.get(), ws.get()).is_ok());
      sync();
      const uint64_t safe = runner->pdl_safe_shapes();
      cudaGraph_t g = nullptr;
      cudaGraphExec_t ge = nullptr;
      VLAC_CUDART_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      VLAC_CUDART_OK(cudaMemsetAsync(xt.get(), 0, xn * 2, stream_));
      VLAC_CUDART_OK(cudaMemsetAsync(y1.get(), 0, yb, stream_));
      const bool ok = late_copy(stream_, xs->get(), xt.get(), xn * 2, 40000).is_ok();
      const Status r = runner->run(stream_, d, xt.get(), w->get(), nullptr, y1.get(), ws.get());
      VLAC_CUDART_OK(cudaStreamEndCapture(stream_, &g));
      ASSERT_TRUE(ok && r.is_ok()) << r.message();
      VLAC_CUDART_OK(cudaGraphInstantiate(&ge, g, 0));
      for (int rep = 0; rep < 3; ++rep) {
        VLAC_CUDART_OK(cudaGraphLaunch(ge, stream_));
        sync();
        EXPECT_EQ(download<uint8_t>(y1, yb), download<uint8_t>(y0, yb)) << c.what << " " << dtype_name(out);
      }
      cudaGraphExecDestroy(ge);
      cudaGraphDestroy(g);
      std::printf("[ cuda     ] %s -> %s: cuBLASLt's kernel %s\n", c.what, dtype_name(out),
                  runner->pdl_safe_shapes() > safe ? "waits (programmatic edge)" : "not admitted (plain edge)");
    }
  }
  EXPECT_EQ(runner->pdl_probed_shapes(), 8u);
}

TEST_F(CudaGemm, PlanIsCachedAndArgumentsAreChecked) {
  auto runner = GemmRunner::create(1 << 20);
  ASSERT_TRUE(runner.is_ok()) << runner.status().message();
  GemmDesc d{50, 1024, 1024, DType::BF16, DType::BF16, Epilogue::Bias, false};
  VLAC_CUDA_OK(runner->plan(d));
  VLAC_CUDA_OK(runner->plan(d));
  EXPECT_EQ(runner->plans(), size_t(1));
  DevBuf x(50 * 1024 * 2), w(1024 * 1024 * 2), y(50 * 1024 * 2), ws(1 << 20);
  const Status no_bias = runner->run(stream_, d, x.get(), w.get(), nullptr, y.get(), ws.get());
  EXPECT_EQ(no_bias.code(), StatusCode::InvalidArgument) << no_bias.message();
  const Status odd = runner->run(stream_, d, static_cast<uint8_t*>(x.get()) + 2, w.get(), y.get(), y.get(), ws.get());
  EXPECT_EQ(odd.code(), StatusCode::InvalidArgument) << odd.message();
  GemmDesc bad = d;
  bad.in = DType::F32;  // F32 inputs with a BF16 output
  EXPECT_EQ(runner->plan(bad).code(), StatusCode::Unsupported);
}

// The timing's choices go to the on-disk cache (VLAC_GEMM_CACHE=FILE): a second runner reads
// them instead of timing and computes the same values; a file that does not parse is ignored.
TEST_F(CudaGemm, TuningChoicesAreCachedOnDisk) {
  const std::string file = ::testing::TempDir() + "/vlac_gemm_tune_test.txt";
  std::remove(file.c_str());
  ::setenv("VLAC_GEMM_CACHE", file.c_str(), 1);
  const GemmDesc d{50, 1024, 2048, DType::BF16, DType::F32, Epilogue::None, false};
  // x [50, 2048] and y [50, 1024] (session 37: x was half its size, and y twice, read past what
  // the GEMM wrote)
  auto x = to_device(to_bf16(bf16_values(randn(50 * 2048, 7)))), w = to_device(to_bf16(bf16_values(randn(2048 * 1024, 8, 0.03f))));
  auto run_once = [&](uint64_t* tuned, uint64_t* cached) {
    auto r = GemmRunner::create();
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    DevBuf ws(r->workspace_bytes()), y(50 * 1024 * 4);
    EXPECT_TRUE(r->run(stream_, d, x->get(), w->get(), nullptr, y.get(), ws.get()).is_ok());
    sync();
    *tuned = r->tuned_shapes(), *cached = r->cached_shapes();
    return download<float>(y, 50 * 1024);
  };
  uint64_t t1 = 0, c1 = 0, t2 = 0, c2 = 0, t3 = 0, c3 = 0;
  const auto y1 = run_once(&t1, &c1);
  const auto y2 = run_once(&t2, &c2);
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("not a tuning cache\n50,2048 zz\n", f);
    std::fclose(f);
  }
  const auto y3 = run_once(&t3, &c3);
  ::unsetenv("VLAC_GEMM_CACHE");
  std::remove(file.c_str());
  if (t1 == 0) GTEST_SKIP() << "VLAC_GEMM_TUNE=0 or one candidate: nothing is timed";
  EXPECT_EQ(c1, 0u);
  EXPECT_EQ(t2, 0u);
  EXPECT_EQ(c2, 1u);
  // The same algorithm; its split-K reduction may sum in another order from run to run.
  double diff = 0, mag = 0;
  for (size_t i = 0; i < y1.size(); ++i)
    diff = std::max(diff, double(std::fabs(y1[i] - y2[i]))), mag = std::max(mag, double(std::fabs(y1[i])));
  EXPECT_LE(diff, 1e-5 * mag);
  EXPECT_EQ(t3, 1u) << "a file that does not parse is ignored";
  EXPECT_EQ(c3, 0u);
}

// One fp32 GEMM case for the own fp32 kernels' tests: random operands on the device (W scaled by
// 1/sqrt(k)) and the CPU's y = x·Wᵀ (+ bias); through_runner runs it as the executor does.
struct F32Case {
  int64_t m, k, n;
  std::unique_ptr<DevBuf> x, w, b;
  bool with_bias;
  std::vector<float> ref;
  F32Case(int64_t m_, int64_t k_, int64_t n_, bool bias, uint32_t* seed)
      : m(m_), k(k_), n(n_), with_bias(bias), ref(size_t(m * n)) {
    auto hx = randn(size_t(m * k), ++*seed), hw = randn(size_t(n * k), ++*seed, 1.0f / std::sqrt(float(k)));
    auto hb = randn(size_t(n), ++*seed);
    x = to_device(hx), w = to_device(hw), b = to_device(hb);
    ref_gemm(hx, hw, bias ? hb.data() : nullptr, false, nullptr, ref, m, k, n);
  }
  const float* bias() const { return with_bias ? b->as<float>() : nullptr; }
  /// The case's fp32 GemmDesc, with TF32 permitted or own_f32 marked as asked, planned and run.
  Status through_runner(GemmRunner& r, cudaStream_t s, bool tf32, bool own_f32, DevBuf& y, DevBuf& ws) const {
    GemmDesc d{m, n, k, DType::F32, DType::F32, with_bias ? Epilogue::Bias : Epilogue::None, false};
    d.tf32 = tf32, d.own_f32 = own_f32;
    VLAC_RETURN_IF_ERROR(r.plan(d));
    return r.run(s, d, x->get(), w->get(), with_bias ? b->get() : nullptr, y.get(), ws.get());
  }
};

// The tiled fp32 kernel (small_gemm.h), which the runner runs for own_f32 shapes (the fast vision
// mode's patch embedding), at SigLIP's patch embedding and at edges that leave partial tiles and a
// K tail, against the CPU at the fp32 tolerance: directly and through the runner, which makes no
// cuBLASLt plan for it.
TEST_F(CudaGemm, TileF32KernelMatchesCpu) {
  auto runner = GemmRunner::create();
  ASSERT_TRUE(runner.is_ok()) << runner.status().message();
  DevBuf ws(runner->workspace_bytes());
  struct S { int64_t m, k, n; const char* what; };
  uint32_t seed = 1900;
  for (S c : {S{768, 588, 1152, "patch embedding, 3 cameras"}, S{5, 7, 3, "smaller than a tile"},
              S{130, 100, 70, "partial tiles, a K tail"}, S{64, 16, 64, "one tile, one K step"}}) {
    for (bool with_bias : {false, true}) {
      const F32Case f(c.m, c.k, c.n, with_bias, &seed);
      for (bool through_runner : {false, true}) {
        DevBuf y(f.ref.size() * 4);
        y.poison();
        if (through_runner) {
          VLAC_CUDA_OK(f.through_runner(*runner, stream_, false, true, y, ws));
        } else {
          VLAC_CUDA_OK(tile_f32_gemm(stream_, c.m, c.n, c.k, f.x->as<float>(), f.w->as<float>(), f.bias(), y.as<float>()));
        }
        sync();
        EXPECT_LT(rel_err(download<float>(y, f.ref.size()), f.ref), 2e-5)
            << c.what << (with_bias ? " with bias" : "") << (through_runner ? " (runner)" : " (direct)");
      }
    }
  }
  if (env_str("VLAC_TILE_F32_GEMM") != "0") {
    EXPECT_EQ(runner->plans(), size_t(0)) << "own_f32 shapes are never planned by cuBLASLt";
  }
  DevBuf x(64 * 4), y(64 * 4);
  EXPECT_EQ(tile_f32_gemm(stream_, 0, 1, 4, x.as<float>(), x.as<float>(), nullptr, y.as<float>()).code(),
            StatusCode::InvalidArgument);
}

// The fp32 kernels for few rows and a small side (small_gemm.h), which GemmRunner runs for such
// shapes instead of cuBLASLt: pi0.5's action projections, the edges of what they take, and a
// shape they refuse. Against the CPU at the fp32 tolerance, with and without a bias, through the
// runner (as the executor calls them) and directly.
TEST_F(CudaGemm, SmallF32KernelsMatchCpu) {
  auto runner = GemmRunner::create();
  ASSERT_TRUE(runner.is_ok()) << runner.status().message();
  DevBuf ws(runner->workspace_bytes());
  struct S { int64_t m, k, n; const char* what; };
  uint32_t seed = 900;
  for (S c : {S{50, 32, 1024, "action_in_proj"}, S{50, 1024, 32, "action_out_proj"}, S{64, 64, 33, "widest K"},
              S{1, 4, 5, "one row"}, S{37, 4096, 64, "longest K"}, S{64, 12, 1000, "odd N"}, S{5, 2048, 7, "odd rows"},
              S{1, 1024, 1024, "time_mlp (one row, wide N)"}, S{4, 2048, 3000, "four rows, wide N"}}) {
    ASSERT_TRUE(small_f32_gemm_fits(c.m, c.n, c.k)) << c.what;
    for (bool with_bias : {false, true}) {
      const F32Case f(c.m, c.k, c.n, with_bias, &seed);
      const size_t yn = f.ref.size();
      // direct, through the runner, and through the runner with TF32 permitted (as packages with
      // the fast vision mode ask): still these exact kernels, so still the fp32 tolerance (TF32
      // would be ~1e-3), and no cuBLASLt plan made for them.
      for (const char* how : {"direct", "runner", "runner, TF32 permitted"}) {
        DevBuf y(yn * 4);
        y.poison();
        if (how[0] == 'd') {
          VLAC_CUDA_OK(small_f32_gemm(stream_, c.m, c.n, c.k, f.x->as<float>(), f.w->as<float>(), f.bias(), y.as<float>()));
        } else {
          VLAC_CUDA_OK(f.through_runner(*runner, stream_, std::strlen(how) > 6, false, y, ws));
        }
        sync();
        EXPECT_LT(rel_err(download<float>(y, yn), f.ref), 2e-5) << c.what << (with_bias ? " with bias" : "") << " (" << how << ")";
      }
    }
  }
  EXPECT_FALSE(small_f32_gemm_fits(65, 32, 32));
  EXPECT_FALSE(small_f32_gemm_fits(50, 65, 68));
  EXPECT_FALSE(small_f32_gemm_fits(50, 32, 4100));
  EXPECT_FALSE(small_f32_gemm_fits(50, 32, 30));
  EXPECT_EQ(runner->plans(), size_t(0)) << "fp32 shapes the own kernels run are not planned with cuBLASLt";
  EXPECT_FALSE(small_f32_gemm_fits(5, 1024, 1024));  // wide N and long K: over four rows, cuBLASLt's
  DevBuf x(64 * 4), y(64 * 4);
  EXPECT_EQ(small_f32_gemm(stream_, 65, 1, 4, x.as<float>(), x.as<float>(), nullptr, y.as<float>()).code(),
            StatusCode::InvalidArgument);
}

// The weight-streaming kernel for M <= 64 (skinny_gemm.h), at the expert's four GEMM shapes, the
// time MLP's single row and odd sizes, at every split count it would be timed with: against the
// CPU like cuBLASLt above, the same bits on a second run, and its tile counters left at zero.
TEST_F(CudaGemm, SkinnyKernelMatchesCpu) {
  // cuBLASLt offers FP8 per shape (with CUDA 13 on an H100 per-row scales are refused at
  // 16 x 16 x 64): the pi0.5 shapes must run, the last two may be refused, with a message.
  struct S { int64_t m, k, n; const char* what; bool must = true; };
  const S cases[] = {{50, 1024, 2560, "expert fused qkv"}, {50, 2048, 1024, "expert o"},
                     {50, 1024, 8192, "expert gate+up"},  {50, 4096, 1024, "expert down"},
                     {1, 1024, 3072, "one row"},          {64, 256, 64, "M = 64"},
                     {9, 192, 96, "odd M"},               {33, 64, 32, "one K step"}};
  DevBuf counters(kSkinnyCounters * sizeof(unsigned));
  VLAC_CUDART_OK(cudaMemset(counters.get(), 0, kSkinnyCounters * sizeof(unsigned)));
  uint32_t seed = 7;
  for (const auto& c : cases) {
    ASSERT_TRUE(skinny_gemm_fits(c.m, c.n, c.k)) << c.what;
    const size_t xn = size_t(c.m * c.k), wn = size_t(c.n * c.k), yn = size_t(c.m * c.n);
    auto x = bf16_values(randn(xn, ++seed)), w = bf16_values(randn(wn, ++seed, 1.0f / std::sqrt(float(c.k))));
    auto dx = to_device(to_bf16(x)), dw = to_device(to_bf16(w));
    for (int splits : skinny_gemm_splits(c.n, c.k, device_sm_count()))
      for (DType out : {DType::F32, DType::BF16})
        for (bool bias : {false, true}) {
          auto b = randn(size_t(c.n), ++seed);
          if (out == DType::BF16) b = bf16_values(b);
          auto db = out == DType::BF16 ? to_device(to_bf16(b)) : to_device(b);
          const SkinnyGemm g{c.m, c.n, c.k, out, bias, splits};
          DevBuf ws(std::max<uint64_t>(skinny_gemm_workspace_bytes(g), 16));
          DevBuf dy(yn * dtype_size(out)), dy2(yn * dtype_size(out));
          VLAC_CUDART_OK(cudaMemset(dy.get(), 0xff, yn * dtype_size(out)));  // NaN: unwritten shows
          const void* bp = bias ? db->get() : nullptr;
          auto* cnt = static_cast<unsigned*>(counters.get());
          VLAC_CUDA_OK(skinny_gemm(stream_, g, dx->get(), dw->get(), bp, dy.get(), ws.get(), cnt));
          VLAC_CUDA_OK(skinny_gemm(stream_, g, dx->get(), dw->get(), bp, dy2.get(), ws.get(), cnt));
          sync();
          std::vector<float> ref(yn);
          ref_gemm(x, w, bias ? b.data() : nullptr, false, nullptr, ref, c.m, c.k, c.n);
          std::vector<float> y;
          if (out == DType::F32) {
            y = download<float>(dy, yn);
            EXPECT_EQ(y, download<float>(dy2, yn)) << c.what << ": a second run differs";
          } else {
            const auto raw = download<uint16_t>(dy, yn);
            EXPECT_EQ(raw, download<uint16_t>(dy2, yn)) << c.what << ": a second run differs";
            y = from_bf16(raw);
          }
          EXPECT_LT(rel_err(y, ref), out == DType::F32 ? 1e-4 : 8e-3)
              << c.what << " " << c.m << "x" << c.k << "x" << c.n << " splits " << splits << " -> " << dtype_name(out)
              << " bias " << bias;
        }
  }
  const auto left = download<unsigned>(counters, size_t(kSkinnyCounters));
  EXPECT_EQ(std::count(left.begin(), left.end(), 0u), kSkinnyCounters) << "tile counters not reset";
}

// 8-bit W (core/quant.h blob): the codes widened in registers, each output's fp32 sum times its
// row's scale, then the bias; deterministic; against a double reference of that arithmetic.
TEST_F(CudaGemm, SkinnyKernelReadsEightBitWeights) {
  struct S { int64_t m, k, n; };
  DevBuf counters(kSkinnyCounters * sizeof(unsigned));
  VLAC_CUDART_OK(cudaMemset(counters.get(), 0, kSkinnyCounters * sizeof(unsigned)));
  uint32_t seed = 70;
  for (DType dt : {DType::I8, DType::F8_E4M3})
    for (S c : {S{50, 1024, 2560}, S{50, 4096, 1024}, S{1, 1024, 3072}, S{9, 192, 96}}) {
      const size_t xn = size_t(c.m * c.k), yn = size_t(c.m * c.n);
      auto x = bf16_values(randn(xn, ++seed));
      const auto wf = randn(size_t(c.n * c.k), ++seed, 1.0f / std::sqrt(float(c.k)));
      std::vector<uint8_t> blob(stored_weight_bytes(dt, {c.n, c.k}));
      auto* scales = reinterpret_cast<float*>(blob.data() + quant_scales_offset(c.n, c.k));
      for (int64_t r = 0; r < c.n; ++r) scales[r] = quantize_row(wf.data() + r * c.k, c.k, dt, blob.data() + r * c.k);
      DevBuf dw(blob.size());
      VLAC_CUDART_OK(cudaMemcpy(dw.get(), blob.data(), blob.size(), cudaMemcpyHostToDevice));
      auto dx = to_device(to_bf16(x));
      const auto b = randn(size_t(c.n), ++seed);
      auto db = to_device(b);
      for (int splits : skinny_gemm_splits(c.n, c.k, device_sm_count())) {
        SkinnyGemm g{c.m, c.n, c.k, DType::F32, true, splits};
        g.weights = dt;
        DevBuf ws(std::max<uint64_t>(skinny_gemm_workspace_bytes(g), 16));
        DevBuf dy(yn * 4), dy2(yn * 4);
        auto* cnt = static_cast<unsigned*>(counters.get());
        VLAC_CUDA_OK(skinny_gemm(stream_, g, dx->get(), dw.get(), db->get(), dy.get(), ws.get(), cnt));
        VLAC_CUDA_OK(skinny_gemm(stream_, g, dx->get(), dw.get(), db->get(), dy2.get(), ws.get(), cnt));
        sync();
        const auto y = download<float>(dy, yn);
        EXPECT_EQ(y, download<float>(dy2, yn)) << "a second run differs";
        double err = 0, mx = 0;
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t j = 0; j < c.n; ++j) {
            double sum = 0;
            for (int64_t kk = 0; kk < c.k; ++kk)
              sum += double(x[size_t(i * c.k + kk)]) * double(quant_decode(dt, blob[size_t(j * c.k + kk)]));
            const double ref = sum * double(scales[j]) + double(b[size_t(j)]);
            err = std::max(err, std::fabs(double(y[size_t(i * c.n + j)]) - ref));
            mx = std::max(mx, std::fabs(ref));
          }
        EXPECT_LT(err / mx, 1e-5) << dtype_name(dt) << " " << c.m << "x" << c.k << "x" << c.n << " splits " << splits;
      }
    }
  const auto left = download<unsigned>(counters, size_t(kSkinnyCounters));
  EXPECT_EQ(std::count(left.begin(), left.end(), 0u), kSkinnyCounters) << "tile counters not reset";
}

TEST_F(CudaGemm, SkinnyKernelRejectsWhatItCannotRun) {
  DevBuf b(1 << 16);
  auto* cnt = static_cast<unsigned*>(b.get());
  EXPECT_FALSE(skinny_gemm_fits(65, 64, 64));
  EXPECT_FALSE(skinny_gemm_fits(50, 48, 64));
  EXPECT_FALSE(skinny_gemm_fits(50, 64, 96));
  EXPECT_EQ(skinny_gemm(stream_, SkinnyGemm{50, 48, 64, DType::BF16, false, 1}, b.get(), b.get(), nullptr, b.get(),
                        b.get(), cnt)
                .code(),
            StatusCode::InvalidArgument);
  EXPECT_EQ(skinny_gemm(stream_, SkinnyGemm{8, 64, 1024, DType::BF16, false, 4}, b.get(), b.get(), nullptr, b.get(),
                        nullptr, cnt)
                .code(),
            StatusCode::InvalidArgument);  // split K without a workspace
  EXPECT_EQ(skinny_gemm(stream_, SkinnyGemm{8, 64, 64, DType::BF16, false, 1}, static_cast<uint8_t*>(b.get()) + 2,
                        b.get(), nullptr, b.get(), nullptr, cnt)
                .code(),
            StatusCode::InvalidArgument);  // misaligned
}

// The expert's MLP in one cooperative launch (expert_mlp.h): h against a double reference with the
// unfused path's bf16 roundings (a sum near a rounding boundary may land one bf16 step away), y
// against a double product of the h the kernel wrote (phase B alone, tight), the same bits on a
// second run, and the phase B flags left at zero.
TEST_F(CudaGemm, ExpertMlpMatchesCpu) {
  int optin = 0;
  VLAC_CUDART_OK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  struct S { int64_t m, d, f; int sms, splits; const char* what; };
  const int sms = device_sm_count();
  const S cases[] = {{50, 1024, 4096, sms, 0, "pi0.5 expert"},
                     {56, 1024, 4096, sms, 0, "M = 56"},
                     {1, 512, 1024, sms, 0, "one token"},
                     {9, 512, 2048, 40, 8, "two items a block, two tile rounds"},
                     {33, 1024, 2048, sms, 0, "M = 33"},
                     {50, 1024, 4096, sms, 16, "16 K parts, two items a block"}};
  DevBuf words(kExpertMlpSyncWords * sizeof(unsigned));
  VLAC_CUDART_OK(cudaMemset(words.get(), 0, kExpertMlpSyncWords * sizeof(unsigned)));
  uint32_t seed = 300;
  auto gelu = [](double v) { return v / (1.0 + std::exp(-2.0 * 0.7978845608028654 * (v + 0.044715 * v * v * v))); };
  auto bf = [](double v) { return double(bf16_to_f32(f32_to_bf16(float(v)))); };
  for (const auto& c : cases) {
    ExpertMlp p;
    ASSERT_TRUE(expert_mlp_plan(c.m, c.d, c.f, c.sms, optin, &p, c.splits)) << c.what;
    if (c.splits == 8 && c.sms == 40) {
      EXPECT_EQ(p.items_per_block, 2) << c.what;
    }
    ASSERT_TRUE(expert_mlp_resident(p)) << c.what << ": " << p.smem << " bytes of shared memory a block";
    const int64_t hs = 2 * c.f;  // h in place over the gate|up output, as the executor lays it out
    auto x = bf16_values(randn(size_t(c.m * c.d), ++seed));
    auto wgu = bf16_values(randn(size_t(2 * c.f * c.d), ++seed, 1.0f / std::sqrt(float(c.d))));
    auto wd = bf16_values(randn(size_t(c.d * c.f), ++seed, 1.0f / std::sqrt(float(c.f))));
    auto dx = to_device(to_bf16(x)), dgu = to_device(to_bf16(wgu)), dd = to_device(to_bf16(wd));
    DevBuf dh(size_t(c.m * hs) * 2), dy(size_t(c.m * c.d) * 4), dy2(size_t(c.m * c.d) * 4);
    DevBuf ws(std::max<uint64_t>(expert_mlp_workspace_bytes(p), 16));
    VLAC_CUDART_OK(cudaMemset(dy.get(), 0xff, size_t(c.m * c.d) * 4));  // NaN: unwritten shows
    auto* sy = static_cast<unsigned*>(words.get());
    VLAC_CUDA_OK(expert_mlp(stream_, p, dx->get(), dgu->get(), dd->get(), dh.get(), hs, static_cast<float*>(dy.get()),
                            c.d, ws.get(), sy));
    sync();
    const auto h1 = download<uint16_t>(dh, size_t(c.m * hs));
    VLAC_CUDA_OK(expert_mlp(stream_, p, dx->get(), dgu->get(), dd->get(), dh.get(), hs, static_cast<float*>(dy2.get()),
                            c.d, ws.get(), sy));
    sync();
    const auto y = download<float>(dy, size_t(c.m * c.d));
    EXPECT_EQ(y, download<float>(dy2, size_t(c.m * c.d))) << c.what << ": a second run differs";
    EXPECT_EQ(h1, download<uint16_t>(dh, size_t(c.m * hs))) << c.what << ": h differs on a second run";
    std::vector<float> h(size_t(c.m * c.f)), href(h.size()), yref(y.size());
    for (int64_t r = 0; r < c.m; ++r)
      for (int64_t j = 0; j < c.f; ++j) {
        double gs = 0, us = 0;
        for (int64_t k = 0; k < c.d; ++k) {
          gs += double(x[size_t(r * c.d + k)]) * wgu[size_t(j * c.d + k)];
          us += double(x[size_t(r * c.d + k)]) * wgu[size_t((c.f + j) * c.d + k)];
        }
        href[size_t(r * c.f + j)] = float(bf(bf(gelu(bf(gs))) * bf(us)));
        h[size_t(r * c.f + j)] = bf16_to_f32(h1[size_t(r * hs + j)]);
      }
    EXPECT_LT(rel_err(h, href), 4e-3) << c.what << ": h";
    for (int64_t r = 0; r < c.m; ++r)
      for (int64_t n = 0; n < c.d; ++n) {
        double s = 0;
        for (int64_t k = 0; k < c.f; ++k) s += double(h[size_t(r * c.f + k)]) * wd[size_t(n * c.f + k)];
        yref[size_t(r * c.d + n)] = float(s);
      }
    EXPECT_LT(rel_err(y, yref), 1e-5) << c.what << ": y (splits " << p.splits << ", " << p.items_per_block
                                      << " items a block)";
  }
  const auto left = download<unsigned>(words, size_t(kExpertMlpSyncWords));
  EXPECT_EQ(left[0], 0u) << "barrier arrivals not reset";
  EXPECT_EQ(size_t(std::count(left.begin() + 2, left.end(), 0u)), left.size() - 2) << "phase B flags not reset";
}

// FP8 W8A8 (quantize_rows_e4m3 + GemmRunner::run_scaled): the activation quantizer gives the host's
// codes and scales bit for bit, and the FP8 GEMM multiplies the sums of decoded codes by both
// scale vectors (x's per row of y, W's per column), at pi0.5's shapes, with its epilogues.
// Decoded e4m3 products are exact in fp32, so only the accumulation order separates it from the
// double reference (Hopper's FP8 MMA adds in reduced precision between its fp32 promotions).

// The host's quantization of one row, the kernel's arithmetic (kernels.h).
void quantize_row_e4m3_reference(const float* x, int64_t k, uint8_t* codes, float* scale) {
  float amax = 0.0f;
  bool nan = false;
  for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(x[c])), nan = nan || std::isnan(x[c]);
  if (nan) amax = NAN;
  const float inv = amax > 0.0f ? 448.0f / amax : 0.0f;
  for (int64_t c = 0; c < k; ++c) codes[c] = f32_to_f8e4m3(x[c] * inv);
  *scale = amax / 448.0f;
}

bool fp8_capable(std::string* why) {
  const int cc = device_compute_capability();
  if (cc >= 89) return true;
  *why = "FP8 GEMMs need compute capability 8.9 or later; this GPU is " + std::to_string(cc / 10) + "." +
         std::to_string(cc % 10);
  return false;
}

TEST_F(CudaGemm, QuantizeRowsE4m3MatchesTheHost) {
  struct S { int64_t m, k, ldx; DType xt; const char* what; };
  for (S s : {S{50, 2048, 2048, DType::BF16, "expert x, bf16 (16-byte loads)"},
              S{7, 16384, 16384, DType::BF16, "gemma down x, bf16"},
              S{9, 100, 104, DType::BF16, "odd k, strided bf16 rows (element loads)"},
              S{13, 1152, 1160, DType::F32, "f32 rows, strided"}}) {
    auto x = randn(size_t(s.m * s.ldx), uint32_t(s.k + s.m), 3.0f);
    for (int64_t c = 0; c < s.ldx; ++c) x[size_t(c)] = 0.0f;             // row 0: zeros
    x[size_t(s.ldx + 3)] = 1e6f;                                         // row 1: one huge value
    if (s.m > 4) x[size_t(2 * s.ldx + s.k - 1)] = NAN;                   // row 2: a NaN at the end
    for (int64_t c = 0; c < s.k; ++c) x[size_t(3 * s.ldx + c)] *= 1e-30f;  // row 3: tiny values
    if (s.xt == DType::BF16) x = bf16_values(x);
    auto dx = s.xt == DType::BF16 ? to_device(to_bf16(x)) : to_device(x);
    DevBuf codes(size_t(s.m * s.k)), scales(size_t(s.m) * 4);
    codes.poison();
    scales.poison();
    VLAC_CUDA_OK(quantize_rows_e4m3(stream_, dx->get(), s.xt, s.m, s.k, s.ldx, codes.get(), scales.as<float>()));
    sync();
    const auto got = download<uint8_t>(codes, size_t(s.m * s.k));
    const auto got_s = download<float>(scales, size_t(s.m));
    std::vector<uint8_t> want(size_t(s.k));
    for (int64_t r = 0; r < s.m; ++r) {
      float ws = 0;
      quantize_row_e4m3_reference(&x[size_t(r * s.ldx)], s.k, want.data(), &ws);
      EXPECT_EQ(std::memcmp(&got[size_t(r * s.k)], want.data(), size_t(s.k)), 0) << s.what << ": codes of row " << r;
      if (std::isnan(ws)) EXPECT_TRUE(std::isnan(got_s[size_t(r)])) << s.what << ": scale of row " << r;
      else EXPECT_EQ(got_s[size_t(r)], ws) << s.what << ": scale of row " << r;
    }
    EXPECT_EQ(got_s[0], 0.0f) << s.what << ": a zero row has scale 0";
  }
  DevBuf codes(64), scales(64);
  EXPECT_FALSE(quantize_rows_e4m3(stream_, codes.get(), DType::BF16, 2, 16, 8, codes.get(), scales.as<float>()).is_ok())
      << "a row stride below k";
  EXPECT_FALSE(quantize_rows_e4m3(stream_, codes.get(), DType::I8, 2, 16, 16, codes.get(), scales.as<float>()).is_ok())
      << "8-bit activations";
}

TEST_F(CudaGemm, Fp8GemmAppliesBothScaleVectors) {
  std::string why;
  if (!fp8_capable(&why)) GTEST_SKIP() << why;
  auto runner = GemmRunner::create();
  ASSERT_TRUE(runner.is_ok()) << runner.status().message();
  DevBuf ws(runner->workspace_bytes());
  std::mt19937 rng(7);
  // Codes from every finite e4m3 value (0x7F and 0xFF are NaN), scales spread over 2^±4.
  auto random_codes = [&](size_t n) {
    std::vector<uint8_t> c(n);
    for (auto& v : c) do v = uint8_t(rng() & 0xFFu); while ((v & 0x7Fu) == 0x7Fu);
    return c;
  };
  auto random_scales = [&](size_t n) {
    std::uniform_real_distribution<float> e(-4.0f, 4.0f);
    std::vector<float> s(n);
    for (auto& v : s) v = std::exp2(e(rng)) / 448.0f;
    return s;
  };
  // cuBLASLt offers FP8 per shape (with CUDA 13 on an H100 per-row scales are refused at
  // 16 x 16 x 64): the pi0.5 shapes must run, the last two may be refused, with a message.
  struct S { int64_t m, k, n; const char* what; bool must = true; };
  int ran = 0;
  // The prefix's K and N at 160 rows (not 968): the host reference below is the test's cost.
  for (S c : {S{160, 2048, 2560, "prefix fused qkv"}, S{50, 4096, 1024, "expert down"},
              S{50, 1024, 8192, "expert fused gate+up"}, S{256, 1152, 4304, "siglip fc1"},
              S{1, 1024, 3072, "adaRMS modulation", false}, S{37, 112, 80, "odd", false}}) {
    const auto xc = random_codes(size_t(c.m * c.k)), wc = random_codes(size_t(c.n * c.k));
    const auto xs = random_scales(size_t(c.m)), wsc = random_scales(size_t(c.n));
    auto dxc = to_device(xc), dwc = to_device(wc), dxs = to_device(xs), dws = to_device(wsc);
    std::vector<double> xf(xc.size()), wf(wc.size()), sums(size_t(c.m * c.n));
    for (size_t i = 0; i < xc.size(); ++i) xf[i] = f8e4m3_to_f32(xc[i]);
    for (size_t i = 0; i < wc.size(); ++i) wf[i] = f8e4m3_to_f32(wc[i]);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        const double* xr = xf.data() + i * c.k;
        const double* wr = wf.data() + j * c.k;
        double t = 0;
        for (int64_t q = 0; q < c.k; ++q) t += xr[q] * wr[q];
        sums[size_t(i * c.n + j)] = t * xs[size_t(i)] * wsc[size_t(j)];
      }
    auto bias = bf16_values(randn(size_t(c.n), 11)), y0 = bf16_values(randn(size_t(c.m * c.n), 12));
    auto db = to_device(to_bf16(bias)), dbf = to_device(bias);
    struct V { DType out; Epilogue epi; bool acc; int parts; bool required; };
    for (V v : {V{DType::BF16, Epilogue::None, false, 0, true}, V{DType::F32, Epilogue::None, false, 0, true},
                V{DType::BF16, Epilogue::Bias, false, 0, true}, V{DType::BF16, Epilogue::BiasGelu, false, 0, false},
                V{DType::BF16, Epilogue::None, true, 0, false}, V{DType::F32, Epilogue::Bias, false, 0, false},
                V{DType::F32, Epilogue::None, false, 4, false}}) {
      GemmDesc d{c.m, c.n, c.k, DType::F8_E4M3, v.out, v.epi, v.acc};
      d.k_parts = v.parts;
      const std::string what = std::string(c.what) + " -> " + dtype_name(v.out) + " epilogue " +
                               std::to_string(int(v.epi)) + (v.acc ? " accumulate" : "") +
                               (v.parts ? " in " + std::to_string(v.parts) + " K parts" : "");
      if (v.parts && c.k % (16 * v.parts) != 0) continue;
      const Status planned = runner->plan(d);
      if (!planned.is_ok()) {
        EXPECT_FALSE(v.required && c.must) << what << ": " << planned.message();
        EXPECT_EQ(planned.code(), StatusCode::Unsupported) << what << ": " << planned.message();
        std::printf("[ fp8 gemm ] %-60s not offered by cuBLASLt: %s\n", what.c_str(), planned.message().c_str());
        continue;
      }
      const size_t yn = size_t(c.m * c.n) * size_t(std::max(1, v.parts));
      const bool bf = v.out == DType::BF16;
      auto dy = bf ? to_device(to_bf16(y0)) : to_device(std::vector<float>(yn));
      if (!v.acc) dy->poison();
      const bool has_b = v.epi == Epilogue::Bias || v.epi == Epilogue::BiasGelu;
      VLAC_CUDA_OK(runner->run_scaled(stream_, d, dxc->get(), dxs->as<float>(), dwc->get(), dws->as<float>(),
                                      has_b ? (bf ? db->get() : dbf->get()) : nullptr, dy->get(), ws.get()));
      sync();
      std::vector<float> y = bf ? from_bf16(download<uint16_t>(*dy, yn)) : download<float>(*dy, yn);
      if (v.parts > 1) {  // the reader's sum of the parts
        for (int part = 1; part < v.parts; ++part)
          for (size_t i = 0; i < size_t(c.m * c.n); ++i) y[i] += y[size_t(part) * size_t(c.m * c.n) + i];
        y.resize(size_t(c.m * c.n));
      }
      std::vector<float> ref(size_t(c.m * c.n));
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          double r = sums[size_t(i * c.n + j)] + (has_b ? bias[size_t(j)] : 0.0);
          if (v.epi == Epilogue::BiasGelu) r = 0.5 * r * (1.0 + std::tanh(0.7978845608028654 * (r + 0.044715 * r * r * r)));
          if (v.acc) r += y0[size_t(i * c.n + j)];
          ref[size_t(i * c.n + j)] = float(r);
        }
      // F32 out: Hopper's FP8 MMA sums in fewer bits than fp32 between its promotions
      // (1.8e-4 to 2.8e-4 measured on the H200, session 22).
      const double err = rel_err(y, ref), tol = bf ? 8e-3 : 1e-3;
      std::printf("[ fp8 gemm ] %-60s max|d|/max|ref| = %.3g (tol %.1g)\n", what.c_str(), err, tol);
      EXPECT_LT(err, tol) << what;
      ++ran;
    }
  }
  EXPECT_GT(ran, 0);
  // Scales are required for FP8 and refused otherwise.
  GemmDesc d{50, 1024, 1024, DType::F8_E4M3, DType::BF16, Epilogue::None, false};
  DevBuf x(50 * 1024), w(1024 * 1024), y(50 * 1024 * 2), sc(1024 * 4);
  EXPECT_EQ(runner->run(stream_, d, x.get(), w.get(), nullptr, y.get(), ws.get()).code(), StatusCode::InvalidArgument);
  GemmDesc b16{50, 1024, 1024, DType::BF16, DType::BF16, Epilogue::None, false};
  EXPECT_EQ(runner->run_scaled(stream_, b16, x.get(), sc.as<float>(), w.get(), sc.as<float>(), nullptr, y.get(), ws.get())
                .code(),
            StatusCode::InvalidArgument);
  GemmDesc odd = d;
  odd.k = 1000;  // no multiple of 16
  EXPECT_EQ(runner->plan(odd).code(), StatusCode::Unsupported);
}

}  // namespace
}  // namespace vlac::cuda::testing
