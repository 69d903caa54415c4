// `vlac compile --dtype int8 --calibrate OBS`: GPTQ-rounded 8-bit packages against lerobot fp32
// on the tiny fixtures, calibrated on held-out observations (never the one measured), and the
// flags' errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"
#include "tensor_file_util.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "ir/quant_calib.h"
#include "package/package.h"

namespace vlac {
namespace {

using namespace clitest;
using testutil::read_f32;

const std::string kFixtures = std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/pi05";

std::string policy_of(const std::string& fx) { return kFixtures + "/" + fx + "/policy"; }

TempDir& dir() {
  static TempDir d("calibrate");
  return d;
}

// Held-out observations: the fixture observation's tensors redrawn as tools/make_pi05_fixtures.py
// draws them (images uniform in [0, 1), state uniform in [-1, 1), the prompt's real tokens after
// BOS uniform over [3, vocab), the same mask), from another generator and seed. The same
// distribution as the measured observation, never the observation itself.
std::vector<std::string> held_out_observations(const std::string& fx, int n) {
  auto obs = SafetensorsFile::open(kFixtures + "/" + fx + "/obs.safetensors");
  auto model = SafetensorsFile::open(policy_of(fx) + "/model.safetensors");
  EXPECT_TRUE(obs.is_ok() && model.is_ok());
  if (!obs.is_ok() || !model.is_ok()) return {};
  int64_t vocab = 0;
  for (const TensorInfo& t : model->tensors())
    if (t.name.find("language_model.embed_tokens.weight") != std::string::npos) vocab = t.shape[0];
  EXPECT_GT(vocab, 3);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::mt19937_64 rng(1000 + uint64_t(i));
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    std::vector<TensorSpec> specs;
    std::string bytes;
    const TensorInfo* m = obs->find("observation.language.attention_mask");
    for (const TensorInfo& t : obs->tensors()) {
      specs.push_back({t.name, t.dtype, t.shape});
      std::string b(reinterpret_cast<const char*>(obs->data(t)), t.nbytes());
      if (t.name.rfind("observation.images.", 0) == 0 || t.name == "observation.state") {
        EXPECT_EQ(t.dtype, DType::F32) << t.name;
        const bool state = t.name == "observation.state";
        for (size_t j = 0; j < b.size() / 4; ++j) {
          const float v = state ? unit(rng) * 2.0f - 1.0f : unit(rng);
          std::memcpy(&b[j * 4], &v, 4);
        }
      } else if (t.name == "observation.language.tokens") {
        EXPECT_EQ(t.dtype, DType::I64);
        std::uniform_int_distribution<int64_t> id(3, vocab - 1);
        for (size_t j = 1; j < b.size() / 8; ++j) {
          const bool real = m && obs->data(*m)[j] != 0;
          const int64_t v = real ? id(rng) : 0;
          std::memcpy(&b[j * 8], &v, 8);
        }
      }
      bytes += b;
    }
    const std::string path = dir().file(fx + "-cal" + std::to_string(i) + ".safetensors");
    auto w = SafetensorsWriter::create(path, specs);
    EXPECT_TRUE(w.is_ok());
    if (!w.is_ok()) return {};
    EXPECT_TRUE(w->write(bytes.data(), bytes.size()).is_ok());
    EXPECT_TRUE(w->finish().is_ok());
    out.push_back(path);
  }
  return out;
}

// Bytes of every weight the package's engines store.
uint64_t weight_bytes(const std::string& path) {
  auto pkg = Package::open(path);
  EXPECT_TRUE(pkg.is_ok()) << pkg.status().message();
  uint64_t n = 0;
  if (pkg.is_ok())
    for (const auto& e : pkg->manifest().engines)
      for (const auto& w : e.extra["weights"]) n += w["bytes"].get<uint64_t>();
  return n;
}

struct Distance {
  double max = 0, rms = 0;
};

// max |a − b| and the RMS of a − b over the chunk.
Distance distance(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  Distance d;
  size_t n = 0;
  for (size_t j = 0; j < std::min(a.size(), b.size()); ++j) {
    const double e = std::fabs(double(a[j]) - b[j]);
    d.max = std::max(d.max, e);
    d.rms += e * e;
    ++n;
  }
  d.rms = n ? std::sqrt(d.rms / double(n)) : 0.0;
  return d;
}

TEST(CalibrateCli, GptqInt8StaysWithinTwiceTheBf16PackagesDistance) {
  for (const char* fx : {"tiny_a", "tiny_b", "tiny_b_absent_cam"}) {
    SCOPED_TRACE(fx);
    const std::string d = kFixtures + "/" + fx;
    const std::vector<float> want = read_f32(d + "/expected.safetensors", "action_normalized");
    const std::vector<std::string> cal = held_out_observations(fx, 4);
    ASSERT_EQ(cal.size(), 4u);
    std::map<std::string, Distance> dist;
    for (const char* kind : {"bf16-all", "int8", "int8-gptq", "int8-gptq-index"}) {
      const std::string k = kind;
      const std::string pkg = dir().file(std::string(fx) + "-" + kind + ".vlac");
      std::vector<std::string> args = {"compile", policy_of(fx), "-o", pkg, "--quiet",
                                       "--dtype", k == "bf16-all" ? "bf16-all" : "int8"};
      if (k.rfind("int8-gptq", 0) == 0)
        for (const std::string& c : cal) args.insert(args.end(), {"--calibrate", c});
      if (k == "int8-gptq-index") args.insert(args.end(), {"--calibrate-order", "index"});
      Proc p = run_vlac(args);
      ASSERT_EQ(p.rc, 0) << p.out;
      const std::string out = dir().file(std::string(fx) + "-" + kind + ".safetensors");
      Proc r = run_vlac({"run", pkg, "--obs", d + "/obs.safetensors", "--noise", d + "/noise.safetensors", "--out", out,
                         "--quiet"});
      ASSERT_EQ(r.rc, 0) << r.out;
      dist[kind] = distance(read_f32(out, "action_normalized"), want);
      std::printf("[ gptq     ] %-17s %-15s vs lerobot fp32: max|d| %.4g (%.2fx bf16-all), rms %.4g (%.2fx)\n", fx, kind,
                  dist[kind].max, dist[kind].max / dist["bf16-all"].max, dist[kind].rms,
                  dist[kind].rms / dist["bf16-all"].rms);
    }
    // Issue 14's bound (max |Δ| at most 2x the bf16 package's) on every fixture and path, where
    // round to nearest reaches 1.9-2.45x on tiny_b's model, and a lower RMS than nearest's. int8
    // calibrates at damp 1 by default (ir::default_gptq_damp): at GPTQ's usual 0.01, tiny_a (K of
    // 32-48) overfit the four observations, its worst action 2.1-2.4x in two of six calibration
    // draws (docs/quantization.md, session 21); at 1 it stayed at 1.2-1.8x in all six.
    for (const char* g : {"int8-gptq", "int8-gptq-index"}) {
      EXPECT_LT(dist[g].rms, dist["int8"].rms) << g;
      EXPECT_LE(dist[g].max, 2.0 * dist["bf16-all"].max) << g;
    }
    // Same scales and bytes: the calibration chooses codes, not the format. The manifest says so.
    auto pkg = Package::open(dir().file(std::string(fx) + "-int8-gptq.vlac"));
    ASSERT_TRUE(pkg.is_ok()) << pkg.status().message();
    const nlohmann::json& meta = pkg->manifest().metadata;
    ASSERT_TRUE(meta.contains("calibration")) << meta.dump();
    EXPECT_EQ(meta["calibration"]["method"], "gptq");
    EXPECT_EQ(meta["calibration"]["observations"].size(), 4u);
    EXPECT_EQ(meta["calibration"]["damp"].get<double>(), ir::default_gptq_damp(DType::I8));
    EXPECT_GT(meta["calibration"]["tensors"].get<int>(), 0);
    Proc ins = run_vlac({"inspect", dir().file(std::string(fx) + "-int8-gptq.vlac")});
    EXPECT_EQ(ins.rc, 0) << ins.out;
    EXPECT_NE(ins.out.find("policy: pi05, precision int8-weights"), std::string::npos) << ins.out;
    EXPECT_NE(ins.out.find("calibration: gptq on 4 observations, damp 1, block"), std::string::npos) << ins.out;
    EXPECT_EQ(weight_bytes(dir().file(std::string(fx) + "-int8-gptq.vlac")),
              weight_bytes(dir().file(std::string(fx) + "-int8.vlac")));
  }
}

// The rows are rounded on --threads threads; the package is the same bytes whatever the count.
TEST(CalibrateCli, ThreadCountDoesNotChangeThePackage) {
  const std::vector<std::string> cal = held_out_observations("tiny_b", 2);
  ASSERT_EQ(cal.size(), 2u);
  std::vector<std::string> bytes;
  for (const char* threads : {"1", "3"}) {
    const std::string pkg = dir().file(std::string("threads") + threads + ".vlac");
    std::vector<std::string> args = {"compile", policy_of("tiny_b"), "-o", pkg, "--dtype", "fp8", "--threads", threads,
                                     "--calibrate-order", "index", "--calibrate-block", "32", "--quiet"};
    for (const std::string& c : cal) args.insert(args.end(), {"--calibrate", c});
    Proc p = run_vlac(args);
    ASSERT_EQ(p.rc, 0) << p.out;
    bytes.push_back(read_file(pkg));
  }
  EXPECT_FALSE(bytes[0].empty());
  EXPECT_TRUE(bytes[0] == bytes[1]);
}

// A compile of tiny fixture `fx` into `out` (with `more` arguments) that must be refused: exit `rc`
// (0: any non-zero), each of `says` in its output, and no package written.
void expect_refused(const char* fx, const std::string& out, const std::vector<std::string>& more, int rc,
                    const std::vector<std::string>& says) {
  std::vector<std::string> args = {"compile", policy_of(fx), "-o", out, "--quiet"};
  args.insert(args.end(), more.begin(), more.end());
  const Proc p = run_vlac(args);
  const std::string what = more.empty() ? std::string() : more.front() + " ... " + more.back();
  if (rc) EXPECT_EQ(p.rc, rc) << what << ": " << p.out;
  else EXPECT_NE(p.rc, 0) << what << ": " << p.out;
  for (const std::string& s : says) EXPECT_NE(p.out.find(s), std::string::npos) << what << ": " << p.out;
  EXPECT_FALSE(exists(out)) << what;
}

TEST(CalibrateCli, BadCalibrationInputIsOneClearErrorAndNoPackage) {
  const std::string out = dir().file("bad.vlac");
  const std::string obs_a = kFixtures + "/tiny_a/obs.safetensors";
  // Not with a dtype it cannot change.
  expect_refused("tiny_a", out, {"--dtype", "bf16-all", "--calibrate", obs_a}, 2,
                 {"--calibrate goes with --dtype int8 or fp8"});
  // A missing observation names the file.
  expect_refused("tiny_a", out, {"--dtype", "int8", "--calibrate", dir().file("nope.safetensors")}, 0,
                 {"nope.safetensors"});
  // An observation of another model (tiny_b's cameras for tiny_a) names the file and the problem.
  expect_refused("tiny_a", out, {"--dtype", "int8", "--calibrate", kFixtures + "/tiny_b/obs.safetensors"}, 0,
                 {"--calibrate", "tiny_b/obs.safetensors"});
  // A damping given must be above 0 (not given, the dtype's default: ir::default_gptq_damp).
  for (const char* d : {"0", "-1", "nan"})
    expect_refused("tiny_a", out, {"--dtype", "int8", "--calibrate", obs_a, "--calibrate-damp", d}, 2,
                   {"--calibrate-damp must be above 0"});
}

// --calibrate-save writes the run's statistics; --calibrate-stats rounds from them without a run.
// The statistics depend on neither the dtype nor the damping, so one run serves int8 and fp8: each
// package is the same bytes as the one calibrated directly; a damping given still applies.
TEST(CalibrateCli, SavedStatisticsServeEveryDtype) {
  const std::vector<std::string> cal = held_out_observations("tiny_b", 1);
  ASSERT_EQ(cal.size(), 1u);
  const std::string stats = dir().file("tiny_b.stats.safetensors");
  auto compile = [&](const std::string& out, const char* dtype, std::vector<std::string> more) {
    std::vector<std::string> args = {"compile", policy_of("tiny_b"), "-o", out, "--dtype", dtype, "--quiet"};
    args.insert(args.end(), more.begin(), more.end());
    Proc p = run_vlac(args);
    EXPECT_EQ(p.rc, 0) << p.out;
    return read_file(out);
  };
  const std::string int8_run = compile(dir().file("saved-int8-run.vlac"), "int8",
                                       {"--calibrate", cal[0], "--calibrate-save", stats});
  ASSERT_TRUE(exists(stats));
  const std::string int8_file = compile(dir().file("saved-int8-file.vlac"), "int8", {"--calibrate-stats", stats});
  EXPECT_FALSE(int8_run.empty());
  EXPECT_TRUE(int8_run == int8_file) << "int8 from the saved statistics differs from the run's package";
  const std::string fp8_run = compile(dir().file("saved-fp8-run.vlac"), "fp8", {"--calibrate", cal[0]});
  const std::string fp8_file = compile(dir().file("saved-fp8-file.vlac"), "fp8", {"--calibrate-stats", stats});
  EXPECT_TRUE(fp8_run == fp8_file) << "fp8 from the saved statistics differs from the run's package";
  const std::string damped = compile(dir().file("saved-int8-damp.vlac"), "int8",
                                     {"--calibrate-stats", stats, "--calibrate-damp", "0.01"});
  EXPECT_FALSE(damped == int8_file) << "the damping did not reach the rounding";
  Proc p = run_vlac({"inspect", dir().file("saved-fp8-file.vlac")});
  EXPECT_EQ(p.rc, 0) << p.out;
  EXPECT_NE(p.out.find("calibration: gptq on 1 observation"), std::string::npos) << p.out;
}

TEST(CalibrateCli, BadStatisticsFileIsOneClearErrorAndNoPackage) {
  const std::string stats = dir().file("tiny_a.stats.safetensors");
  Proc p = run_vlac({"compile", policy_of("tiny_a"), "-o", dir().file("tiny_a-stats.vlac"), "--dtype", "int8",
                     "--calibrate", kFixtures + "/tiny_a/obs.safetensors", "--calibrate-save", stats, "--quiet"});
  ASSERT_EQ(p.rc, 0) << p.out;
  const std::string out = dir().file("bad-stats.vlac");
  // Another policy's statistics: the file, the weight and both widths.
  expect_refused("tiny_b", out, {"--dtype", "int8", "--calibrate-stats", stats}, 2,
                 {stats, "inputs, but this policy's matrix has"});
  // A safetensors file of something else.
  expect_refused("tiny_a", out, {"--dtype", "int8", "--calibrate-stats", kFixtures + "/tiny_a/obs.safetensors"}, 0,
                 {"tiny_a/obs.safetensors: not a vlac calibration statistics file"});
  // Flags that do not go together.
  const std::vector<std::vector<std::string>> wrong = {
      {"--calibrate-stats", stats, "--calibrate", kFixtures + "/tiny_a/obs.safetensors"},
      {"--calibrate-stats", stats, "--calibrate-block", "32"},
      {"--calibrate-save", dir().file("nowhere.safetensors")}};
  for (std::vector<std::string> more : wrong) {
    more.insert(more.begin(), {"--dtype", "int8"});
    expect_refused("tiny_a", out, more, 2, {"--calibrate"});
  }
  EXPECT_FALSE(exists(dir().file("nowhere.safetensors")));
}

}  // namespace
}  // namespace vlac
