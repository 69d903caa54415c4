// The GEMM that loads its weights before it waits (preload_gemm.h): its tiles (no GPU), its
// arithmetic against the CPU at the expert's shapes and odd ones (W by cp.async and by TMA), and — the point of the kernel —
// that inside a recorded graph, launched at its predecessor's launch completion, it still reads x
// only after the kernel that writes x has finished.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cuda/env.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/preload_gemm.h"
#include "cuda_test_util.h"

namespace vlac::cuda::testing {
namespace {

struct Shape { int64_t m, k, n; const char* what; };
const Shape kExpert[] = {{50, 1024, 2560, "expert fused qkv"},
                         {50, 2048, 1024, "expert o"},
                         {50, 1024, 8192, "expert gate+up"},
                         {50, 4096, 1024, "expert down"}};

TEST(PreloadGemmTiles, ExpertShapesFillTheGpuWithinTheLimit) {
  for (const auto& s : kExpert) {
    const PreloadTiles t = preload_gemm_tiles(s.m, s.n, s.k, 132, 160 << 10);
    ASSERT_GT(t.rows, 0) << s.what;
    EXPECT_EQ(s.n % t.rows, 0) << s.what;
    EXPECT_EQ(s.k % (64 * t.parts), 0) << s.what;
    EXPECT_EQ(t.blocks, (s.n / t.rows) * t.parts) << s.what;
    EXPECT_LE(t.blocks, 132) << s.what;
    EXPECT_GE(t.blocks, 80) << s.what << ": most multiprocessors hold a tile";
    EXPECT_LE(t.smem, uint64_t(160) << 10) << s.what;
    EXPECT_LE(t.parts, 8) << s.what << ": a portable cluster";
    EXPECT_EQ(t.cluster, t.parts) << s.what;
    EXPECT_GE(t.threads, 128) << s.what;
    EXPECT_LE(t.threads, 512) << s.what;
  }
  EXPECT_EQ(preload_gemm_tiles(65, 1024, 1024, 132, 160 << 10).rows, 0) << "more than 64 rows";
  EXPECT_EQ(preload_gemm_tiles(50, 1000, 1024, 132, 160 << 10).rows, 0) << "N not a multiple of 16";
  EXPECT_EQ(preload_gemm_tiles(50, 1024, 1000, 132, 160 << 10).rows, 0) << "K not a multiple of 64";
  EXPECT_EQ(preload_gemm_tiles(50, 8192, 1024, 132, 16 << 10).rows, 0) << "no tile within 16 KiB";
}

// Where the GPU holds fewer clusters at once than a candidate needs, the tiles change to ones that
// load in one wave, and where none does the shape is left to cuBLASLt (rows 0): here a GPU that
// holds 15 clusters of 8 (e.g. a GPC of 14 multiprocessors) and 33 of 4.
TEST(PreloadGemmTiles, PassOverCandidatesThatWouldLoadInTwoWaves) {
  auto resident = [](const PreloadTiles& t) { return t.parts == 8 ? 15 : 132 / t.parts; };
  const PreloadTiles free_o = preload_gemm_tiles(50, 1024, 2048, 132, 160 << 10);
  ASSERT_EQ(free_o.blocks / free_o.parts, 16) << "expert o: 16 clusters of 8 without the check";
  const PreloadTiles o = preload_gemm_tiles(50, 1024, 2048, 132, 160 << 10, 8, resident);
  ASSERT_GT(o.rows, 0);
  EXPECT_LE(o.blocks / o.parts, resident(o));
  EXPECT_GE(o.blocks, 64) << "still most multiprocessors";
  EXPECT_EQ(preload_gemm_tiles(50, 1024, 4096, 132, 160 << 10, 8, resident).rows, 0)
      << "expert down: no tile of one wave within 160 KiB";
  auto unknown = [](const PreloadTiles&) { return -1; };
  const PreloadTiles u = preload_gemm_tiles(50, 1024, 2048, 132, 160 << 10, 8, unknown);
  EXPECT_EQ(u.rows, free_o.rows) << "an unknown count passes";
  EXPECT_EQ(u.parts, free_o.parts);
}

// K parts written as partials (PreloadGemm::k_parts): exactly that many blocks a row tile, no
// cluster, so the GPU's cluster limit is asked about clusters of one block; the expert's down
// then has a one-wave tile where the cluster sum has none (above).
TEST(PreloadGemmTiles, SplitPartsAreExactAndNeedNoCluster) {
  const PreloadTiles down = preload_gemm_tiles(50, 1024, 4096, 132, 160 << 10, 8, {}, 8);
  ASSERT_GT(down.rows, 0) << "expert down in 8 K parts";
  EXPECT_EQ(down.parts, 8);
  EXPECT_EQ(down.cluster, 1) << "no cluster";
  EXPECT_EQ(down.blocks, (1024 / down.rows) * 8);
  EXPECT_LE(down.blocks, 132);
  EXPECT_GE(down.blocks, 64) << "most multiprocessors hold a tile";
  EXPECT_LE(down.smem, uint64_t(160) << 10);
  // A GPU that holds 100 one-block clusters at once: every block must be resident.
  auto hundred = [](const PreloadTiles&) { return 100; };
  const PreloadTiles few = preload_gemm_tiles(50, 1024, 4096, 132, 227 << 10, 8, hundred, 8);
  ASSERT_GT(few.rows, 0);
  EXPECT_LE(few.blocks, 100) << "blocks, not clusters of 8, are counted";
  const PreloadTiles two = preload_gemm_tiles(50, 2560, 1024, 132, 227 << 10, 1, {}, 2);
  EXPECT_EQ(two.parts, 2) << "split parts ignore the cluster limit on parts";
  EXPECT_EQ(preload_gemm_tiles(50, 1024, 4096, 132, 160 << 10, 8, {}, 3).rows, 0) << "3 parts do not divide K";
  EXPECT_EQ(preload_gemm_tiles(50, 1024, 4096, 132, 160 << 10, 8, {}, 128).rows, 0) << "K parts under 64 columns";
}

class CudaPreloadGemm : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    if (!preload_gemm_fits(PreloadGemm{50, 1024, 1024}, device_sm_count()))
      GTEST_SKIP() << "the preload GEMM needs an sm_90 GPU (thread-block clusters, griddepcontrol)";
  }
};

TEST_F(CudaPreloadGemm, MatchesCpu) {
  const Shape cases[] = {kExpert[0], kExpert[1], kExpert[2], kExpert[3],
                         {1, 1024, 3072, "one row"}, {64, 256, 64, "M = 64"},
                         {9, 192, 96, "odd M"},      {33, 64, 32, "one K step"}};
  const int sms = device_sm_count();
  uint32_t seed = 11;
  int ran = 0;
  for (int tma : {0, 1})  // W by cp.async, or by TMA boxes (swizzled 64-column segments)
  for (const auto& c : cases)
    for (DType out : {DType::F32, DType::BF16})
      for (int variant = 0; variant < 3; ++variant) {  // 0 plain, 1 bias, 2 bias + accumulate into a wider y
        const bool bias = variant >= 1, acc = variant == 2;
        const int64_t ldy = acc ? c.n + 64 : c.n;
        const PreloadGemm g{c.m, c.n, c.k, out, bias, acc, 0, ldy, tma};
        if (!preload_gemm_fits(g, sms)) {  // no tile whose clusters this GPU holds at once
          if (variant == 0 && out == DType::F32)
            std::printf("%s: left to cuBLASLt on this GPU (VLAC_PRELOAD_ONE_WAVE=0 tests it)\n", c.what);
          continue;
        }
        ++ran;
        auto x = bf16_values(randn(size_t(c.m * c.k), ++seed));
        auto w = bf16_values(randn(size_t(c.n * c.k), ++seed, 1.0f / std::sqrt(float(c.k))));
        auto b = randn(size_t(c.n), ++seed), y0 = randn(size_t(c.m * ldy), ++seed);
        if (out == DType::BF16) b = bf16_values(b), y0 = bf16_values(y0);
        auto dx = to_device(to_bf16(x)), dw = to_device(to_bf16(w));
        auto db = out == DType::BF16 ? to_device(to_bf16(b)) : to_device(b);
        auto dy = out == DType::BF16 ? to_device(to_bf16(y0)) : to_device(y0);
        auto dy2 = out == DType::BF16 ? to_device(to_bf16(y0)) : to_device(y0);
        const void* bp = bias ? db->get() : nullptr;
        VLAC_CUDA_OK(preload_gemm(stream_, g, sms, dx->get(), dw->get(), bp, dy->get()));
        VLAC_CUDA_OK(preload_gemm(stream_, g, sms, dx->get(), dw->get(), bp, dy2->get()));
        sync();
        std::vector<float> ref(size_t(c.m * c.n));
        cpu::linear_f32(x.data(), w.data(), bias ? b.data() : nullptr, ref.data(), c.m, c.k, c.n);
        const size_t yn = size_t(c.m * ldy);
        std::vector<float> got;
        if (out == DType::F32) {
          got = download<float>(*dy, yn);
          EXPECT_EQ(got, download<float>(*dy2, yn)) << c.what << ": a second run differs";
        } else {
          const auto raw = download<uint16_t>(*dy, yn);
          EXPECT_EQ(raw, download<uint16_t>(*dy2, yn)) << c.what << ": a second run differs";
          got = from_bf16(raw);
        }
        std::vector<float> sub(ref.size());
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t j = 0; j < ldy; ++j) {
            const float v = got[size_t(i * ldy + j)];
            if (j < c.n) {
              sub[size_t(i * c.n + j)] = acc ? v - y0[size_t(i * ldy + j)] : v;
            } else {
              ASSERT_EQ(v, y0[size_t(i * ldy + j)]) << c.what << ": a column past n was written";
            }
          }
        // With accumulation the bf16 output's rounding is of the larger sum: compare against it.
        double err = rel_err(sub, ref);
        if (acc && out == DType::BF16) {
          std::vector<float> want(yn), have(yn);
          for (int64_t i = 0; i < c.m; ++i)
            for (int64_t j = 0; j < c.n; ++j) {
              want[size_t(i * c.n + j)] = ref[size_t(i * c.n + j)] + y0[size_t(i * ldy + j)];
              have[size_t(i * c.n + j)] = got[size_t(i * ldy + j)];
            }
          err = rel_err(have, want);
        }
        EXPECT_LT(err, out == DType::F32 ? 1e-4 : 8e-3) << c.what << " " << c.m << "x" << c.k << "x" << c.n << " -> "
                                                        << dtype_name(out) << " variant " << variant << " tma " << tma;
      }
  EXPECT_GE(ran, 60) << "most shapes run the kernel";
}

// K parts as partials: part q of y is x[:, q·kc, kc]·W[:, q·kc, kc]ᵀ, each within fp32 rounding of
// the CPU's product of those columns, the same on a second run, and nothing past n written.
TEST_F(CudaPreloadGemm, KPartsMatchCpu) {
  struct Case { Shape s; int parts; int64_t pad; };
  const Case cases[] = {{kExpert[3], 8, 0}, {kExpert[3], 4, 64}, {kExpert[0], 4, 0}, {{9, 512, 96, "odd M"}, 2, 8}};
  const int sms = device_sm_count();
  uint32_t seed = 71;
  int ran = 0;
  for (const auto& cs : cases) {
    const Shape& c = cs.s;
    const int64_t ldy = c.n + cs.pad, kc = c.k / cs.parts;
    PreloadGemm g{c.m, c.n, c.k, DType::F32, false, false, 0, ldy};
    g.k_parts = cs.parts;
    if (!preload_gemm_fits(g, sms)) {
      std::printf("%s in %d parts: left to cuBLASLt on this GPU\n", c.what, cs.parts);
      continue;
    }
    ++ran;
    auto x = bf16_values(randn(size_t(c.m * c.k), ++seed));
    auto w = bf16_values(randn(size_t(c.n * c.k), ++seed, 1.0f / std::sqrt(float(c.k))));
    const size_t yn = size_t(cs.parts * c.m * ldy);
    const std::vector<float> y0(yn, 7.0f);
    auto dx = to_device(to_bf16(x)), dw = to_device(to_bf16(w));
    auto dy = to_device(y0), dy2 = to_device(y0);
    VLAC_CUDA_OK(preload_gemm(stream_, g, sms, dx->get(), dw->get(), nullptr, dy->get()));
    VLAC_CUDA_OK(preload_gemm(stream_, g, sms, dx->get(), dw->get(), nullptr, dy2->get()));
    sync();
    const auto got = download<float>(*dy, yn);
    EXPECT_EQ(got, download<float>(*dy2, yn)) << c.what << ": a second run differs";
    for (int q = 0; q < cs.parts; ++q) {
      std::vector<float> xq(size_t(c.m * kc)), wq(size_t(c.n * kc)), ref(size_t(c.m * c.n)), part(ref.size());
      for (int64_t i = 0; i < c.m; ++i)
        std::copy_n(x.begin() + i * c.k + q * kc, kc, xq.begin() + i * kc);
      for (int64_t j = 0; j < c.n; ++j)
        std::copy_n(w.begin() + j * c.k + q * kc, kc, wq.begin() + j * kc);
      cpu::linear_f32(xq.data(), wq.data(), nullptr, ref.data(), c.m, kc, c.n);
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < ldy; ++j) {
          const float v = got[size_t((q * c.m + i) * ldy + j)];
          if (j < c.n)
            part[size_t(i * c.n + j)] = v;
          else
            ASSERT_EQ(v, 7.0f) << c.what << " part " << q << ": a column past n was written";
        }
      EXPECT_LT(rel_err(part, ref), 1e-4) << c.what << " part " << q << " of " << cs.parts;
    }
  }
  EXPECT_GE(ran, 3) << "most cases run the kernel";
}

TEST_F(CudaPreloadGemm, RefusesWhatItCannotRun) {
  const int sms = device_sm_count();
  DevBuf a(1 << 20), b(1 << 20), c(1 << 20);
  EXPECT_EQ(preload_gemm(stream_, PreloadGemm{65, 64, 64}, sms, a.get(), b.get(), nullptr, c.get()).code(),
            StatusCode::Unsupported);
  EXPECT_EQ(preload_gemm(stream_, PreloadGemm{8, 64, 64, DType::F32, true}, sms, a.get(), b.get(), nullptr, c.get()).code(),
            StatusCode::InvalidArgument);
  PreloadGemm parts_bf16{8, 64, 256, DType::BF16};
  parts_bf16.k_parts = 2;
  EXPECT_FALSE(preload_gemm_fits(parts_bf16, sms)) << "K parts are fp32";
  PreloadGemm parts_bias{8, 64, 256, DType::F32, true};
  parts_bias.k_parts = 2;
  EXPECT_FALSE(preload_gemm_fits(parts_bias, sms)) << "K parts take no bias";
  EXPECT_EQ(preload_gemm(stream_, PreloadGemm{8, 64, 64}, sms, static_cast<char*>(a.get()) + 2, b.get(), nullptr,
                         c.get()).code(),
            StatusCode::InvalidArgument);
}

// A chain as the expert runs it — GEMM, a kernel of another kind that writes the next GEMM's x,
// GEMM — recorded once and replayed with every intermediate poisoned (NaN) before each replay:
// each GEMM, launched at its predecessor's launch completion, must still read x after it is
// written. Equal to the eager run bit for bit.
TEST_F(CudaPreloadGemm, GraphReplayWaitsForTheKernelBefore) {
  const int sms = device_sm_count();
  constexpr int64_t m = 50, d = 1024, f = 2048;  // shapes whose clusters fit any sm_90 GPU at once
  constexpr int kLayers = 6;
  auto x0 = bf16_values(randn(size_t(m * d), 3));
  std::vector<std::unique_ptr<DevBuf>> wu, wd;
  for (int l = 0; l < kLayers; ++l) {
    wu.push_back(to_device(to_bf16(bf16_values(randn(size_t(f * d), 100 + l, 1.0f / 32)))));
    wd.push_back(to_device(to_bf16(bf16_values(randn(size_t(d * f), 200 + l, 1.0f / 64)))));
  }
  auto dx = to_device(to_bf16(x0));
  DevBuf h32(size_t(m * f) * 4), h16(size_t(m * f) * 2), y32(size_t(m * d) * 4), x16(size_t(m * d) * 2);
  const PreloadGemm up{m, f, d, DType::F32}, down{m, d, f, DType::F32};
  ASSERT_TRUE(preload_gemm_fits(up, sms) && preload_gemm_fits(down, sms)) << "up and down run the kernel";
  auto chain = [&]() -> Status {
    const void* in = dx->get();
    for (int l = 0; l < kLayers; ++l) {
      VLAC_RETURN_IF_ERROR(preload_gemm(stream_, up, sms, in, wu[size_t(l)]->get(), nullptr, h32.get()));
      VLAC_RETURN_IF_ERROR(gelu_tanh(stream_, h32.get(), DType::F32, h16.get(), DType::BF16, m * f));
      VLAC_RETURN_IF_ERROR(preload_gemm(stream_, down, sms, h16.get(), wd[size_t(l)]->get(), nullptr, y32.get()));
      VLAC_RETURN_IF_ERROR(cast(stream_, y32.get(), DType::F32, x16.get(), DType::BF16, m * d));
      in = x16.get();
    }
    return Status::ok();
  };
  auto poison = [&] {
    for (DevBuf* b : {&h32, &h16, &y32, &x16}) b->poison();
  };
  poison();
  VLAC_CUDA_OK(chain());
  sync();
  const auto want = download<uint16_t>(x16, size_t(m * d));
  ASSERT_EQ(want.size(), size_t(m * d));
  for (uint16_t v : want) ASSERT_FALSE(std::isnan(bf16_to_f32(v))) << "the eager chain left a NaN";

  cudaGraph_t graph = nullptr;
  VLAC_CUDART_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  const Status cs = chain();
  VLAC_CUDART_OK(cudaStreamEndCapture(stream_, &graph));
  VLAC_CUDA_OK(cs);
  // With PDL on, each GEMM after a kernel hangs on that kernel's launch completion.
  size_t ne = 0;
  VLAC_CUDART_OK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &ne));
  std::vector<cudaGraphNode_t> from(ne), to(ne);
  std::vector<cudaGraphEdgeData> ed(ne);
  VLAC_CUDART_OK(cudaGraphGetEdges(graph, from.data(), to.data(), ed.data(), &ne));
  int early = 0;
  for (const auto& e : ed) early += e.from_port == cudaGraphKernelNodePortLaunchCompletion ? 1 : 0;
  if (pdl_enabled() && !env_off("VLAC_PRELOAD_EARLY")) {
    EXPECT_EQ(early, 2 * kLayers - 1) << "edges at launch completion, of " << ne;
  }
  cudaGraphExec_t exec = nullptr;
  VLAC_CUDART_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < 20; ++r) {
    poison();
    VLAC_CUDART_OK(cudaDeviceSynchronize());
    VLAC_CUDART_OK(cudaGraphLaunch(exec, stream_));
    sync();
    ASSERT_EQ(download<uint16_t>(x16, size_t(m * d)), want) << "replay " << r;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace vlac::cuda::testing
