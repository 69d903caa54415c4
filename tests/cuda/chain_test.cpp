// The whole pi0.5 chain on the GPU against lerobot's fixtures (tests/fixtures/pi05): the folder
// on "cuda" (fp32 within 1e-4 of lerobot, bf16 within the suite's 2e-2), recorded chunks (CUDA
// graphs) equal to the eager run, packages compiled for the CPU and for CUDA run on "cuda" agreeing
// with the folder on the GPU, and 1, 2, 3 and absent cameras against the CPU backend. Skips
// without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <stdlib.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <cstring>
#include <filesystem>
#include <optional>

#include "backends/cuda/kernels.h"
#include "backends/cuda/l2_prefetch.h"
#include "backends/cuda/op_profile.h"
#include "compile/pi05_compile.h"
#include "core/quant.h"
#include "io/safetensors.h"
#include "tensor_file_util.h"
#include "models/pi05_demo.h"
#include "policy/pi05_policy.h"
#include "runtime/pi05_package_policy.h"

namespace fs = std::filesystem;
using namespace vlac;
using vlac::testutil::read_f32;

namespace {

// VLAC_SOURCE_DIR in the environment overrides the build's (the device machine runs a copy of the
// tree somewhere else).
const std::string kFixtures =
    std::string(std::getenv("VLAC_SOURCE_DIR") ? std::getenv("VLAC_SOURCE_DIR") : VLAC_SOURCE_DIR) + "/tests/fixtures/pi05";

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    d = std::max(d, double(std::fabs(a[i] - b[i])));
  }
  return d;
}

class CudaChain : public ::testing::Test {
 protected:
  void SetUp() override {
    const Status s = cuda::device_status();
    if (!s.is_ok()) GTEST_SKIP() << s.message();
  }
};

struct ChainRun {
  std::vector<float> eager;            // run_prefix + denoise
  std::vector<float> chunks[3];        // run_chunk x3: direct, recorded, replayed
  uint64_t replays = 0;
};

ChainRun run_folder(const std::string& dir, const std::string& backend, Pi05Precision p, const Pi05Observation* obs_override = nullptr,
                    Pi05PolicyOptions::Vision vision = Pi05PolicyOptions::Vision::Fp32) {
  ChainRun r;
  Pi05PolicyOptions o;
  o.precision = p;
  o.vision = vision;
  o.backend = backend;
  auto pol = Pi05Policy::load(dir + "/policy", o);
  EXPECT_TRUE(pol.is_ok()) << pol.status().message();
  if (!pol.is_ok()) return r;
  auto obs = read_pi05_observation(dir + "/obs.safetensors", pol->model());
  auto noise = read_pi05_noise(dir + "/noise.safetensors", pol->model());
  EXPECT_TRUE(obs.is_ok() && noise.is_ok());
  if (!obs.is_ok() || !noise.is_ok()) return r;
  const Pi05Observation& ob = obs_override ? *obs_override : *obs;
  r.eager.resize(noise->size());
  Status st = pol->run_prefix(ob);
  EXPECT_TRUE(st.is_ok()) << st.message();
  st = pol->denoise(noise->data(), r.eager.data());
  EXPECT_TRUE(st.is_ok()) << st.message();
  for (auto& c : r.chunks) {
    c.resize(noise->size());
    st = pol->run_chunk(ob, noise->data(), c.data());
    EXPECT_TRUE(st.is_ok()) << st.message();
  }
  r.replays = pol->chunk_replays();
  return r;
}

}  // namespace

TEST_F(CudaChain, FolderFp32MatchesLerobotAndGraphsReplayIt) {
  for (const char* c : {"tiny_a", "tiny_b", "tiny_b_absent_cam"}) {
    const std::string dir = kFixtures + "/" + c;
    ChainRun r = run_folder(dir, "cuda", Pi05Precision::Fp32);
    const std::vector<float> want = read_f32(dir + "/expected.safetensors", "action_normalized");
    const double d = max_abs_diff(r.eager, want);
    EXPECT_LE(d, 1e-4) << c;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(max_abs_diff(r.chunks[i], r.eager), 0.0) << c << " chunk " << i;
    EXPECT_EQ(r.replays, 1u) << c;
    std::printf("[ cuda     ] %s fp32 on cuda: max |d action_normalized| vs lerobot = %.3g; recorded chunks equal\n", c, d);
  }
}

TEST_F(CudaChain, FolderBf16MatchesLerobotBf16) {
  {
    const std::string dir = kFixtures + "/tiny_a_bf16";
    ChainRun r = run_folder(dir, "cuda", Pi05Precision::Bf16);
    const double d = max_abs_diff(r.eager, read_f32(dir + "/expected.safetensors", "action_normalized"));
    EXPECT_LE(d, 2e-2);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(max_abs_diff(r.chunks[i], r.eager), 0.0) << "chunk " << i;
    ChainRun cpu = run_folder(dir, "cpu", Pi05Precision::Bf16);
    const double dc = max_abs_diff(r.eager, cpu.eager);
    EXPECT_LE(dc, 2e-2);
    std::printf("[ cuda     ] tiny_a_bf16 bf16 on cuda: vs lerobot bf16 %.3g, vs vlac cpu bf16 %.3g\n", d, dc);
  }
  {
    const std::string dir = kFixtures + "/tiny_a";
    ChainRun r = run_folder(dir, "cuda", Pi05Precision::Bf16);
    const double vs_fp32 = max_abs_diff(r.eager, read_f32(dir + "/expected.safetensors", "action_normalized"));
    const double vs_bf16 = max_abs_diff(r.eager, read_f32(kFixtures + "/tiny_a_bf16/expected.safetensors", "action_normalized"));
    EXPECT_LE(vs_fp32, 2e-2);
    EXPECT_LE(vs_bf16, 2e-2);
    std::printf("[ cuda     ] tiny_a --dtype bf16 on cuda: vs lerobot fp32 %.3g, vs lerobot bf16 %.3g\n", vs_fp32, vs_bf16);
  }
}

// The opt-in vision modes (SigLIP in TF32 or bf16, its attention in the bf16 kernel) keep the
// issue's bound on the fixtures (|vlac - lerobot fp32| <= |lerobot bf16 - lerobot fp32|) and the
// suite's bf16 tolerance from lerobot fp32, and their recorded chunks equal the eager run. Their
// distance from lerobot's bf16 mode is printed, and bounded only for tf32: lerobot's bf16 mode
// keeps SigLIP fp32, so bf16 vision (plus the bf16 gate|up outputs lerobot also has) may sit on
// the other side of fp32 from it (session 10: 0.0216 against lerobot bf16, 0.0084 from fp32
// where lerobot bf16 is 0.0144 from fp32). The full-size benchmark decides the bound for real.
TEST_F(CudaChain, FastVisionStaysWithinTheBf16Tolerance) {
  using V = Pi05PolicyOptions::Vision;
  const std::string dir = kFixtures + "/tiny_a";
  const std::vector<float> fp32 = read_f32(dir + "/expected.safetensors", "action_normalized");
  const std::vector<float> bf16 = read_f32(kFixtures + "/tiny_a_bf16/expected.safetensors", "action_normalized");
  ChainRun def = run_folder(dir, "cuda", Pi05Precision::Bf16);
  for (V v : {V::Tf32, V::Bf16}) {
    const char* name = v == V::Tf32 ? "tf32" : "bf16";
    ChainRun r = run_folder(dir, "cuda", Pi05Precision::Bf16, nullptr, v);
    const double vs_fp32 = max_abs_diff(r.eager, fp32), vs_bf16 = max_abs_diff(r.eager, bf16);
    EXPECT_LE(vs_fp32, 2e-2) << name;
    EXPECT_LE(vs_fp32, max_abs_diff(bf16, fp32)) << name << ": farther from lerobot fp32 than lerobot bf16 is";
    if (v == V::Tf32) {
      EXPECT_LE(vs_bf16, 2e-2) << name;
    }
    for (int i = 0; i < 3; ++i) EXPECT_EQ(max_abs_diff(r.chunks[i], r.eager), 0.0) << name << " chunk " << i;
    std::printf("[ cuda     ] tiny_a bf16, vision %s: vs lerobot fp32 %.3g (default bf16 %.3g, lerobot bf16 %.3g), "
                "vs lerobot bf16 %.3g\n",
                name, vs_fp32, max_abs_diff(def.eager, fp32), max_abs_diff(bf16, fp32), vs_bf16);
  }
}

TEST_F(CudaChain, CamerasOneTwoThreeAndAbsentAgreeWithTheCpu) {
  const std::string dir = kFixtures + "/tiny_b";
  Pi05PolicyOptions o;
  o.precision = Pi05Precision::Fp32;
  auto pol = Pi05Policy::load(dir + "/policy", o);
  ASSERT_TRUE(pol.is_ok()) << pol.status().message();
  auto obs = read_pi05_observation(dir + "/obs.safetensors", pol->model());
  ASSERT_TRUE(obs.is_ok()) << obs.status().message();
  ASSERT_EQ(obs->cameras.size(), 3u);
  for (size_t n : {size_t(1), size_t(2), size_t(3)}) {
    Pi05Observation sub = *obs;
    sub.cameras.resize(n);
    sub.images.resize(n);
    ChainRun g = run_folder(dir, "cuda", Pi05Precision::Fp32, &sub);
    ChainRun c = run_folder(dir, "cpu", Pi05Precision::Fp32, &sub);
    const double d = max_abs_diff(g.eager, c.eager);
    EXPECT_LE(d, 1e-4) << n << " cameras";
    EXPECT_EQ(max_abs_diff(g.chunks[2], g.eager), 0.0) << n << " cameras";
    std::printf("[ cuda     ] tiny_b with %zu camera(s): cuda vs cpu %.3g\n", n, d);
  }
  // The absent-camera fixture (lerobot's reference) is in FolderFp32MatchesLerobotAndGraphsReplayIt.
}

// Packages on the GPU against the folder on the GPU: one compiled for the CPU (unfused engines,
// re-bound to "cuda" by name) and one compiled for CUDA (fused q|k|v and gate|up, whose column
// slices the executor reads in place; the expert's K/V concatenations kept between steps), in
// fp32, bf16 and, for CUDA, bf16-all (SigLIP in the fast mode too: lerobot's bf16 tolerance).
TEST_F(CudaChain, PackagesRunOnCudaAndAgreeWithTheFolder) {
  struct Case {
    const char* backend;
    const char* dtype;  // fp32, bf16, bf16-all
  };
  for (const Case& k : {Case{"cpu", "fp32"}, Case{"cpu", "bf16"}, Case{"cuda", "fp32"}, Case{"cuda", "bf16"},
                        Case{"cuda", "bf16-all"}}) {
    const bool bf16 = std::string(k.dtype) != "fp32", all = std::string(k.dtype) == "bf16-all";
    const std::string name = std::string(k.backend) + " package, " + k.dtype;
    const std::string dir = kFixtures + (bf16 ? "/tiny_a" : "/tiny_b");
    std::string tmpl = (fs::temp_directory_path() / "vlac-cudachain-XXXXXX").string();
    const fs::path tmp = mkdtemp(tmpl.data());
    Pi05CompileOptions co;
    co.out = (tmp / "p.vlac").string();
    co.backend = k.backend;
    co.bf16 = bf16;
    co.bf16_all_matrices = all;
    co.engine_cap = 64 << 10;  // several engines per stage: crossings through device buffers
    auto sum = compile_pi05(dir + "/policy", co);
    ASSERT_TRUE(sum.is_ok()) << name << ": " << sum.status().message();
    Pi05PackageOptions po;
    po.backend = "cuda";
    auto pkg = Pi05PackagePolicy::open(co.out, po);
    ASSERT_TRUE(pkg.is_ok()) << name << ": " << pkg.status().message();
    EXPECT_NE(pkg->device_description().find("cuda"), std::string::npos);
    EXPECT_EQ(pkg->fast_vision(), all) << name;
    auto folder_pol = Pi05Policy::load(dir + "/policy", {});
    ASSERT_TRUE(folder_pol.is_ok());
    auto obs = read_pi05_observation(dir + "/obs.safetensors", folder_pol->model());
    auto noise = read_pi05_noise(dir + "/noise.safetensors", folder_pol->model());
    ASSERT_TRUE(obs.is_ok() && noise.is_ok());
    std::vector<float> a(noise->size());
    Status st = pkg->run_prefix(*obs);
    ASSERT_TRUE(st.is_ok()) << name << ": " << st.message();
    st = pkg->denoise(noise->data(), a.data());
    ASSERT_TRUE(st.is_ok()) << name << ": " << st.message();
    ChainRun f = run_folder(dir, "cuda", bf16 ? Pi05Precision::Bf16 : Pi05Precision::Fp32);
    // bf16: the package runs its cameras through one batched SigLIP, the folder one camera at a
    // time, so the fp32 vision GEMMs have other shapes (cuBLASLt algorithms, summation orders);
    // the 1e-7-level differences then meet bf16 roundings in the LM (measured up to 1.7e-3).
    const double d = max_abs_diff(a, f.eager);
    EXPECT_LE(d, all ? 2e-2 : bf16 ? 5e-3 : 1e-5) << name;
    std::vector<float> c(noise->size());
    for (int i = 0; i < 3; ++i) {
      st = pkg->run_chunk(*obs, noise->data(), c.data());
      ASSERT_TRUE(st.is_ok()) << name << ": " << st.message();
      EXPECT_EQ(max_abs_diff(c, a), 0.0) << name << ": chunk " << i;
    }
    EXPECT_EQ(pkg->chunk_replays(), 1u) << name;
    // A second prefix between chunks: the steps must read the new K/V cache, not the kept one.
    std::vector<float> e2(noise->size());
    ASSERT_TRUE(pkg->run_prefix(*obs).is_ok());
    ASSERT_TRUE(pkg->denoise(noise->data(), e2.data()).is_ok());
    EXPECT_EQ(max_abs_diff(e2, a), 0.0) << name << ": eager after recorded chunks";
    if (!bf16) {
      const double dl = max_abs_diff(a, read_f32(dir + "/expected.safetensors", "action_normalized"));
      EXPECT_LE(dl, 1e-4) << name;
    }
    std::printf("[ cuda     ] %s (%zu engines) on cuda vs folder on cuda: %.3g\n", name.c_str(),
                size_t(pkg->stats().engines_loaded), d);
    fs::remove_all(tmp);
  }
}

// tiny_a compiled for CUDA with every matrix in bf16 (engines of at most `engine_cap` bytes, 0:
// the default) into a temporary folder, with its observation and noise.
struct TinyBf16Package {
  fs::path tmp;
  std::string path;
  std::optional<Pi05Observation> obs;
  std::vector<float> noise;
  ~TinyBf16Package() {
    if (!tmp.empty()) fs::remove_all(tmp);
  }
};
void make_tiny_bf16_package(TinyBf16Package* t, uint64_t engine_cap) {
  const std::string dir = kFixtures + "/tiny_a";
  std::string tmpl = (fs::temp_directory_path() / "vlac-tiny-XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  t->tmp = tmpl;
  Pi05CompileOptions co;
  co.out = t->path = (t->tmp / "p.vlac").string();
  co.backend = "cuda";
  co.bf16 = true;
  co.bf16_all_matrices = true;
  if (engine_cap) co.engine_cap = engine_cap;
  auto sum = compile_pi05(dir + "/policy", co);
  ASSERT_TRUE(sum.is_ok()) << sum.status().message();
  auto folder_pol = Pi05Policy::load(dir + "/policy", {});
  ASSERT_TRUE(folder_pol.is_ok());
  auto obs = read_pi05_observation(dir + "/obs.safetensors", folder_pol->model());
  auto noise = read_pi05_noise(dir + "/noise.safetensors", folder_pol->model());
  ASSERT_TRUE(obs.is_ok() && noise.is_ok());
  t->obs = std::move(*obs);
  t->noise = std::move(*noise);
}
// A bf16-all CUDA package of a random policy folder of `dims` (write_random_pi05_folder), with a
// sample observation and a fixed noise.
void make_random_bf16_package(TinyBf16Package* t, const Pi05Dims& dims, uint64_t seed) {
  std::string tmpl = (fs::temp_directory_path() / "vlac-rand-XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  t->tmp = tmpl;
  const std::string policy = (t->tmp / "policy").string(), obs_path = (t->tmp / "obs.safetensors").string();
  ASSERT_TRUE(write_random_pi05_folder(policy, dims, Pi05Layout::FineTune, seed).is_ok());
  ASSERT_TRUE(write_pi05_sample_observation(policy, obs_path, 12, seed).is_ok());
  Pi05CompileOptions co;
  co.out = t->path = (t->tmp / "p.vlac").string();
  co.backend = "cuda";
  co.bf16 = true;
  co.bf16_all_matrices = true;
  auto sum = compile_pi05(policy, co);
  ASSERT_TRUE(sum.is_ok()) << sum.status().message();
  auto folder_pol = Pi05Policy::load(policy, {});
  ASSERT_TRUE(folder_pol.is_ok()) << folder_pol.status().message();
  auto obs = read_pi05_observation(obs_path, folder_pol->model());
  ASSERT_TRUE(obs.is_ok()) << obs.status().message();
  t->obs = std::move(*obs);
  t->noise.resize(size_t(50 * dims.max_action_dim));
  for (size_t i = 0; i < t->noise.size(); ++i) t->noise[i] = std::sin(float(i) * 0.731f) * 1.3f;
}
// A recorded chunk's text embedding is gathered on the host before each replay (a replay hook),
// not by a host node inside the graph: chunks with other tokens replay to the actions an eager
// run gives them, bit for bit, and a token outside the vocabulary in a replayed chunk is one
// clear error, after which the next chunk runs. VLAC_GATHER_IN_GRAPH=1 (the host node) is checked
// the same way.
TEST_F(CudaChain, ReplayedChunksGatherTheirOwnTokens) {
  TinyBf16Package t;
  make_tiny_bf16_package(&t, 0);
  if (HasFatalFailure()) return;
  Pi05Observation b = *t.obs;
  ASSERT_GE(b.tokens.size(), 3u);
  std::reverse(b.tokens.begin(), b.tokens.end());
  ASSERT_NE(b.tokens, t.obs->tokens);
  std::vector<float> want_a(t.noise.size()), want_b(t.noise.size());
  for (int which = 0; which < 2; ++which) {  // eager reference chunks, one fresh package each
    Pi05PackageOptions po;
    po.backend = "cuda";
    auto pkg = Pi05PackagePolicy::open(t.path, po);
    ASSERT_TRUE(pkg.is_ok()) << pkg.status().message();
    ASSERT_TRUE(pkg->run_chunk(which ? b : *t.obs, t.noise.data(), (which ? want_b : want_a).data()).is_ok());
  }
  ASSERT_GT(max_abs_diff(want_a, want_b), 0.0) << "the two prompts must give different actions";
  for (const char* in_graph : {"0", "1"}) {
    setenv("VLAC_GATHER_IN_GRAPH", in_graph, 1);
    Pi05PackageOptions po;
    po.backend = "cuda";
    auto pkg = Pi05PackagePolicy::open(t.path, po);
    ASSERT_TRUE(pkg.is_ok()) << pkg.status().message();
    std::vector<float> c(t.noise.size());
    const Pi05Observation* order[] = {&*t.obs, &b, &*t.obs, &b, &b, &*t.obs};  // eager, recorded, replays
    for (size_t i = 0; i < std::size(order); ++i) {
      ASSERT_TRUE(pkg->run_chunk(*order[i], t.noise.data(), c.data()).is_ok()) << in_graph << " chunk " << i;
      EXPECT_EQ(max_abs_diff(c, order[i] == &b ? want_b : want_a), 0.0) << "in graph " << in_graph << ", chunk " << i;
    }
    EXPECT_EQ(pkg->chunk_replays(), 4u) << in_graph;
    if (in_graph[0] == '0') {
      Pi05Observation bad = b;
      bad.tokens[1] = int64_t(1) << 30;
      const Status st = pkg->run_chunk(bad, t.noise.data(), c.data());
      EXPECT_FALSE(st.is_ok());
      EXPECT_NE(st.message().find("vocabulary"), std::string::npos) << st.message();
      ASSERT_TRUE(pkg->run_chunk(b, t.noise.data(), c.data()).is_ok());
      EXPECT_EQ(max_abs_diff(c, want_b), 0.0) << "the chunk after a bad one";
    }
    unsetenv("VLAC_GATHER_IN_GRAPH");
  }
}

// A value of the package runtime's memory breakdown, -1 when absent.
int64_t breakdown_value(const Pi05PackagePolicy& p, const std::string& key) {
  for (const auto& [k, v] : p.runtime().memory_breakdown())
    if (k == key) return v;
  return -1;
}

// The weights only the memo reads (the time MLP, the adaRMS modulations) left in the package and
// read at each memo miss (CudaWeights::fetch) give the same actions, bit for bit, as uploading
// them, recorded chunks included; and a later chunk reads none of them (the memo hits).
TEST_F(CudaChain, OnDemandMemoWeightsGiveTheSameActions) {
  TinyBf16Package t;
  ASSERT_NO_FATAL_FAILURE(make_tiny_bf16_package(&t, 64 << 10));
  auto counter = breakdown_value;
  const Pi05Observation* obs = &*t.obs;
  const std::vector<float>* noise = &t.noise;
  std::vector<float> actions[2];
  int64_t left[2] = {0, 0}, fetches[2] = {0, 0};
  for (int on = 0; on < 2; ++on) {
    setenv("VLAC_ON_DEMAND_WEIGHTS", on ? "1" : "0", 1);  // every memo-only weight, or none
    Pi05PackageOptions po;
    po.backend = "cuda";
    auto pkg = Pi05PackagePolicy::open(t.path, po);
    ASSERT_TRUE(pkg.is_ok()) << pkg.status().message();
    const int64_t left0 = std::max<int64_t>(0, counter(*pkg, "on_demand_weight_bytes"));
    const int64_t f0 = std::max<int64_t>(0, counter(*pkg, "on_demand_fetches"));
    actions[on].resize(noise->size());
    for (int i = 0; i < 4; ++i) {  // eager, warm-up, recorded, replayed
      std::vector<float> c(noise->size());
      const Status st = pkg->run_chunk(*obs, noise->data(), c.data());
      ASSERT_TRUE(st.is_ok()) << st.message();
      if (i == 0) {
        actions[on] = c;
        fetches[on] = counter(*pkg, "on_demand_fetches") - f0;
      } else {
        EXPECT_EQ(max_abs_diff(c, actions[on]), 0.0) << "on-demand " << on << ", chunk " << i;
      }
    }
    left[on] = counter(*pkg, "on_demand_weight_bytes") - left0;
    EXPECT_EQ(counter(*pkg, "on_demand_fetches") - f0, fetches[on]) << "later chunks hit the memo and read nothing";
  }
  unsetenv("VLAC_ON_DEMAND_WEIGHTS");
  EXPECT_EQ(left[0], 0);
  EXPECT_EQ(fetches[0], 0);
  EXPECT_GT(left[1], 0);
  EXPECT_GT(fetches[1], 0);
  EXPECT_EQ(max_abs_diff(actions[0], actions[1]), 0.0);
  std::printf("[ cuda     ] on-demand memo weights: %lld bytes left in the package, %lld reads in the first chunk\n",
              static_cast<long long>(left[1]), static_cast<long long>(fetches[1]));
}

TEST_F(CudaChain, BadTokenIdIsOneClearError) {
  const std::string dir = kFixtures + "/tiny_b";
  Pi05PolicyOptions o;
  o.backend = "cuda";
  auto pol = Pi05Policy::load(dir + "/policy", o);
  ASSERT_TRUE(pol.is_ok()) << pol.status().message();
  auto obs = read_pi05_observation(dir + "/obs.safetensors", pol->model());
  ASSERT_TRUE(obs.is_ok());
  obs->tokens[2] = 1 << 30;
  const Status st = pol->run_prefix(*obs);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("vocabulary"), std::string::npos) << st.message();
  std::printf("[ cuda     ] bad token id: %s\n", st.message().c_str());
}

// An 8-bit weight blob widened on the GPU (dequant_bf16) equals the host's decode · scale
// rounded to bf16, for both codes, on the vector path (k % 16 == 0) and the scalar one, for the
// whole matrix and for a slice of its rows (the executor's sliced widening).
TEST_F(CudaChain, DequantKernelMatchesTheHostDecode) {
  for (DType dt : {DType::I8, DType::F8_E4M3})
    for (int64_t k : {64, 40})
      for (int64_t row0 : {0, 11}) {
          const int64_t n = 37, rows = row0 == 0 ? n : 17;
          std::vector<uint8_t> blob(stored_weight_bytes(dt, {n, k}));
          auto* scales = reinterpret_cast<float*>(blob.data() + quant_scales_offset(n, k));
          std::vector<float> row(static_cast<size_t>(k));
          for (int64_t r = 0; r < n; ++r) {
            for (int64_t c = 0; c < k; ++c) row[size_t(c)] = std::sin(float(r * k + c)) * float(r + 1);
            scales[r] = quantize_row(row.data(), k, dt, blob.data() + r * k);
          }
          void* dblob = nullptr;
          void* dout = nullptr;
          ASSERT_EQ(cudaMalloc(&dblob, blob.size()), cudaSuccess);
          ASSERT_EQ(cudaMalloc(&dout, size_t(n * k) * 2), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(dblob, blob.data(), blob.size(), cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_TRUE(cuda::dequant_bf16(nullptr, dblob, dt, n, k, row0, rows, dout).is_ok());
          std::vector<uint16_t> got(size_t(rows * k));
          ASSERT_EQ(cudaMemcpy(got.data(), dout, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
          int bad = 0;
          for (int64_t i = 0; i < rows * k; ++i) {
            const int64_t at = row0 * k + i;
            const float want = quant_decode(dt, blob[size_t(at)]) * scales[at / k];
            if (got[size_t(i)] != f32_to_bf16(want)) ++bad;
          }
          EXPECT_EQ(bad, 0) << dtype_name(dt) << " k=" << k << " row0=" << row0;
          EXPECT_FALSE(cuda::dequant_bf16(nullptr, dblob, dt, n, k, 30, 8, dout).is_ok()) << "rows past n";
          cudaFree(dblob);
          cudaFree(dout);
        }
}

// VLAC_PROFILE_OPS=2 groups nodes across layers by name: numeric parts become '#' (no GPU needed).
TEST(CudaOpProfile, LayerPatternHidesLayerIndices) {
  EXPECT_EQ(cuda::layer_pattern("lm.3.q_proj"), "lm.#.q_proj");
  EXPECT_EQ(cuda::layer_pattern("expert.17.mlp.down"), "expert.#.mlp.down");
  EXPECT_EQ(cuda::layer_pattern("vision.encoder.layers.26.fc2"), "vision.encoder.layers.#.fc2");
  EXPECT_EQ(cuda::layer_pattern("q8_proj.2x"), "q8_proj.2x");
  EXPECT_EQ(cuda::layer_pattern("12"), "#");
  EXPECT_EQ(cuda::layer_pattern(""), "");
  EXPECT_EQ(cuda::layer_pattern("a..1."), "a..#.");
  EXPECT_EQ(cuda::layer_of("lm.3.q_proj"), "lm.3");
  EXPECT_EQ(cuda::layer_of("vision.encoder.layers.26.fc2"), "vision.encoder.layers.26");
  EXPECT_EQ(cuda::layer_of("action_in_proj"), "(outside layers)");
}

// The prefetch planner (no GPU): every GEMM's weight is prefetched once, before it runs, with
// the bytes in flight within the cap, in fewer launches than GEMMs, adjacent weights merged.
TEST(CudaL2Prefetch, PlanReachesEveryGemmWithinTheCap) {
  constexpr uint64_t kMiB = 1 << 20;
  // Fake addresses: the planner only compares and adds them.
  auto at = [](uint64_t off) { return reinterpret_cast<const void*>(uintptr_t(1) << 32 | uintptr_t(off)); };
  std::vector<cuda::PrefetchGemm> g;
  uint64_t off = 0;
  for (int layer = 0; layer < 3; ++layer)
    for (uint64_t mib : {5u, 4u, 16u, 8u}) {  // an expert layer's q|k|v, o, gate|up, down
      g.push_back({g.size() * 3 + 2, cuda::L2Range{at(off), mib * kMiB}});
      off += mib * kMiB + 4096;  // not adjacent
    }
  for (uint64_t cap : {16 * kMiB, 32 * kMiB, 48 * kMiB}) {
    const auto plan = cuda::plan_l2_prefetch(g, cap, cap / 2);
    std::vector<int> seen(g.size(), 0);
    for (size_t li = 0; li < plan.size(); ++li) {
      const auto& l = plan[li];
      if (li > 0) {
        EXPECT_LE(plan[li - 1].before, l.before);
      }
      for (const auto& r : l.ranges)
        for (size_t j = 0; j < g.size(); ++j)
          if (g[j].w.p == r.p) {
            ++seen[j];
            EXPECT_LE(l.before, g[j].pos) << "prefetched after it ran";
            EXPECT_EQ(r.bytes, g[j].w.bytes);
          }
      // In flight right after this launch: prefetched, not yet run.
      uint64_t inflight = 0;
      for (size_t j = 0; j < g.size(); ++j)
        if (g[j].pos >= l.before)
          for (size_t m = 0; m <= li; ++m)
            for (const auto& r : plan[m].ranges) {
              if (r.p == g[j].w.p) inflight += r.bytes;
            }
      EXPECT_LE(inflight, cap) << "cap " << cap / kMiB << " MiB, launch " << li;
    }
    for (size_t j = 0; j < g.size(); ++j) EXPECT_EQ(seen[j], 1) << "GEMM " << j << ", cap " << cap / kMiB;
    EXPECT_LT(plan.size(), g.size()) << "cap " << cap / kMiB;
  }
  EXPECT_TRUE(cuda::plan_l2_prefetch(g, 0, 0).empty());
  // Adjacent weights merge into one range; one larger than the cap goes alone.
  std::vector<cuda::PrefetchGemm> adj = {{1, {at(0), 2 * kMiB}}, {3, {at(2 * kMiB), 2 * kMiB}}, {5, {at(8 * kMiB), 40 * kMiB}}};
  const auto p2 = cuda::plan_l2_prefetch(adj, 32 * kMiB, 0);
  ASSERT_EQ(p2.size(), 2u);
  EXPECT_EQ(p2[0].before, 0u);
  ASSERT_EQ(p2[0].ranges.size(), 1u);
  EXPECT_EQ(p2[0].ranges[0].bytes, 4 * kMiB);
  EXPECT_EQ(p2[1].before, 4u);  // after the second GEMM (position 3), nothing left in flight
  EXPECT_EQ(p2[1].ranges[0].bytes, 40 * kMiB);
}

// One package run with an environment switch at `off`, then at `on`, each in a policy of its own:
// the first chunk's actions of each (the later chunks, warm-up, recorded and replayed, must give
// the same bits) and how far the breakdown counter `key` moved meanwhile. The switch is unset after.
struct SwitchRuns {
  std::vector<float> actions[2];
  int64_t counted[2] = {0, 0};
};
void run_with_switch(const std::string& path, const Pi05Observation& obs, const std::vector<float>& noise,
                     const char* var, const char* off, const char* on, const std::string& key, SwitchRuns* r) {
  int64_t before = -1;
  for (int k = 0; k < 2; ++k) {
    setenv(var, k ? on : off, 1);
    Pi05PackageOptions po;
    po.backend = "cuda";
    auto pkg = Pi05PackagePolicy::open(path, po);
    ASSERT_TRUE(pkg.is_ok()) << pkg.status().message();
    if (before < 0) before = std::max<int64_t>(0, breakdown_value(*pkg, key));
    for (int i = 0; i < 4; ++i) {
      std::vector<float> c(noise.size());
      const Status st = pkg->run_chunk(obs, noise.data(), c.data());
      ASSERT_TRUE(st.is_ok()) << var << "=" << (k ? on : off) << ", chunk " << i << ": " << st.message();
      if (i == 0) r->actions[k] = c;
      else EXPECT_EQ(max_abs_diff(c, r->actions[k]), 0.0) << var << "=" << (k ? on : off) << ", chunk " << i;
    }
    r->counted[k] = breakdown_value(*pkg, key) - before;
    before = breakdown_value(*pkg, key);
  }
  unsetenv(var);
}

// The prefetch kernel over unaligned ranges, and a package run with prefetches planned before
// every small GEMM gives the same actions, bit for bit, as without them (eager, warm-up,
// recorded, replayed).
TEST_F(CudaChain, L2PrefetchChangesNoAction) {
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 1 << 20), cudaSuccess);
  const cuda::L2Range r[2] = {{static_cast<uint8_t*>(buf) + 3, (1 << 20) - 7}, {buf, 40}};
  EXPECT_TRUE(cuda::l2_prefetch(nullptr, r, 2, 4).is_ok());
  EXPECT_FALSE(cuda::l2_prefetch(nullptr, r, cuda::kMaxL2Ranges + 1, 4).is_ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(buf);

  TinyBf16Package t;
  ASSERT_NO_FATAL_FAILURE(make_tiny_bf16_package(&t, 0));
  SwitchRuns runs;
  setenv("VLAC_L2_PREFETCH_BATCH_MIB", "0", 1);
  ASSERT_NO_FATAL_FAILURE(
      run_with_switch(t.path, *t.obs, t.noise, "VLAC_L2_PREFETCH_MIB", "0", "1", "l2_prefetch_launches_per_run", &runs));
  unsetenv("VLAC_L2_PREFETCH_BATCH_MIB");
  const int64_t* launches = runs.counted;
  EXPECT_EQ(launches[0], 0);
  EXPECT_GT(launches[1], 0);
  EXPECT_EQ(max_abs_diff(runs.actions[0], runs.actions[1]), 0.0);
  std::printf("[ cuda     ] L2 prefetch: %lld launches a run of the engines, same actions\n", static_cast<long long>(launches[1]));
}

// A plan switch of the expert attention, off ("0") against `on`, in a bf16-all package of a
// random policy with pi0.5's head dim (the bf16 attention kernel's; the fixtures' is 16): the
// counter `key` moves only with it on, and the actions are the same bits either way (eager,
// warm-up, recorded and replayed). Both runs on the own attention kernel: at this tiny size the
// expert's attention has no key splits, so cuDNN (on by default, cudnn_attention.h) would take it.
void expect_attention_switch_keeps_actions(uint32_t seed, const char* var, const char* on, const char* key,
                                           const char* none_moved, int64_t* counted) {
  Pi05Dims dims = Pi05Dims::demo();
  dims.head_dim = 256, dims.lm_heads = dims.expert_heads = 2;
  TinyBf16Package t;
  ASSERT_NO_FATAL_FAILURE(make_random_bf16_package(&t, dims, seed));
  SwitchRuns r;
  setenv("VLAC_CUDNN_ATTN", "0", 1);
  run_with_switch(t.path, *t.obs, t.noise, var, "0", on, key, &r);
  unsetenv("VLAC_CUDNN_ATTN");
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_EQ(r.counted[0], 0);
  EXPECT_GT(r.counted[1], 0) << none_moved;
  EXPECT_EQ(max_abs_diff(r.actions[0], r.actions[1]), 0.0);
  *counted = r.counted[1];
}

// The expert's RoPE inside its attention (plan_rope_attention, opt-in: VLAC_ROPE_ATTENTION=1):
// every expert layer's attention rotates q and its own keys itself, with the rope launches' bits.
TEST_F(CudaChain, RopeInsideTheExpertAttentionChangesNoAction) {
  int64_t folds = 0;
  expect_attention_switch_keeps_actions(23, "VLAC_ROPE_ATTENTION", "1", "rope_attention_folds",
                                        "no expert attention took its RoPE", &folds);
  std::printf("[ cuda     ] RoPE inside the expert attention: %lld attentions, same actions\n",
              static_cast<long long>(folds));
}

// plan_attention_early (VLAC_ATTN_EARLY=3, opt-in): the expert attentions load their kept prefix
// keys before they wait and the RoPE pair before each lets them launch early. (Whether a split
// lies wholly in the prefix at this size depends on the GPU's splits;
// CudaAttention.StableKeysLoadedEarlyChangeNoBit runs the kernel's early path.)
TEST_F(CudaChain, AttentionEarlyLoadsChangeNoAction) {
  int64_t early = 0;
  expect_attention_switch_keeps_actions(29, "VLAC_ATTN_EARLY", "3", "attention_early_loads",
                                        "no expert attention read kept prefix keys", &early);
  std::printf("[ cuda     ] early prefix-key loads: %lld attentions, same actions\n", static_cast<long long>(early));
}

// Step 0 beside the LM (Pi05PackageOptions::step_overlap, on by default on a GPU; VLAC_STEP_OVERLAP=0
// off): a chunk's first denoising step runs on
// a second stream beside the prefix LM, each of its engines waiting for the LM's K/V marks at
// their first read, and the other steps after it. Eager, warm-up, recorded (two streams forked and
// joined in one capture) and replayed chunks give the same bits as one stream.
TEST_F(CudaChain, StepOverlapChangesNoAction) {
  for (uint32_t seed : {0u, 31u}) {
    TinyBf16Package t;
    if (seed == 0) {  // tiny_a in engines of 64 KiB: the LM and the step in several each
      ASSERT_NO_FATAL_FAILURE(make_tiny_bf16_package(&t, 64 << 10));
    } else {  // the expert attention's 256-wide heads, one engine a stage
      Pi05Dims dims = Pi05Dims::demo();
      dims.head_dim = 256, dims.lm_heads = dims.expert_heads = 2;
      ASSERT_NO_FATAL_FAILURE(make_random_bf16_package(&t, dims, seed));
    }
    SwitchRuns r;
    ASSERT_NO_FATAL_FAILURE(run_with_switch(t.path, *t.obs, t.noise, "VLAC_STEP_OVERLAP", "0", "1", "lane_input_waits", &r));
    EXPECT_EQ(r.counted[0], 0) << "seed " << seed;
    EXPECT_GT(r.counted[1], 0) << "seed " << seed << ": no step engine waited for the LM on the other stream";
    EXPECT_EQ(max_abs_diff(r.actions[0], r.actions[1]), 0.0) << "seed " << seed;
    std::printf("[ cuda     ] step 0 beside the LM (seed %u): %lld input waits, same actions\n", seed,
                static_cast<long long>(r.counted[1]));
  }
}

// The timing probe (VLAC_TIMING_SKIP, executor.cpp): a pattern that names no node changes no
// action; one that names the expert's attentions leaves them unlaunched, so the actions move.
TEST_F(CudaChain, TimingSkipLeavesOnlyTheNamedNodesUnlaunched) {
  TinyBf16Package t;
  ASSERT_NO_FATAL_FAILURE(make_tiny_bf16_package(&t, 0));
  const auto first_chunk = [&](const char* skip, std::vector<float>* out) {
    if (skip) setenv("VLAC_TIMING_SKIP", skip, 1);
    Pi05PackageOptions po;
    po.backend = "cuda";
    auto pkg = Pi05PackagePolicy::open(t.path, po);
    ASSERT_TRUE(pkg.is_ok()) << pkg.status().message();
    out->assign(t.noise.size(), 0.0f);
    const Status st = pkg->run_chunk(*t.obs, t.noise.data(), out->data());
    unsetenv("VLAC_TIMING_SKIP");
    ASSERT_TRUE(st.is_ok()) << st.message();
  };
  std::vector<float> base, none, no_attention;
  ASSERT_NO_FATAL_FAILURE(first_chunk(nullptr, &base));
  ASSERT_NO_FATAL_FAILURE(first_chunk("no.such.node*", &none));
  ASSERT_NO_FATAL_FAILURE(first_chunk("expert.*.attention", &no_attention));
  EXPECT_EQ(max_abs_diff(base, none), 0.0);
  size_t moved = 0;  // (unwritten outputs may hold NaNs: counted as moved)
  for (size_t i = 0; i < base.size(); ++i) moved += !(base[i] == no_attention[i]);
  EXPECT_GT(moved, 0u) << "the expert's attentions still ran";
}

// VLAC_KV_PERSIST_MIB (executor.h, plan_kv_window): the expert attentions launch with an L2
// window over the kept prefix K/V. A cache policy cannot change a result: eager, warm-up,
// recorded and replayed chunks give the same bits with and without it, and the window is there.
TEST_F(CudaChain, KvPersistWindowKeepsTheActions) {
  TinyBf16Package t;
  ASSERT_NO_FATAL_FAILURE(make_tiny_bf16_package(&t, 0));
  int dev = 0, max_persist = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, dev), cudaSuccess);
  std::vector<float> actions[2];
  uint64_t windows[2] = {0, 0};
  for (int on = 0; on < 2; ++on) {
    if (on) setenv("VLAC_KV_PERSIST_MIB", "8", 1);
    Pi05PackageOptions po;
    po.backend = "cuda";
    auto pkg = Pi05PackagePolicy::open(t.path, po);
    ASSERT_TRUE(pkg.is_ok()) << pkg.status().message();
    const uint64_t before = cuda::l2_window_launches();
    for (int i = 0; i < 4; ++i) {  // eager, warm-up, recorded, replayed
      std::vector<float> c(t.noise.size());
      const Status st = pkg->run_chunk(*t.obs, t.noise.data(), c.data());
      ASSERT_TRUE(st.is_ok()) << "window " << on << ", chunk " << i << ": " << st.message();
      if (i == 0) actions[on] = c;
      else EXPECT_EQ(max_abs_diff(c, actions[on]), 0.0) << "window " << on << ", chunk " << i;
    }
    windows[on] = cuda::l2_window_launches() - before;
    unsetenv("VLAC_KV_PERSIST_MIB");
  }
  EXPECT_EQ(max_abs_diff(actions[1], actions[0]), 0.0);
  EXPECT_EQ(windows[0], 0u);
  if (max_persist > 0) EXPECT_GT(windows[1], 0u) << "no attention launched with the window";
  else std::printf("[ cuda     ] this GPU has no persisting L2: the window is not set\n");
  (void)cudaCtxResetPersistingL2Cache();
  (void)cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0);
}

// VLAC_GEMM_PDL=1 (gemm.h, set_programmatic_edges): the package's GEMM plans are probed, and the
// recorded chunks' cuBLASLt GEMMs whose kernels passed start on programmatic edges. Eager, warm-up,
// recorded and replayed chunks give the same bits with and without it.
TEST_F(CudaChain, GemmProgrammaticEdgesKeepTheActions) {
  TinyBf16Package t;
  ASSERT_NO_FATAL_FAILURE(make_tiny_bf16_package(&t, 0));
  SwitchRuns r;
  ASSERT_NO_FATAL_FAILURE(run_with_switch(t.path, *t.obs, t.noise, "VLAC_GEMM_PDL", "0", "1", "gemm_pdl_probed_shapes", &r));
  EXPECT_EQ(r.counted[0], 0);
  EXPECT_GT(r.counted[1], 0) << "no GEMM plan was probed";
  EXPECT_EQ(max_abs_diff(r.actions[0], r.actions[1]), 0.0);
  std::printf("[ cuda     ] GEMM plans probed for programmatic edges: %lld, same actions\n",
              static_cast<long long>(r.counted[1]));
}

// The expert's MLP in one launch (VLAC_EXPERT_MLP=1, expert_mlp.h) inside whole package runs: a
// random demo-sized policy whose expert is 512 wide with an MLP of 1024 (the kernel's smallest
// shape), compiled bf16-all for CUDA. With it, eager, warm-up, recorded and replayed chunks give
// the same bits (the cooperative launch inside a captured graph, with PDL); against the three
// launches the actions differ (another sum order: it ran) by no more than bf16 roundings do.
TEST_F(CudaChain, ExpertMlpInOneLaunchKeepsTheActions) {
  Pi05Dims dims = Pi05Dims::demo();
  dims.expert_width = 512, dims.expert_mlp = 1024;
  TinyBf16Package t;
  ASSERT_NO_FATAL_FAILURE(make_random_bf16_package(&t, dims, 17));
  const Pi05Observation* obs = &*t.obs;
  const std::vector<float>& noise = t.noise;
  std::vector<float> actions[2];
  const char* was = std::getenv("VLAC_EXPERT_MLP");
  const std::string prev = was ? was : "";
  for (int on = 0; on < 2; ++on) {
    setenv("VLAC_EXPERT_MLP", on ? "1" : "0", 1);
    Pi05PackageOptions po;
    po.backend = "cuda";
    auto pkg = Pi05PackagePolicy::open(t.path, po);
    ASSERT_TRUE(pkg.is_ok()) << pkg.status().message();
    for (int i = 0; i < 4; ++i) {  // eager, warm-up, recorded, replayed
      std::vector<float> c(noise.size());
      const Status st = pkg->run_chunk(*obs, noise.data(), c.data());
      ASSERT_TRUE(st.is_ok()) << "expert mlp " << on << ", chunk " << i << ": " << st.message();
      if (i == 0) actions[on] = c;
      else EXPECT_EQ(max_abs_diff(c, actions[on]), 0.0) << "expert mlp " << on << ", chunk " << i;
    }
  }
  if (was) setenv("VLAC_EXPERT_MLP", prev.c_str(), 1);  // as the test found it (whichever the default)
  else unsetenv("VLAC_EXPERT_MLP");
  double peak = 0;
  for (float v : actions[0]) peak = std::max(peak, double(std::fabs(v)));
  const double d = max_abs_diff(actions[1], actions[0]);
  std::printf("[ cuda     ] expert mlp in one launch vs three: max|d| %.3g (max|action| %.3g)\n", d, peak);
  EXPECT_GT(d, 0.0) << "the fused kernel did not run";
  EXPECT_LE(d, 2e-2 * std::max(peak, 1.0));
}

// The finish of an exactly scaled 8-bit GEMM (scale_columns): y = [gelu](scale·t (+ y) + bias)
// rounded once, against the host, for f32 and bf16 y with a wider row stride, the 4-column and
// the 1-column paths, and in place over f32 sums (the K parts).
TEST_F(CudaChain, ScaleColumnsFinishesTheSumsAsTheGemmWould) {
  struct Case { int64_t m, n, ldt, ldy; DType yt; bool bias, gelu, acc, in_place; };
  for (Case c : {Case{5, 64, 64, 96, DType::BF16, true, false, false, false}, Case{7, 36, 40, 36, DType::F32, true, true, false, false},
                 Case{3, 13, 13, 17, DType::BF16, false, true, false, false}, Case{4, 32, 32, 48, DType::BF16, true, false, true, false},
                 Case{6, 9, 11, 11, DType::F32, false, false, true, false}, Case{5, 24, 24, 24, DType::F32, false, false, false, true}}) {
    const size_t es = dtype_size(c.yt);
    std::vector<float> t(size_t(c.m * c.ldt)), sc(size_t(c.n)), bias(size_t(c.n)), y0(size_t(c.m * c.ldy));
    for (size_t i = 0; i < t.size(); ++i) t[i] = std::sin(float(i) * 0.37f) * 40.0f;
    for (size_t j = 0; j < sc.size(); ++j) sc[j] = 0.01f + 0.003f * float(j), bias[j] = std::cos(float(j)) * 0.5f;
    for (size_t i = 0; i < y0.size(); ++i) y0[i] = std::cos(float(i) * 0.11f);
    // Device copies in y's dtype (bias too); t is y itself in place.
    auto to_bytes = [&](const std::vector<float>& v) {
      std::vector<uint8_t> b(v.size() * es);
      for (size_t i = 0; i < v.size(); ++i) {
        if (c.yt == DType::F32) std::memcpy(b.data() + 4 * i, &v[i], 4);
        else { const uint16_t h = f32_to_bf16(v[i]); std::memcpy(b.data() + 2 * i, &h, 2); }
      }
      return b;
    };
    if (c.in_place) y0 = t;
    const std::vector<uint8_t> yb = to_bytes(y0), bb = to_bytes(bias);
    void *dt = nullptr, *ds = nullptr, *db = nullptr, *dy = nullptr;
    ASSERT_EQ(cudaMalloc(&dt, t.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&ds, sc.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&db, bb.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dy, yb.size()), cudaSuccess);
    cudaMemcpy(dt, t.data(), t.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(ds, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, bb.data(), bb.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dy, yb.data(), yb.size(), cudaMemcpyHostToDevice);
    const float* tsrc = c.in_place ? static_cast<const float*>(dy) : static_cast<const float*>(dt);
    ASSERT_TRUE(cuda::scale_columns(nullptr, tsrc, c.ldt, c.m, c.n, static_cast<const float*>(ds), c.bias ? db : nullptr,
                                    c.gelu, c.acc, dy, c.yt, c.ldy).is_ok());
    std::vector<uint8_t> got(yb.size());
    ASSERT_EQ(cudaMemcpy(got.data(), dy, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    auto stored = [&](const std::vector<uint8_t>& b, size_t i) {
      if (c.yt == DType::F32) { float f; std::memcpy(&f, b.data() + 4 * i, 4); return f; }
      uint16_t h; std::memcpy(&h, b.data() + 2 * i, 2); return bf16_to_f32(h);
    };
    double worst = 0;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.ldy; ++j) {
        const size_t at = size_t(i * c.ldy + j);
        float want = stored(yb, at);  // columns past n stay as they were
        if (j < c.n) {
          float v = sc[size_t(j)] * t[size_t(i * c.ldt + j)];
          if (c.acc) v += stored(yb, at);
          if (c.bias) v += stored(bb, size_t(j));
          if (c.gelu) v = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
          want = c.yt == DType::F32 ? v : bf16_to_f32(f32_to_bf16(v));
        }
        worst = std::max(worst, double(std::fabs(stored(got, at) - want)) / std::max(1.0, double(std::fabs(want))));
      }
    // f32: the same few operations (expf vs tanh in GELU); bf16: at most a rounding flip on that.
    EXPECT_LE(worst, c.yt == DType::F32 ? 1e-5 : 8e-3) << c.m << "x" << c.n << " ldt " << c.ldt << " ldy " << c.ldy;
    EXPECT_FALSE(cuda::scale_columns(nullptr, tsrc, c.n - 1, c.m, c.n, static_cast<const float*>(ds), nullptr, false, false,
                                     dy, c.yt, c.ldy).is_ok()) << "t's stride below n";
    for (void* p : {dt, ds, db, dy}) cudaFree(p);
  }
}

// The codes alone (scaled = false): each bf16 is the decoded code, exactly.
TEST_F(CudaChain, UnscaledDequantIsTheCodesExactly) {
  for (DType dt : {DType::I8, DType::F8_E4M3}) {
    const int64_t n = 9, k = 48;
    std::vector<uint8_t> blob(stored_weight_bytes(dt, {n, k}));
    for (int64_t i = 0; i < n * k; ++i) blob[size_t(i)] = uint8_t(i * 37 + 11);
    if (dt == DType::F8_E4M3)
      for (int64_t i = 0; i < n * k; ++i)
        if ((blob[size_t(i)] & 0x7f) == 0x7f) blob[size_t(i)] = 0;  // no NaN codes
    void *db = nullptr, *d1 = nullptr, *d2 = nullptr;
    ASSERT_EQ(cudaMalloc(&db, blob.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d1, size_t(n * k) * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d2, size_t(n * k) * 2), cudaSuccess);
    cudaMemcpy(db, blob.data(), blob.size(), cudaMemcpyHostToDevice);
    ASSERT_TRUE(cuda::dequant_bf16(nullptr, db, dt, n, k, 0, n, d1, false).is_ok());
    cuda::DequantJob job{db, dt, n, k, d2, false};
    ASSERT_TRUE(cuda::dequant_bf16_many(nullptr, &job, 1).is_ok());
    std::vector<uint16_t> g1(size_t(n * k)), g2(size_t(n * k));
    cudaMemcpy(g1.data(), d1, g1.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(g2.data(), d2, g2.size() * 2, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int64_t i = 0; i < n * k; ++i) {
      const float want = quant_decode(dt, blob[size_t(i)]);
      if (bf16_to_f32(g1[size_t(i)]) != want || bf16_to_f32(g2[size_t(i)]) != want) ++bad;
    }
    EXPECT_EQ(bad, 0) << dtype_name(dt);
    for (void* p : {db, d1, d2}) cudaFree(p);
  }
}

// Several blobs widened in one launch (dequant_bf16_many, the executor's grouped widening) equal
// their one-by-one widening, int8 and fp8 mixed; a k that is no multiple of 16 takes one launch
// each and still agrees.
TEST_F(CudaChain, GroupedDequantMatchesOneByOne) {
  struct Spec { DType dt; int64_t n, k; };
  for (const std::vector<Spec>& specs : {std::vector<Spec>{{DType::I8, 37, 64}, {DType::F8_E4M3, 16, 128}, {DType::I8, 3, 32}},
                                         std::vector<Spec>{{DType::I8, 5, 40}, {DType::F8_E4M3, 7, 64}}}) {
    std::vector<void*> blobs, outs;  // freed below
    std::vector<cuda::DequantJob> jobs;
    std::vector<std::vector<uint8_t>> host;
    for (size_t j = 0; j < specs.size(); ++j) {
      const Spec& sp = specs[j];
      std::vector<uint8_t> blob(stored_weight_bytes(sp.dt, {sp.n, sp.k}));
      auto* scales = reinterpret_cast<float*>(blob.data() + quant_scales_offset(sp.n, sp.k));
      std::vector<float> row(static_cast<size_t>(sp.k));
      for (int64_t r = 0; r < sp.n; ++r) {
        for (int64_t c = 0; c < sp.k; ++c) row[size_t(c)] = std::cos(float(j * 1000 + r * sp.k + c)) * float(r + 2);
        scales[r] = quantize_row(row.data(), sp.k, sp.dt, blob.data() + r * sp.k);
      }
      void* db = nullptr;
      void* dout = nullptr;
      ASSERT_EQ(cudaMalloc(&db, blob.size()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dout, size_t(sp.n * sp.k) * 2), cudaSuccess);
      blobs.push_back(db);
      outs.push_back(dout);
      ASSERT_EQ(cudaMemcpy(db, blob.data(), blob.size(), cudaMemcpyHostToDevice), cudaSuccess);
      jobs.push_back(cuda::DequantJob{db, sp.dt, sp.n, sp.k, dout});
      host.push_back(std::move(blob));
    }
    ASSERT_TRUE(cuda::dequant_bf16_many(nullptr, jobs.data(), int(jobs.size())).is_ok());
    for (size_t j = 0; j < specs.size(); ++j) {
      const Spec& sp = specs[j];
      std::vector<uint16_t> got(size_t(sp.n * sp.k));
      ASSERT_EQ(cudaMemcpy(got.data(), outs[j], got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      const auto* scales = reinterpret_cast<const float*>(host[j].data() + quant_scales_offset(sp.n, sp.k));
      int bad = 0;
      for (int64_t i = 0; i < sp.n * sp.k; ++i)
        if (got[size_t(i)] != f32_to_bf16(quant_decode(sp.dt, host[j][size_t(i)]) * scales[i / sp.k])) ++bad;
      EXPECT_EQ(bad, 0) << "job " << j << " " << dtype_name(sp.dt) << " " << sp.n << "x" << sp.k;
    }
    for (void* b : blobs) cudaFree(b);
    for (void* o : outs) cudaFree(o);
  }
  cuda::DequantJob none[9];
  EXPECT_FALSE(cuda::dequant_bf16_many(nullptr, none, 9).is_ok()) << "more than 8 jobs";
}

// A tiny fixture compiled bf16-all with 8-bit matrices (dt) for the CPU or CUDA into tmp, in
// engines of 64 KiB (several engines per stage).
Pi05CompileOptions eight_bit_options(const fs::path& tmp, bool cuda, DType dt) {
  Pi05CompileOptions co;
  co.out = (tmp / (std::string(cuda ? "cuda" : "cpu") + ".vlac")).string();
  co.backend = cuda ? "cuda" : "cpu";
  co.bf16 = true;
  co.bf16_all_matrices = true;
  co.weight_quant = dt;
  co.engine_cap = 64 << 10;
  return co;
}
// The mean over actions (rows of `width`) of the cosine similarity of a and b.
double mean_action_cosine(const std::vector<float>& a, const std::vector<float>& b, size_t width) {
  const size_t rows = b.size() / width;
  double cos = 0;
  for (size_t r = 0; r < rows; ++r) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t j = r * width; j < (r + 1) * width; ++j)
      ab += double(a[j]) * b[j], aa += double(a[j]) * a[j], bb += double(b[j]) * b[j];
    cos += ab / std::sqrt(aa * bb) / double(rows);
  }
  return cos;
}

// int8 and fp8 packages (8-bit matrices, core/quant.h) compiled for CUDA run on the GPU: recorded
// chunks equal the eager run, the memo's weights left in the package give the same actions, and
// the actions agree with the same package compiled for and run on the CPU (bf16-level
// differences, see below) and stay near lerobot fp32 (the issue's cosine bound; max |Δ| printed).
TEST_F(CudaChain, EightBitPackagesAgreeWithTheCpuAndLerobot) {
  for (const char* fx : {"tiny_a", "tiny_b"})
    for (DType dt : {DType::I8, DType::F8_E4M3}) {
      const std::string dir = kFixtures + "/" + fx;
      const std::string name = std::string(fx) + " " + dtype_name(dt);
      std::string tmpl = (fs::temp_directory_path() / "vlac-quant-XXXXXX").string();
      const fs::path tmp = mkdtemp(tmpl.data());
      std::vector<float> out[2];  // cpu, cuda
      auto folder_pol = Pi05Policy::load(dir + "/policy", {});
      ASSERT_TRUE(folder_pol.is_ok());
      auto obs = read_pi05_observation(dir + "/obs.safetensors", folder_pol->model());
      auto noise = read_pi05_noise(dir + "/noise.safetensors", folder_pol->model());
      ASSERT_TRUE(obs.is_ok() && noise.is_ok());
      for (int b = 0; b < 2; ++b) {
        const Pi05CompileOptions co = eight_bit_options(tmp, b == 1, dt);
        auto sum = compile_pi05(dir + "/policy", co);
        ASSERT_TRUE(sum.is_ok()) << name << ": " << sum.status().message();
        // On cuda also with the memo's weights on demand, and with step 0 beside the LM, each
        // lane setting named (its default depends on the precision: pi05_precision::step_overlap_default).
        struct Run {
          const char* on_demand;
          bool overlap;
        };
        for (const Run& r : {Run{"0", false}, Run{"1", false}, Run{"0", true}}) {
          if (!b && (r.on_demand[0] == '1' || r.overlap)) continue;
          setenv("VLAC_ON_DEMAND_WEIGHTS", r.on_demand, 1);
          Pi05PackageOptions po;
          po.backend = b ? "cuda" : "cpu";
          po.step_overlap = r.overlap;
          auto pkg = Pi05PackagePolicy::open(co.out, po);
          ASSERT_TRUE(pkg.is_ok()) << name << ": " << pkg.status().message();
          EXPECT_EQ(pkg->step_overlap(), r.overlap) << name;
          std::vector<float> c(noise->size()), first;
          for (int i = 0; i < 3; ++i) {  // eager, recorded, replayed (on cuda)
            const Status st = pkg->run_chunk(*obs, noise->data(), c.data());
            ASSERT_TRUE(st.is_ok()) << name << ": " << st.message();
            if (i == 0) first = c;
            else EXPECT_EQ(max_abs_diff(c, first), 0.0) << name << " chunk " << i;
          }
          if (!out[b].empty()) {
            EXPECT_EQ(max_abs_diff(first, out[b]), 0.0)
                << name << (r.overlap ? ": step 0 beside the LM" : ": on-demand memo weights");
          }
          out[b] = first;
        }
        unsetenv("VLAC_ON_DEMAND_WEIGHTS");
      }
      const std::vector<float> want = read_f32(dir + "/expected.safetensors", "action_normalized");
      const double gpu_cpu = max_abs_diff(out[1], out[0]), gpu_lr = max_abs_diff(out[1], want);
      const double cos = mean_action_cosine(out[1], want, size_t(folder_pol->model().dims().max_action_dim));
      // The tiny models' K (32-160) is no multiple of 64: every GEMM takes the widened path,
      // bf16(code · scale) per weight where the CPU scales the fp32 sum (measured 0.008-0.018).
      EXPECT_LE(gpu_cpu, 3e-2) << name;
      EXPECT_GE(cos, 0.999) << name;
      std::printf("[ cuda     ] %s package: cuda vs cpu %.3g, vs lerobot fp32 %.3g, mean cosine %.6f\n", name.c_str(),
                  gpu_cpu, gpu_lr, cos);
      fs::remove_all(tmp);
    }
}

// An fp8 package compiled with e4m3 activations ("fp8-w8a8") runs as W8A8 on FP8 tensor cores
// (sm_89+) with no switch: recorded chunks equal the eager run; x's codes written by the fused
// residual norms and GeGLUs (the default) give the same actions, bit for bit, as quantizing in each
// GEMM's launch (VLAC_FP8_FUSED_CODES=0); and the actions stay near the CPU's run of the same
// package (x rounded to e4m3 there too) and lerobot fp32 (loose bounds, the distances printed).
// The tiny models' K of 40 and 160 are no multiple of 16 in places: those GEMMs widen as before.
TEST_F(CudaChain, Fp8PackageRunsAsW8A8) {
  if (cuda::device_compute_capability() < 89) GTEST_SKIP() << "FP8 GEMMs need compute capability 8.9 or later";
  for (const char* fx : {"tiny_a", "tiny_b"}) {
    const std::string dir = kFixtures + "/" + fx;
    std::string tmpl = (fs::temp_directory_path() / "vlac-fp8-XXXXXX").string();
    const fs::path tmp = mkdtemp(tmpl.data());
    auto folder_pol = Pi05Policy::load(dir + "/policy", {});
    ASSERT_TRUE(folder_pol.is_ok());
    auto obs = read_pi05_observation(dir + "/obs.safetensors", folder_pol->model());
    auto noise = read_pi05_noise(dir + "/noise.safetensors", folder_pol->model());
    ASSERT_TRUE(obs.is_ok() && noise.is_ok());
    std::vector<float> cpu, fused, apart;
    for (int b = 0; b < 2; ++b) {
      // Compiled with e4m3 activations (precision "fp8-w8a8"): the CUDA backend runs it as W8A8
      // with no VLAC_FP8_GEMM, the CPU rounds x to e4m3 the same way.
      Pi05CompileOptions co = eight_bit_options(tmp, b == 1, DType::F8_E4M3);
      co.fp8_activations = true;
      auto sum = compile_pi05(dir + "/policy", co);
      ASSERT_TRUE(sum.is_ok()) << fx << ": " << sum.status().message();
      for (const char* norm_codes : {"1", "0"}) {
        if (!b && norm_codes[0] == '0') continue;
        setenv("VLAC_FP8_FUSED_CODES", norm_codes, 1);
        Pi05PackageOptions po;
        po.backend = b ? "cuda" : "cpu";
        auto pkg = Pi05PackagePolicy::open(co.out, po);
        ASSERT_TRUE(pkg.is_ok()) << fx << ": " << pkg.status().message();
        std::vector<float> c(noise->size()), first;
        for (int i = 0; i < 3; ++i) {
          const Status st = pkg->run_chunk(*obs, noise->data(), c.data());
          ASSERT_TRUE(st.is_ok()) << fx << ": " << st.message();
          if (i == 0) first = c;
          else EXPECT_EQ(max_abs_diff(c, first), 0.0) << fx << " chunk " << i;
        }
        (!b ? cpu : norm_codes[0] == '1' ? fused : apart) = first;
        unsetenv("VLAC_FP8_FUSED_CODES");
      }
    }
    EXPECT_EQ(max_abs_diff(fused, apart), 0.0) << fx << ": codes from the norms against codes in the GEMMs' launches";
    const std::vector<float> want = read_f32(dir + "/expected.safetensors", "action_normalized");
    const double cos = mean_action_cosine(fused, want, size_t(folder_pol->model().dims().max_action_dim));
    const double gpu_cpu = max_abs_diff(fused, cpu), gpu_lr = max_abs_diff(fused, want);
    std::printf("[ cuda     ] %s fp8-w8a8 package: cuda vs cpu (both W8A8) %.3g, vs lerobot fp32 %.3g, mean cosine %.6f\n",
                fx, gpu_cpu, gpu_lr, cos);
    EXPECT_LE(gpu_cpu, 0.5) << fx;  // a sanity bound (printed above): one x code apart flips a rounding
    EXPECT_GE(cos, 0.995) << fx;
    fs::remove_all(tmp);
  }
}
