// `vlac run` against lerobot's own reference fixtures (tests/fixtures/pi05): the library call on
// every case (fp32 within 1e-4, bf16 within 2e-2), the CLI end to end, bad observations and
// configs (exit 2 naming the key), and `vlac inspect --graph`.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "tensor_file_util.h"
#include "io/safetensors_writer.h"
#include "policy/pi05_policy.h"

namespace fs = std::filesystem;
using namespace vlac;
using vlac::testutil::read_f32;

// Counts every operator new in this test binary and the largest request: the denoise loop must
// allocate no buffer (oneDNN's matmul execute builds a few small argument maps per call, which we
// cannot avoid through its API; those stay small and constant per step). Not under
// AddressSanitizer, which owns operator new itself (the count is then not checked).
static std::atomic<int64_t> g_news{0};
static std::atomic<int64_t> g_max_new{0};
#if defined(__SANITIZE_ADDRESS__)
#define VLAC_COUNT_NEW 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define VLAC_COUNT_NEW 0
#endif
#endif
#ifndef VLAC_COUNT_NEW
#define VLAC_COUNT_NEW 1
#endif
#if VLAC_COUNT_NEW
#if !defined(__clang__)  // GCC sees free() of operator new's memory; here new *is* malloc
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  int64_t seen = g_max_new.load(std::memory_order_relaxed);
  while (int64_t(n) > seen && !g_max_new.compare_exchange_weak(seen, int64_t(n))) {
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace {

const std::string kFixtures = std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/pi05";

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "vlac-run-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

// Runs a fixture case through the library; returns action_normalized.
std::vector<float> run_case(const std::string& policy, const std::string& obs_dir, Pi05Precision p) {
  Pi05PolicyOptions o;
  o.precision = p;
  auto pol = Pi05Policy::load(policy, o);
  EXPECT_TRUE(pol.is_ok()) << pol.status().message();
  if (!pol.is_ok()) return {};
  auto obs = read_pi05_observation(obs_dir + "/obs.safetensors", pol->model());
  EXPECT_TRUE(obs.is_ok()) << obs.status().message();
  auto noise = read_pi05_noise(obs_dir + "/noise.safetensors", pol->model());
  EXPECT_TRUE(noise.is_ok()) << noise.status().message();
  if (!obs.is_ok() || !noise.is_ok()) return {};
  std::vector<float> action(noise->size());
  Status st = pol->run_prefix(*obs);
  EXPECT_TRUE(st.is_ok()) << st.message();
  st = pol->denoise(noise->data(), action.data());
  EXPECT_TRUE(st.is_ok()) << st.message();
  return action;
}

struct Proc {
  int rc = -1;
  std::string out;  // stdout + stderr
};
Proc run_vlac(const std::string& args) {
  Proc p;
  std::string cmd = std::string(VLAC_BINARY) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return p;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) p.out.append(buf, n);
  int st = pclose(f);
  p.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return p;
}

}  // namespace

TEST(RunFixtures, Fp32CasesMatchLerobot) {
  for (const char* c : {"tiny_a", "tiny_b", "tiny_b_absent_cam"}) {
    const std::string dir = kFixtures + "/" + c;
    std::vector<float> got = run_case(dir + "/policy", dir, Pi05Precision::Fp32);
    std::vector<float> want = read_f32(dir + "/expected.safetensors", "action_normalized");
    const double d = max_abs_diff(got, want);
    EXPECT_LE(d, 1e-4) << c;
    std::printf("[ fixture  ] %s fp32: max |d action_normalized| = %.3g\n", c, d);
  }
}

// Layer by layer (llm.c style): every intermediate vlac records that the fixture also holds.
// Prefix tensors are compared on the rows lerobot marks valid (vlac's prefix is compact).
TEST(RunFixtures, IntermediatesMatchLayerByLayer) {
  for (const char* c : {"tiny_a", "tiny_b", "tiny_b_absent_cam"}) {
    const std::string dir = kFixtures + "/" + c;
    Pi05PolicyOptions o;
    o.precision = Pi05Precision::Fp32;
    o.record_intermediates = true;
    auto pol = Pi05Policy::load(dir + "/policy", o);
    ASSERT_TRUE(pol.is_ok()) << pol.status().message();
    auto obs = read_pi05_observation(dir + "/obs.safetensors", pol->model());
    auto noise = read_pi05_noise(dir + "/noise.safetensors", pol->model());
    ASSERT_TRUE(obs.is_ok() && noise.is_ok());
    std::vector<float> action(noise->size());
    ASSERT_TRUE(pol->run_prefix(*obs).is_ok());
    ASSERT_TRUE(pol->denoise(noise->data(), action.data()).is_ok());
    auto exp = SafetensorsFile::open(dir + "/expected.safetensors");
    ASSERT_TRUE(exp.is_ok());
    const TensorInfo* pm = exp->find("prefix.pad_mask");
    ASSERT_NE(pm, nullptr);
    std::vector<int64_t> valid_rows;
    for (int64_t i = 0; i < pm->shape[0]; ++i)
      if (exp->data(*pm)[i]) valid_rows.push_back(i);
    int compared = 0;
    for (const auto& t : pol->intermediates().tensors) {
      const TensorInfo* e = exp->find(t.name);
      if (!e || e->dtype != DType::F32) continue;
      std::vector<float> want(size_t(e->numel()));
      std::memcpy(want.data(), exp->data(*e), e->nbytes());
      if (t.name.rfind("prefix", 0) == 0 && e->shape[0] == pm->shape[0]) {
        const size_t cols = want.size() / size_t(e->shape[0]);
        std::vector<float> rows;
        for (int64_t r : valid_rows) rows.insert(rows.end(), want.begin() + r * cols, want.begin() + (r + 1) * cols);
        want = rows;
      }
      std::vector<float> got(t.bytes.size() / 4);
      std::memcpy(got.data(), t.bytes.data(), t.bytes.size());
      EXPECT_LE(max_abs_diff(got, want), 1e-4) << c << ": " << t.name;
      ++compared;
    }
    EXPECT_GE(compared, 30) << c;
  }
}

TEST(RunFixtures, Bf16CaseMatchesLerobotBf16) {
  const std::string dir = kFixtures + "/tiny_a_bf16";
  std::vector<float> got = run_case(dir + "/policy", dir, Pi05Precision::Bf16);
  const double d = max_abs_diff(got, read_f32(dir + "/expected.safetensors", "action_normalized"));
  EXPECT_LE(d, 2e-2);
  std::printf("[ fixture  ] tiny_a_bf16 --dtype bf16 vs lerobot bf16: %.3g\n", d);
  // The config says bfloat16: FromConfig picks bf16 too.
  std::vector<float> same = run_case(dir + "/policy", dir, Pi05Precision::FromConfig);
  EXPECT_EQ(max_abs_diff(got, same), 0.0);
}

TEST(RunFixtures, Fp32WeightsRunInBf16) {
  // tiny_a's fp32 weights converted to bf16 at load: compare with both of lerobot's runs.
  const std::string dir = kFixtures + "/tiny_a";
  std::vector<float> got = run_case(dir + "/policy", dir, Pi05Precision::Bf16);
  const double vs_fp32 = max_abs_diff(got, read_f32(dir + "/expected.safetensors", "action_normalized"));
  const double vs_bf16 =
      max_abs_diff(got, read_f32(kFixtures + "/tiny_a_bf16/expected.safetensors", "action_normalized"));
  EXPECT_LE(vs_fp32, 2e-2);
  EXPECT_LE(vs_bf16, 2e-2);
  std::printf("[ fixture  ] tiny_a --dtype bf16: vs lerobot fp32 %.3g, vs lerobot bf16 %.3g\n", vs_fp32, vs_bf16);
}

TEST(RunFixtures, DenoiseLoopAllocatesNoBuffers) {
  const std::string dir = kFixtures + "/tiny_b";
  for (Pi05Precision p : {Pi05Precision::Fp32, Pi05Precision::Bf16}) {
    Pi05PolicyOptions o;
    o.precision = p;
    auto pol = Pi05Policy::load(dir + "/policy", o);
    ASSERT_TRUE(pol.is_ok()) << pol.status().message();
    auto obs = read_pi05_observation(dir + "/obs.safetensors", pol->model());
    auto noise = read_pi05_noise(dir + "/noise.safetensors", pol->model());
    ASSERT_TRUE(obs.is_ok() && noise.is_ok());
    // Three chunks from the same observation: the first also pays oneDNN's one-time setup (its
    // sgemm JIT-generates kernels on first use in the process); the next two are the steady state:
    // no buffer-sized allocation, the same small bookkeeping count each time, the same chunk.
    std::vector<float> a(noise->size()), b(noise->size());
    int64_t news[3] = {0, 0, 0}, largest[3] = {0, 0, 0};
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(pol->run_prefix(*obs).is_ok());
      const int64_t before = g_news.load();
      g_max_new = 0;
      ASSERT_TRUE(pol->denoise(noise->data(), i == 0 ? a.data() : b.data()).is_ok());
      news[i] = g_news.load() - before, largest[i] = g_max_new.load();
    }
    if (VLAC_COUNT_NEW) {
      EXPECT_LT(largest[1], 1024) << "a buffer-sized allocation in the denoise loop";
      EXPECT_LT(largest[2], 1024) << "a buffer-sized allocation in the denoise loop";
      EXPECT_EQ(news[1], news[2]) << "allocations accumulate from chunk to chunk";
    }
    std::printf("[ alloc    ] denoise loop: %lld operator new calls (largest %lld B) in the first chunk, %lld "
                "(largest %lld B) in each next\n",
                (long long)news[0], (long long)largest[0], (long long)news[2], (long long)largest[2]);
    EXPECT_EQ(max_abs_diff(a, b), 0.0);
  }
}

TEST(RunFixtures, CliRunWritesActionsAndIntermediates) {
  TempDir t;
  const std::string dir = kFixtures + "/tiny_b_absent_cam";
  const std::string out = (t.path / "out.safetensors").string();
  const std::string dump = (t.path / "dump").string();
  const std::string report = (t.path / "report.json").string();
  Proc p = run_vlac("run " + dir + "/policy --obs " + dir + "/obs.safetensors --noise " + dir +
                    "/noise.safetensors --out " + out + " --dump-intermediates " + dump + " --report-json " + report);
  ASSERT_EQ(p.rc, 0) << p.out;
  const double d = max_abs_diff(read_f32(out, "action_normalized"),
                                read_f32(dir + "/expected.safetensors", "action_normalized"));
  EXPECT_LE(d, 1e-4);
  // Intermediates carry the fixture names; compare the first velocity and an image-token block.
  const std::string inter = dump + "/intermediates.safetensors";
  EXPECT_LE(max_abs_diff(read_f32(inter, "step.0.velocity"), read_f32(dir + "/expected.safetensors", "step.0.velocity")),
            1e-4);
  const std::string cam = "image_tokens.observation.images.cam_right_wrist";
  EXPECT_LE(max_abs_diff(read_f32(inter, cam), read_f32(dir + "/expected.safetensors", cam)), 1e-4);
  // The report has the three metered phases.
  std::ifstream rf(report);
  nlohmann::json r = nlohmann::json::parse(rf, nullptr, false);
  ASSERT_FALSE(r.is_discarded());
  std::string phases;
  for (const auto& ph : r["phases"]) phases += ph["name"].get<std::string>() + ",";
  EXPECT_NE(phases.find("load,prefix,denoise"), std::string::npos) << phases;
}

TEST(RunFixtures, SeededNoiseIsDeterministic) {
  TempDir t;
  const std::string dir = kFixtures + "/tiny_a";
  const std::string a = (t.path / "a.safetensors").string(), b = (t.path / "b.safetensors").string();
  ASSERT_EQ(run_vlac("run " + dir + "/policy --obs " + dir + "/obs.safetensors --seed 7 --quiet --out " + a).rc, 0);
  ASSERT_EQ(run_vlac("run " + dir + "/policy --obs " + dir + "/obs.safetensors --seed 7 --quiet --out " + b).rc, 0);
  EXPECT_EQ(max_abs_diff(read_f32(a, "action_normalized"), read_f32(b, "action_normalized")), 0.0);
  std::vector<float> n = pi05_gaussian_noise(1, 100000);
  double mean = 0, var = 0;
  for (float v : n) mean += v;
  mean /= double(n.size());
  for (float v : n) var += (v - mean) * (v - mean);
  var /= double(n.size());
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(var, 1.0, 0.02);
}

TEST(RunFixtures, BadObservationsExit2NamingTheKey) {
  TempDir t;
  const std::string dir = kFixtures + "/tiny_a";
  auto src = SafetensorsFile::open(dir + "/obs.safetensors");
  ASSERT_TRUE(src.is_ok());
  // Writes obs.safetensors without `drop` and with `reshape` given a new shape (same bytes).
  auto write_obs = [&](const std::string& name, const std::string& drop, const std::string& reshape,
                       std::vector<int64_t> shape) {
    std::vector<TensorSpec> specs;
    std::vector<const TensorInfo*> keep;
    for (const auto& ti : src->tensors()) {
      if (ti.name == drop) continue;
      TensorSpec s{ti.name, ti.dtype, ti.shape};
      if (ti.name == reshape) s.shape = shape;
      specs.push_back(s);
      keep.push_back(&ti);
    }
    const std::string path = (t.path / name).string();
    auto w = SafetensorsWriter::create(path, specs);
    EXPECT_TRUE(w.is_ok());
    for (const auto* ti : keep) EXPECT_TRUE(w->write(src->data(*ti), ti->nbytes()).is_ok());
    EXPECT_TRUE(w->finish().is_ok());
    return path;
  };
  const std::string out = (t.path / "out.safetensors").string();
  const std::string no_tok = write_obs("no_tok.safetensors", "observation.language.tokens", "", {});
  Proc p = run_vlac("run " + dir + "/policy --obs " + no_tok + " --out " + out);
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find("observation.language.tokens"), std::string::npos) << p.out;
  const std::string bad_img =
      write_obs("bad_img.safetensors", "", "observation.images.base_0_rgb", {1, 12, 28, 28});  // any size is resized; 12 channels is no image
  p = run_vlac("run " + dir + "/policy --obs " + bad_img + " --out " + out);
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find("observation.images.base_0_rgb"), std::string::npos) << p.out;
  EXPECT_FALSE(fs::exists(out));
  // Every camera absent: lerobot refuses too.
  std::string no_cam = write_obs("no_cam0.safetensors", "observation.images.base_0_rgb", "", {});
  src = SafetensorsFile::open(no_cam);
  ASSERT_TRUE(src.is_ok());
  no_cam = write_obs("no_cam.safetensors", "observation.images.left_wrist_0_rgb", "", {});
  p = run_vlac("run " + dir + "/policy --obs " + no_cam + " --out " + out);
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find("no camera"), std::string::npos) << p.out;
  // Wrong noise shape.
  const std::string noise = (t.path / "noise.safetensors").string();
  {
    auto w = SafetensorsWriter::create(noise, {{"noise", DType::F32, {8, 6}}});
    ASSERT_TRUE(w.is_ok());
    std::vector<float> z(48, 0.0f);
    ASSERT_TRUE(w->write(z.data(), z.size() * 4).is_ok());
    ASSERT_TRUE(w->finish().is_ok());
  }
  p = run_vlac("run " + dir + "/policy --obs " + dir + "/obs.safetensors --noise " + noise + " --out " + out);
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find("'noise'"), std::string::npos) << p.out;
  p = run_vlac("run " + dir + "/policy --obs " + dir + "/obs.safetensors --dtype fp16 --out " + out);
  EXPECT_EQ(p.rc, 2) << p.out;
}

TEST(RunFixtures, UnsupportedConfigExit2) {
  TempDir t;
  const std::string dir = kFixtures + "/tiny_a";
  fs::create_directories(t.path / "policy");
  fs::create_symlink(fs::absolute(dir + "/policy/model.safetensors"), t.path / "policy" / "model.safetensors");
  std::ifstream in(dir + "/policy/config.json");
  nlohmann::ordered_json c = nlohmann::ordered_json::parse(in);
  c["use_visual_memory"] = true;
  std::ofstream(t.path / "policy" / "config.json") << c.dump(2);
  Proc p = run_vlac("run " + (t.path / "policy").string() + " --obs " + dir + "/obs.safetensors --out " +
                    (t.path / "out.safetensors").string());
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find("use_visual_memory"), std::string::npos) << p.out;
}

TEST(RunFixtures, InspectGraphShowsEveryNode) {
  const std::string dir = kFixtures + "/tiny_a/policy";
  Proc p = run_vlac("inspect --graph " + dir + " --quiet");
  ASSERT_EQ(p.rc, 0) << p.out;
  auto pol = Pi05Model::load(dir);
  ASSERT_TRUE(pol.is_ok());
  auto pg = pol->build_prefix(pol->nominal_prefix());
  auto sg = pol->build_step(48);
  ASSERT_TRUE(pg.is_ok() && sg.is_ok());
  for (const ir::Graph* g : {&pg->graph, &sg->graph})
    for (const auto& n : g->nodes()) {
      if (n.op == ir::OpKind::Weight || n.op == ir::OpKind::Input) continue;
      const std::string line = n.name + "  ";
      EXPECT_NE(p.out.find(line), std::string::npos) << n.name;
    }
  EXPECT_NE(p.out.find("lm.1.k_proj"), std::string::npos);
  EXPECT_NE(p.out.find("f32[48, 1, 16]"), std::string::npos);  // prefix K/V of the full prefix
  EXPECT_NE(p.out.find("action_out_proj"), std::string::npos);
  EXPECT_EQ(p.out.find("lm_head"), std::string::npos);
}
