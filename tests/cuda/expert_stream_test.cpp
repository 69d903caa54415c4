// The action expert's GEMM chain in one persistent launch (expert_stream.h): every phase kind of a
// layer (qkv on the RMS-normed residual, o added into it, gate|up with GeGLU, down added into it)
// checked alone against a host emulation of the header's arithmetic, then whole chains in one
// launch against the same chain launched a phase at a time, and the upload's rules.
// A phase's reference starts from the input the kernel read (downloaded just before its launch),
// so errors do not compound from phase to phase. Tolerances (max |Δ| / max |ref| over the output):
//   bf16 out (qkv, GeGLU's h): 8e-3 — exact bf16 products and fp32 sums in another order than the
//     host's double ones, then a rounding to bf16 that may land one step (2^-8 relative) the other
//     way; with the norm the kernel scales the sums by its fp32 1/rms (rsqrtf, Σx² in fp32);
//   fp32 accumulate (o, down): 1e-4 — exact products, fp32 partial sums over K ≤ 4096 and up to
//     4 atomic adds in any order; checked on X and on the increment alone (X's size hides nothing);
//   one launch against phase by phase: 1e-3 on the final X — the same arithmetic but the atomic
//     adds' order, whose last-bit differences may flip a bf16 rounding of a later phase's input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/expert_stream.h"
#include "cuda_test_util.h"

namespace vlac::cuda::testing {
namespace {

constexpr double kTolBf16 = 8e-3;
constexpr double kTolAccumulate = 1e-4;
constexpr double kTolChain = 1e-3;

// v rounded once to bf16 (round to odd into fp32 first: exact round to nearest even from double).
double bf(double v) { return double(bf16_to_f32(f32_to_bf16(f64_to_f32_round_odd(v)))); }
double gelu_tanh(double v) { return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }

// The header's arithmetic of one phase for m tokens. `in` and `out` hold the values of the whole
// buffers (row strides in_stride and out_stride) as the launch finds them; returns `out` as the
// phase leaves it.
std::vector<float> reference_phase(const StreamPhase& p, const std::vector<float>& w, const std::vector<float>& in,
                                   std::vector<float> out, int64_t m) {
  std::vector<double> xb(size_t(p.k)), s(size_t(p.rows));
  for (int64_t t = 0; t < m; ++t) {
    const float* x = in.data() + t * p.in_stride;
    double inv = 1.0;
    if (p.norm) {
      double ss = 0;
      for (int64_t c = 0; c < p.k; ++c) ss += double(x[c]) * double(x[c]);
      inv = 1.0 / std::sqrt(ss / double(p.k) + double(p.eps));
    }
    // bf16 input: the values as they are; fp32: rounded to bf16. The norm scales the sums.
    for (int64_t c = 0; c < p.k; ++c) xb[size_t(c)] = bf(double(x[c]));
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* wr = w.data() + r * p.k;
      double acc = 0;
      for (int64_t c = 0; c < p.k; ++c) acc += double(wr[c]) * xb[size_t(c)];
      s[size_t(r)] = acc * inv;
    }
    float* o = out.data() + t * p.out_stride;
    if (p.geglu) {
      const int64_t f = p.rows / 2;
      for (int64_t j = 0; j < f; ++j) o[j] = float(bf(bf(gelu_tanh(bf(s[size_t(j)]))) * bf(s[size_t(f + j)])));
    } else if (p.accumulate) {
      for (int64_t r = 0; r < p.rows; ++r) o[r] = float(double(o[r]) + s[size_t(r)]);
    } else {
      for (int64_t r = 0; r < p.rows; ++r) o[r] = p.out_f32 ? float(s[size_t(r)]) : float(bf(s[size_t(r)]));
    }
  }
  return out;
}

// The columns [0, cols) of m rows of stride `stride`.
std::vector<float> columns(const std::vector<float>& v, int64_t m, int64_t stride, int64_t cols) {
  std::vector<float> y;
  y.reserve(size_t(m * cols));
  for (int64_t t = 0; t < m; ++t) y.insert(y.end(), v.begin() + t * stride, v.begin() + t * stride + cols);
  return y;
}

size_t count_nan(const std::vector<float>& v) {
  size_t n = 0;
  for (float x : v) n += std::isnan(x) ? 1 : 0;
  return n;
}

// A chain of expert layers at width d for m tokens: the activations X fp32 [m, d] (the residual),
// QKV bf16 [m, 2.5d] and H bf16 [m, 4d], and per layer four phases with their own bf16 weights
// (normal, sd 1/sqrt(k)):
//   qkv     W [2.5d, d]  in X (fp32, norm)               out QKV bf16
//   o       W [d, 2d]    in QKV's first 2d columns        out X += (2 K parts)
//   gate|up W [8d, d]    in X (fp32, norm), GeGLU         out H bf16 [m, 4d]
//   down    W [d, 4d]    in H                             out X += (4 K parts)
struct Chain {
  struct Act {
    int64_t cols = 0;
    bool f32 = false;
    std::unique_ptr<DevBuf> buf;
  };
  struct Phase {
    StreamPhase p;
    std::vector<float> w;  // W's values (bf16-representable)
    std::unique_ptr<DevBuf> dw;
    int in = 0, out = 0;   // which activation
    std::string what;
  };
  enum { kX = 0, kQkv = 1, kH = 2 };

  int64_t m = 0, d = 0;
  Act acts[3];
  std::vector<Phase> phases;

  Chain(int64_t m_, int64_t d_, int layers, uint32_t seed) : m(m_), d(d_) {
    const int64_t cols[3] = {d, d * 5 / 2, 4 * d};
    for (int a = 0; a < 3; ++a) {
      acts[a].cols = cols[a];
      acts[a].f32 = a == kX;
      acts[a].buf = std::make_unique<DevBuf>(size_t(m * cols[a]) * (acts[a].f32 ? 4 : 2));
      cudaMemset(acts[a].buf->get(), 0, acts[a].buf->bytes());
    }
    for (int l = 0; l < layers; ++l) {
      const std::string tag = "layer " + std::to_string(l) + " ";
      add(tag + "qkv", d * 5 / 2, d, 1, kX, kQkv, ++seed, [](StreamPhase& p) { p.norm = true; });
      add(tag + "o", d, 2 * d, 2, kQkv, kX, ++seed, [](StreamPhase& p) { p.accumulate = true; });
      add(tag + "gate|up", 8 * d, d, 1, kX, kH, ++seed, [](StreamPhase& p) { p.norm = p.geglu = true; });
      add(tag + "down", d, 4 * d, 4, kH, kX, ++seed, [](StreamPhase& p) { p.accumulate = true; });
    }
  }

  template <typename F>
  void add(std::string what, int64_t rows, int64_t k, int parts, int in, int out, uint32_t seed, F&& edit) {
    Phase ph;
    ph.what = std::move(what);
    ph.in = in, ph.out = out;
    ph.w = bf16_values(randn(size_t(rows * k), seed, 1.0f / std::sqrt(float(k))));
    ph.dw = to_device(to_bf16(ph.w));
    StreamPhase& p = ph.p;
    p.w = ph.dw->get();
    p.rows = rows, p.k = k, p.parts = parts;
    p.in = acts[in].buf->get();
    p.in_stride = acts[in].cols;
    p.in_f32 = acts[in].f32;
    p.out = acts[out].buf->get();
    p.out_stride = acts[out].cols;
    p.out_f32 = acts[out].f32;
    edit(p);
    phases.push_back(std::move(ph));
  }

  std::vector<StreamPhase> descs() const {
    std::vector<StreamPhase> v;
    for (const auto& ph : phases) v.push_back(ph.p);
    return v;
  }
  // An activation's values [m, cols] (empty on a copy error).
  std::vector<float> read(int a) const {
    const size_t n = size_t(m * acts[a].cols);
    return acts[a].f32 ? download<float>(*acts[a].buf, n) : from_bf16(download<uint16_t>(*acts[a].buf, n));
  }
};

class ExpertStream : public CudaTest {
 protected:
  // CudaTest's SetUp runs in start(), from the tests that need a device: RejectsBadPhases does not.
  void SetUp() override {}

  // Skips without a device; else reads the device's limits and zeroes the barrier's words.
  void start() {
    ASSERT_NO_FATAL_FAILURE(CudaTest::SetUp());
    if (IsSkipped()) return;
    VLAC_CUDART_OK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, 0));
    VLAC_CUDART_OK(cudaDeviceGetAttribute(&optin_, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    sync_words_ = std::make_unique<DevBuf>(size_t(kExpertStreamSyncWords) * sizeof(unsigned));
    ASSERT_NE(sync_words_->get(), nullptr);
    VLAC_CUDART_OK(cudaMemset(sync_words_->get(), 0, sync_words_->bytes()));
  }
  // The default plan for m tokens (with wgmma: Hopper's math); skips where its blocks cannot all
  // be resident at once.
  void plan(int64_t m, ExpertStreamPlan* p, bool wgmma = false) {
    ASSERT_TRUE(expert_stream_plan(m, sms_, optin_, p, 0, wgmma))
        << "no plan for m = " << m << " (" << sms_ << " SMs, " << optin_ << " bytes of shared memory opt-in)";
    EXPECT_EQ(p->m, m);
    EXPECT_EQ(p->wgmma, wgmma);
    if (!expert_stream_resident(*p))
      GTEST_SKIP() << "expert_stream's " << p->blocks << " blocks of " << p->smem
                   << " bytes of shared memory are not all resident on this GPU";
  }
  // Uploads the chain's phases for p.m tokens.
  void upload_phases(const Chain& c, std::unique_ptr<DevBuf>* dev) {
    *dev = std::make_unique<DevBuf>(size_t(expert_stream_phase_bytes(int64_t(c.phases.size()))));
    ASSERT_NE((*dev)->get(), nullptr);
    VLAC_CUDA_OK(expert_stream_upload(c.descs(), c.m, (*dev)->get()));
  }
  unsigned* sync_words() const { return sync_words_->as<unsigned>(); }

  // Runs the chain's phases one launch each (first = i, count = 1); with `check`, each phase's
  // output against reference_phase on the inputs downloaded just before its launch, and every
  // output element written (a non-accumulating phase's output is NaN before its launch).
  void run_phase_by_phase(Chain& c, const ExpertStreamPlan& p, const void* dev, bool check) {
    const int64_t total = int64_t(c.phases.size());
    for (int64_t i = 0; i < total; ++i) {
      const Chain::Phase& ph = c.phases[size_t(i)];
      const StreamPhase& s = ph.p;
      std::vector<float> in, before;
      if (!s.accumulate) c.acts[ph.out].buf->poison();
      if (check) {
        in = c.read(ph.in);
        before = c.read(ph.out);
        ASSERT_FALSE(in.empty() || before.empty()) << ph.what << ": download failed";
      }
      VLAC_CUDA_OK(expert_stream(stream_, p, dev, total, i, 1, sync_words()));
      ASSERT_NO_FATAL_FAILURE(sync());
      if (!check) continue;
      const std::vector<float> got = c.read(ph.out);
      const std::vector<float> ref = reference_phase(s, ph.w, in, before, c.m);
      const int64_t cols = s.geglu ? s.rows / 2 : s.rows;
      const auto g = columns(got, c.m, s.out_stride, cols), r = columns(ref, c.m, s.out_stride, cols);
      const std::string where = ph.what + " (phase " + std::to_string(i) + ", m " + std::to_string(c.m) + ")";
      ASSERT_EQ(count_nan(g), 0u) << where << ": elements not written (or NaN)";
      if (s.accumulate) {
        EXPECT_LT(rel_err(g, r), kTolAccumulate) << where << ": out";
        // The increment alone: what the phase added against the reference's sums.
        const auto b = columns(before, c.m, s.out_stride, cols);
        std::vector<float> dg(g.size()), dr(g.size());
        for (size_t e = 0; e < g.size(); ++e) dg[e] = g[e] - b[e], dr[e] = float(double(r[e]) - double(b[e]));
        EXPECT_LT(rel_err(dg, dr), kTolAccumulate) << where << ": out - out before";
      } else {
        EXPECT_LT(rel_err(g, r), kTolBf16) << where;
      }
    }
  }

  // With each math: a Chain of `layers` layers at width d for m tokens (its weights from `seed`, X
  // from `x_seed`), launched phase by phase with every output checked (run_phase_by_phase).
  void check_each_phase(int64_t m, int64_t d, int layers, uint32_t seed, uint32_t x_seed) {
    for (bool wg : maths()) {
      SCOPED_TRACE(wg ? "wgmma" : "mma.sync");
      ExpertStreamPlan p;
      ASSERT_NO_FATAL_FAILURE(plan(m, &p, wg));
      if (IsSkipped()) return;
      Chain c(m, d, layers, seed);
      upload(*c.acts[Chain::kX].buf, randn(size_t(m * d), x_seed));
      std::unique_ptr<DevBuf> dev;
      ASSERT_NO_FATAL_FAILURE(upload_phases(c, &dev));
      ASSERT_NO_FATAL_FAILURE(run_phase_by_phase(c, p, dev->get(), true));
    }
  }

  // The maths to test: mma.sync everywhere, and wgmma where this GPU and build run it (an H100 or
  // H200 with sm_90a code); a note says when wgmma is left out.
  static std::vector<bool> maths() {
    if (expert_stream_wgmma_available()) return {false, true};
    std::printf("note: expert_stream's wgmma math is not tested here (needs sm_90 and a build with 90a-real)\n");
    return {false};
  }

  int sms_ = 0, optin_ = 0;
  std::unique_ptr<DevBuf> sync_words_;
};

// Each phase kind of the expert's layer, at width 512 for 50 tokens over two layers, launched alone:
// the norm, the K parts' atomic adds, GeGLU's roundings and a strided input (QKV's first 1024 of
// 1280 columns) each give the header's arithmetic, and every output element is written.
TEST_F(ExpertStream, EachPhaseMatchesCpu) {
  ASSERT_NO_FATAL_FAILURE(start());
  if (IsSkipped()) return;
  ASSERT_NO_FATAL_FAILURE(check_each_phase(50, 512, 2, 100, 1));
}

// The whole chain (8 phases) in one launch gives the X of the same phases launched one at a time:
// the grid barriers order every phase's reads after the previous phase's writes, including across
// layers, at 1 token (one partial column tile of 8), 50 (seven, the last partial) and 56 (seven full).
TEST_F(ExpertStream, OneLaunchMatchesPhaseByPhase) {
  ASSERT_NO_FATAL_FAILURE(start());
  if (IsSkipped()) return;
  constexpr int64_t d = 512;
  for (bool wg : maths())
  for (int64_t m : {1, 50, 56}) {
    SCOPED_TRACE(std::string(wg ? "wgmma" : "mma.sync") + ", m = " + std::to_string(m));
    ExpertStreamPlan p;
    ASSERT_NO_FATAL_FAILURE(plan(m, &p, wg));
    if (IsSkipped()) return;
    Chain c(m, d, 2, 200);
    const auto x0 = randn(size_t(m * d), 2);
    std::unique_ptr<DevBuf> dev;
    ASSERT_NO_FATAL_FAILURE(upload_phases(c, &dev));
    const int64_t total = int64_t(c.phases.size());
    upload(*c.acts[Chain::kX].buf, x0);
    ASSERT_NO_FATAL_FAILURE(run_phase_by_phase(c, p, dev->get(), false));
    const auto x_phases = c.read(Chain::kX);
    upload(*c.acts[Chain::kX].buf, x0);
    c.acts[Chain::kQkv].buf->poison();
    c.acts[Chain::kH].buf->poison();
    VLAC_CUDA_OK(expert_stream(stream_, p, dev->get(), total, 0, total, sync_words()));
    ASSERT_NO_FATAL_FAILURE(sync());
    const auto x_one = c.read(Chain::kX);
    ASSERT_EQ(count_nan(x_phases), 0u) << "phase by phase";
    EXPECT_LT(rel_err(x_one, x_phases), kTolChain) << "final X, one launch against phase by phase";
  }
  // The barrier's arrival counter is a multiple of the blocks after every launch (the next
  // launch's base).
  const auto words = download<unsigned>(*sync_words_, size_t(kExpertStreamSyncWords));
  ASSERT_EQ(words.size(), 2u);
  const unsigned long long arrivals = words[0] | (static_cast<unsigned long long>(words[1]) << 32);
  EXPECT_GT(arrivals, 0u);
  EXPECT_EQ(arrivals % static_cast<unsigned long long>(sms_), 0u) << "arrivals " << arrivals;
}

// pi0.5's action expert layer (D = 1024: qkv [2560, 1024], o [1024, 2048] on QKV's first 2048
// of 2560 columns, gate|up [8192, 1024], down [1024, 4096]) for its 50 tokens, phase by phase as
// in EachPhaseMatchesCpu: items of two 512-column chunks, rounds of several items a block.
TEST_F(ExpertStream, PiShapesMatchCpu) {
  ASSERT_NO_FATAL_FAILURE(start());
  if (IsSkipped()) return;
  ASSERT_NO_FATAL_FAILURE(check_each_phase(50, 1024, 1, 300, 3));
}

// The header's rules, checked on the host before anything is copied (so no device is needed:
// `dev` is null and the addresses are never read): each broken rule gives an error that names the
// phase (the third of three here), and the planner refuses m outside 1..56 and a GPU whose
// shared memory is too small.
TEST_F(ExpertStream, RejectsBadPhases) {
  auto addr = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  StreamPhase good;
  good.w = addr(0x100000);
  good.rows = 32, good.k = 1024, good.parts = 1;
  good.in = addr(0x200000), good.in_stride = 1024, good.in_f32 = false;
  good.out = addr(0x300000), good.out_stride = 32, good.out_f32 = false;
  struct Bad {
    const char* rule;
    void (*edit)(StreamPhase&);
  };
  const Bad bad[] = {
      {"rows % 16 != 0", [](StreamPhase& p) { p.rows = 40, p.out_stride = 40; }},
      {"k not a multiple of 512", [](StreamPhase& p) { p.k = 768, p.in_stride = 768; }},
      {"k not a multiple of 512 * parts",
       [](StreamPhase& p) { p.k = 1536, p.in_stride = 1536, p.parts = 2, p.out_f32 = p.accumulate = true; }},
      {"in_stride < k", [](StreamPhase& p) { p.in_stride = 512; }},
      {"parts 2 without accumulate", [](StreamPhase& p) { p.parts = 2, p.out_f32 = true; }},
      {"norm on a bf16 input", [](StreamPhase& p) { p.norm = true; }},
      {"geglu with parts 2", [](StreamPhase& p) { p.geglu = true, p.parts = 2; }},
      {"null w", [](StreamPhase& p) { p.w = nullptr; }},
  };
  for (const Bad& b : bad) {
    std::vector<StreamPhase> phases = {good, good, good};
    b.edit(phases[2]);
    const Status s = expert_stream_upload(phases, 50, nullptr);
    EXPECT_FALSE(s.is_ok()) << b.rule << ": accepted";
    EXPECT_NE(s.message().find("phase 2"), std::string::npos) << b.rule << ": the message does not name phase 2: "
                                                              << s.message();
  }
  ExpertStreamPlan p;
  EXPECT_TRUE(expert_stream_plan(50, 132, 232448, &p)) << "an H100's limits";
  EXPECT_TRUE(expert_stream_plan(56, 132, 232448, &p)) << "an H100's limits";
  EXPECT_FALSE(expert_stream_plan(0, 132, 232448, &p)) << "m = 0";
  EXPECT_FALSE(expert_stream_plan(57, 132, 232448, &p)) << "m = 57";
  EXPECT_FALSE(expert_stream_plan(50, 132, 1024, &p)) << "1 KiB of shared memory";
}

}  // namespace
}  // namespace vlac::cuda::testing
