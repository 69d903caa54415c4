// lerobot's own processor pipelines (tests/fixtures/pi05/pipe_*) against vlac: tokens, prompt,
// normalized state and processed images equal lerobot's; `action` within 1e-4, through the library
// and the CLI; pre-tokenized observations keep working; bad observations get one clear error.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "policy/pi05_observation.h"
#include "policy/pi05_policy.h"
#include "policy/pi05_processor.h"
#include "tensor_file_util.h"

namespace fs = std::filesystem;
using namespace vlac;
using vlac::testutil::read_tensor;

namespace {

const std::string kFixtures = std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/pi05";
const char* kPipeCases[] = {"pipe_b_quantiles", "pipe_b_meanstd_relative", "pipe_a_truncated_relative"};

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "vlac-proc-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string meta(const std::string& path, const std::string& key) {
  auto f = SafetensorsFile::open(path);
  if (!f.is_ok()) return {};
  auto it = f->metadata().find(key);
  return it == f->metadata().end() ? std::string() : it->second;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return a.size() == b.size() ? d : 1e30;
}

struct Proc {
  int rc = -1;
  std::string out;
};
Proc run_vlac(const std::string& args) {
  Proc p;
  FILE* f = popen((std::string(VLAC_BINARY) + " " + args + " 2>&1").c_str(), "r");
  if (!f) return p;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) p.out.append(buf, n);
  const int st = pclose(f);
  p.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return p;
}

// Copies `src` (a safetensors file) to `dst` with tensors dropped/replaced and metadata changed.
struct Edit {
  std::string drop;
  std::string replace;                 // tensor to replace
  TensorSpec spec;                     // its new spec (name ignored)
  std::vector<uint8_t> bytes;          // its new bytes
  std::map<std::string, std::string> metadata;
  bool keep_metadata = true;
};
std::string write_edited(const std::string& src, const std::string& dst, const Edit& e) {
  auto f = SafetensorsFile::open(src);
  EXPECT_TRUE(f.is_ok());
  std::vector<TensorSpec> specs;
  std::vector<std::pair<const uint8_t*, size_t>> data;
  for (const auto& t : f->tensors()) {
    if (t.name == e.drop) continue;
    if (t.name == e.replace) {
      TensorSpec s = e.spec;
      s.name = t.name;
      specs.push_back(s);
      data.emplace_back(e.bytes.data(), e.bytes.size());
    } else {
      specs.push_back({t.name, t.dtype, t.shape});
      data.emplace_back(f->data(t), t.nbytes());
    }
  }
  std::map<std::string, std::string> md = e.keep_metadata ? f->metadata() : std::map<std::string, std::string>{};
  for (const auto& [k, v] : e.metadata) md[k] = v;
  auto w = SafetensorsWriter::create(dst, specs, md);
  EXPECT_TRUE(w.is_ok()) << w.status().message();
  for (const auto& [p, n] : data) EXPECT_TRUE(w->write(p, n).is_ok());
  EXPECT_TRUE(w->finish().is_ok());
  return dst;
}

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

// The preprocessor alone: tokens, mask, prompt, normalized state and images equal lerobot's.
TEST(PipelineFixtures, PreprocessingEqualsLerobot) {
  for (const char* c : kPipeCases) {
    const std::string dir = kFixtures + "/" + c;
    const std::string exp = dir + "/expected.safetensors";
    auto cfg = parse_pi05_config(dir + "/policy/config.json");
    ASSERT_TRUE(cfg.is_ok()) << cfg.status().message();
    auto proc = load_pi05_processor(dir + "/policy");
    ASSERT_TRUE(proc.is_ok()) << proc.status().message();
    auto obs = read_pi05_observation(dir + "/obs.safetensors", *cfg, 3, &*proc, "");
    ASSERT_TRUE(obs.is_ok()) << obs.status().message();
    EXPECT_EQ(obs->prompt, meta(exp, "prompt")) << c;
    EXPECT_EQ(obs->lang_tokens, read_tensor<int64_t>(exp, "observation.language.tokens")) << c;
    EXPECT_EQ(obs->lang_mask, read_tensor<uint8_t>(exp, "observation.language.attention_mask")) << c;
    const std::vector<float> sn = read_tensor<float>(exp, "observation.state.normalized");
    ASSERT_EQ(obs->state_normalized.size(), sn.size());
    for (size_t i = 0; i < sn.size(); ++i)
      EXPECT_NEAR(obs->state_normalized[i], sn[i], 1e-6 * std::max(1.0f, std::fabs(sn[i]))) << c << " state " << i;
    double worst = 0;
    for (size_t k = 0; k < obs->cameras.size(); ++k) {
      std::vector<float> got = obs->images[k];
      for (float& v : got) v = v * 2.0f - 1.0f;  // lerobot records the [-1, 1] image
      const double d = max_abs_diff(got, read_tensor<float>(exp, "images." + obs->cameras[k]));
      EXPECT_LE(d, 1e-6) << c << " " << obs->cameras[k];
      worst = std::max(worst, d);
    }
    std::printf("[ pipeline ] %s: %zu tokens equal, images max |d| %.3g\n", c, obs->tokens.size(), worst);
  }
}

// The whole policy through the library: action_normalized and action within 1e-4.
TEST(PipelineFixtures, ActionMatchesLerobotPostprocessed) {
  for (const char* c : kPipeCases) {
    const std::string dir = kFixtures + "/" + c;
    const std::string exp = dir + "/expected.safetensors";
    Pi05PolicyOptions o;
    o.precision = Pi05Precision::Fp32;
    auto pol = Pi05Policy::load(dir + "/policy", o);
    ASSERT_TRUE(pol.is_ok()) << pol.status().message();
    const Pi05Model& m = pol->model();
    auto proc = load_pi05_processor(dir + "/policy");
    ASSERT_TRUE(proc.is_ok()) << proc.status().message();
    auto obs = read_pi05_observation(dir + "/obs.safetensors", m.config(), m.dims().channels, &*proc, "", m.dims().vocab);
    ASSERT_TRUE(obs.is_ok()) << obs.status().message();
    auto noise = read_pi05_noise(dir + "/noise.safetensors", m);
    ASSERT_TRUE(noise.is_ok());
    std::vector<float> an(noise->size());
    ASSERT_TRUE(pol->run_prefix(*obs).is_ok());
    ASSERT_TRUE(pol->denoise(noise->data(), an.data()).is_ok());
    const int64_t H = m.config().chunk_size, A = m.dims().max_action_dim;
    int64_t D = 0;
    auto action = postprocess_pi05_action(an.data(), H, A, m.config(), *proc, *obs, &D);
    ASSERT_TRUE(action.is_ok()) << action.status().message();
    EXPECT_EQ(D, m.config().action_dim);
    const double dn = max_abs_diff(an, read_tensor<float>(exp, "action_normalized"));
    const double da = max_abs_diff(*action, read_tensor<float>(exp, "action"));
    EXPECT_LE(dn, 1e-4) << c;
    EXPECT_LE(da, 1e-4) << c;
    std::printf("[ pipeline ] %s fp32: max |d action_normalized| %.3g, max |d action| %.3g\n", c, dn, da);
    // lerobot's postprocessor applied to lerobot's own action_normalized gives its action
    // (isolates the postprocessor from the network).
    const std::vector<float> ln = read_tensor<float>(exp, "action_normalized");
    auto post = postprocess_pi05_action(ln.data(), H, A, m.config(), *proc, *obs, &D);
    ASSERT_TRUE(post.is_ok());
    EXPECT_LE(max_abs_diff(*post, read_tensor<float>(exp, "action")), 1e-6) << c;
  }
}

TEST(PipelineFixtures, CliWritesActionInRobotUnits) {
  TempDir t;
  for (const char* c : kPipeCases) {
    const std::string dir = kFixtures + "/" + c;
    const std::string out = (t.path / (std::string(c) + ".safetensors")).string();
    Proc p = run_vlac("run " + dir + "/policy --obs " + dir + "/obs.safetensors --noise " + dir +
                      "/noise.safetensors --dtype fp32 --quiet --out " + out);
    ASSERT_EQ(p.rc, 0) << p.out;
    const double d = max_abs_diff(read_tensor<float>(out, "action"), read_tensor<float>(dir + "/expected.safetensors", "action"));
    EXPECT_LE(d, 1e-4) << c;
    EXPECT_LE(max_abs_diff(read_tensor<float>(out, "action_normalized"),
                           read_tensor<float>(dir + "/expected.safetensors", "action_normalized")),
              1e-4)
        << c;
    EXPECT_EQ(meta(out, "prompt"), meta(dir + "/expected.safetensors", "prompt"));
    std::printf("[ cli      ] %s: max |d action| %.3g\n", c, d);
  }
}

// Pre-tokenized, already-sized observations (the core fixtures) run as before and now also get
// `action` through the folder's postprocessor.
TEST(PipelineFixtures, PreTokenizedObservationsStillWork) {
  TempDir t;
  for (const char* c : {"tiny_a", "tiny_b", "tiny_b_absent_cam"}) {
    const std::string dir = kFixtures + "/" + c;
    const std::string out = (t.path / (std::string(c) + ".safetensors")).string();
    Proc p = run_vlac("run " + dir + "/policy --obs " + dir + "/obs.safetensors --noise " + dir +
                      "/noise.safetensors --quiet --out " + out);
    ASSERT_EQ(p.rc, 0) << p.out;
    EXPECT_LE(max_abs_diff(read_tensor<float>(out, "action_normalized"),
                           read_tensor<float>(dir + "/expected.safetensors", "action_normalized")),
              1e-4)
        << c;
    EXPECT_LE(max_abs_diff(read_tensor<float>(out, "action"), read_tensor<float>(dir + "/expected.safetensors", "action")), 1e-4)
        << c;
  }
  // A pre-tokenized prompt wins over the task/state path even when a tokenizer is there.
  auto cfg = parse_pi05_config(kFixtures + "/tiny_b/policy/config.json");
  auto proc = load_pi05_processor(kFixtures + "/pipe_b_quantiles/policy");
  ASSERT_TRUE(cfg.is_ok() && proc.is_ok());
  auto obs = read_pi05_observation(kFixtures + "/tiny_b/obs.safetensors", *cfg, 3, &*proc, "ignored task");
  ASSERT_TRUE(obs.is_ok()) << obs.status().message();
  EXPECT_TRUE(obs->prompt.empty());
  EXPECT_EQ(obs->tokens.size(), 13u);
}

TEST(PipelineFixtures, TaskAndTokenizerFlags) {
  TempDir t;
  const std::string dir = kFixtures + "/pipe_b_meanstd_relative";
  // --task overrides __metadata__: the same sentence gives the same action, another one changes it.
  const std::string a = (t.path / "a.safetensors").string(), b = (t.path / "b.safetensors").string();
  const std::string base = "run " + dir + "/policy --obs " + dir + "/obs.safetensors --noise " + dir + "/noise.safetensors --quiet";
  ASSERT_EQ(run_vlac(base + " --task 'fold the towel' --out " + a).rc, 0);
  EXPECT_LE(max_abs_diff(read_tensor<float>(a, "action"), read_tensor<float>(dir + "/expected.safetensors", "action")), 1e-4);
  ASSERT_EQ(run_vlac(base + " --task 'unfold_the towel' --out " + b).rc, 0);
  EXPECT_EQ(meta(b, "prompt").rfind("Task: unfold the towel, State: ", 0), 0u) << meta(b, "prompt");
  EXPECT_GT(max_abs_diff(read_tensor<float>(a, "action"), read_tensor<float>(b, "action")), 0.0);
  // A policy folder without tokenizer/: a clear error, then --tokenizer makes it work.
  const fs::path pol = t.path / "policy";
  fs::create_directories(pol);
  for (const auto& e : fs::directory_iterator(dir + "/policy"))
    if (e.path().filename() != "tokenizer") fs::create_symlink(fs::canonical(e.path()), pol / e.path().filename());
  const std::string c = (t.path / "c.safetensors").string();
  Proc p = run_vlac("run " + pol.string() + " --obs " + dir + "/obs.safetensors --quiet --out " + c);
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find("--tokenizer"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("tokenizer/tokenizer.model"), std::string::npos) << p.out;
  EXPECT_FALSE(fs::exists(c));
  p = run_vlac("run " + pol.string() + " --obs " + dir + "/obs.safetensors --noise " + dir +
               "/noise.safetensors --quiet --tokenizer " + kFixtures + "/tokenizer/tokenizer.model --out " + c);
  ASSERT_EQ(p.rc, 0) << p.out;
  EXPECT_LE(max_abs_diff(read_tensor<float>(c, "action"), read_tensor<float>(dir + "/expected.safetensors", "action")), 1e-4);
  p = run_vlac("run " + pol.string() + " --obs " + dir + "/obs.safetensors --quiet --tokenizer /nonexistent.model --out " + c);
  EXPECT_EQ(p.rc, 2) << p.out;
  EXPECT_NE(p.out.find("/nonexistent.model"), std::string::npos) << p.out;
}

TEST(PipelineFixtures, BadObservationsGetOneClearError) {
  TempDir t;
  const std::string dir = kFixtures + "/pipe_b_quantiles";
  const std::string src = dir + "/obs.safetensors";
  const std::string out = (t.path / "out.safetensors").string();
  auto run = [&](const std::string& obs) {
    return run_vlac("run " + dir + "/policy --obs " + obs + " --quiet --out " + out);
  };
  auto expect_error = [&](const Proc& p, const std::string& needle, const char* what) {
    EXPECT_EQ(p.rc, 2) << what << ": " << p.out;
    EXPECT_NE(p.out.find(needle), std::string::npos) << what << ": " << p.out;
    EXPECT_EQ(std::count(p.out.begin(), p.out.end(), '\n'), 1) << what << ": one line only: " << p.out;
    EXPECT_FALSE(fs::exists(out)) << what;
  };
  auto out_of = [&](const char* name) { return (t.path / name).string(); };
  {  // missing state
    Edit e;
    e.drop = "observation.state";
    expect_error(run(write_edited(src, out_of("a.safetensors"), e)), "'observation.state'", "missing state");
  }
  {  // NaN in the state
    std::vector<float> s = read_tensor<float>(src, "observation.state");
    s[4] = std::nanf("");
    Edit e;
    e.replace = "observation.state";
    e.spec = {"", DType::F32, {int64_t(s.size())}};
    e.bytes = as_bytes(s);
    expect_error(run(write_edited(src, out_of("b.safetensors"), e)), "NaN at element 4", "NaN state");
  }
  {  // wrong state dtype
    std::vector<double> s(9, 0.5);
    Edit e;
    e.replace = "observation.state";
    e.spec = {"", DType::F64, {9}};
    e.bytes = as_bytes(s);
    expect_error(run(write_edited(src, out_of("c.safetensors"), e)), "'observation.state' is F64", "F64 state");
  }
  {  // wrong state length
    std::vector<float> s(10, 0.5f);
    Edit e;
    e.replace = "observation.state";
    e.spec = {"", DType::F32, {10}};
    e.bytes = as_bytes(s);
    expect_error(run(write_edited(src, out_of("d.safetensors"), e)), "expects 9", "state length");
  }
  {  // image of a wrong dtype
    std::vector<int32_t> img(30 * 50 * 3, 7);
    Edit e;
    e.replace = "observation.images.cam_high";
    e.spec = {"", DType::I32, {30, 50, 3}};
    e.bytes = as_bytes(img);
    expect_error(run(write_edited(src, out_of("e.safetensors"), e)), "'observation.images.cam_high' has dtype I32",
                 "I32 image");
  }
  {  // image of a wrong shape (no axis of 3 channels)
    std::vector<uint8_t> img(5 * 6 * 7, 7);
    Edit e;
    e.replace = "observation.images.cam_high";
    e.spec = {"", DType::U8, {5, 6, 7}};
    e.bytes = img;
    expect_error(run(write_edited(src, out_of("f.safetensors"), e)), "'observation.images.cam_high' has shape [5, 6, 7]",
                 "bad image shape");
  }
  {  // a frame too thin to resize
    std::vector<uint8_t> img(1 * 200 * 3, 7);
    Edit e;
    e.replace = "observation.images.cam_high";
    e.spec = {"", DType::U8, {1, 200, 3}};
    e.bytes = img;
    expect_error(run(write_edited(src, out_of("g.safetensors"), e)), "too thin", "thin image");
  }
  {  // no task anywhere
    Edit e;
    e.keep_metadata = false;
    expect_error(run(write_edited(src, out_of("h.safetensors"), e)), "no task", "no task");
  }
  {  // non-finite pixel in a float frame
    std::vector<float> img = read_tensor<float>(src, "observation.images.cam_left_wrist");
    img[11] = INFINITY;
    Edit e;
    e.replace = "observation.images.cam_left_wrist";
    e.spec = {"", DType::F32, {3, 64, 48}};
    e.bytes = as_bytes(img);
    expect_error(run(write_edited(src, out_of("i.safetensors"), e)), "non-finite value at element 11", "inf pixel");
  }
  // An over-long prompt is truncated, as lerobot does (pipe_a: 16 tokens kept, mask all true).
  auto cfg = parse_pi05_config(kFixtures + "/pipe_a_truncated_relative/policy/config.json");
  auto proc = load_pi05_processor(kFixtures + "/pipe_a_truncated_relative/policy");
  ASSERT_TRUE(cfg.is_ok() && proc.is_ok());
  auto obs = read_pi05_observation(kFixtures + "/pipe_a_truncated_relative/obs.safetensors", *cfg, 3, &*proc,
                                   std::string(500, 'x'));
  ASSERT_TRUE(obs.is_ok()) << obs.status().message();
  EXPECT_EQ(obs->tokens.size(), 16u);
  EXPECT_EQ(obs->lang_mask, std::vector<uint8_t>(16, 1));
}

// The same frame as uint8 HWC, float32 HWC (x/255) and float32 CHW, with and without a batch
// dim, gives the same processed image.
TEST(PipelineFixtures, FrameLayoutsAgree) {
  TempDir t;
  const std::string dir = kFixtures + "/pipe_b_quantiles";
  const std::string src = dir + "/obs.safetensors";
  const std::string cam = "observation.images.cam_high";
  const std::vector<uint8_t> u8 = read_tensor<uint8_t>(src, cam);  // [30, 50, 3]
  ASSERT_EQ(u8.size(), 30u * 50u * 3u);
  std::vector<float> hwc(u8.size()), chw(u8.size());
  for (size_t y = 0; y < 30; ++y)
    for (size_t x = 0; x < 50; ++x)
      for (size_t c = 0; c < 3; ++c) {
        const float v = float(u8[(y * 50 + x) * 3 + c]) / 255.0f;
        hwc[(y * 50 + x) * 3 + c] = v;
        chw[(c * 30 + y) * 50 + x] = v;
      }
  auto cfg = parse_pi05_config(dir + "/policy/config.json");
  auto proc = load_pi05_processor(dir + "/policy");
  ASSERT_TRUE(cfg.is_ok() && proc.is_ok());
  auto image_of = [&](const std::string& path) {
    auto obs = read_pi05_observation(path, *cfg, 3, &*proc, "");
    EXPECT_TRUE(obs.is_ok()) << obs.status().message();
    return obs.is_ok() ? obs->images[0] : std::vector<float>{};
  };
  const std::vector<float> ref = image_of(src);
  ASSERT_EQ(ref.size(), 3u * 40u * 40u);
  struct Variant {
    const char* name;
    TensorSpec spec;
    std::vector<uint8_t> bytes;
  };
  const std::vector<Variant> variants{
      {"f32_hwc", {"", DType::F32, {30, 50, 3}}, as_bytes(hwc)},
      {"f32_chw", {"", DType::F32, {3, 30, 50}}, as_bytes(chw)},
      {"f32_chw_batched", {"", DType::F32, {1, 3, 30, 50}}, as_bytes(chw)},
      {"u8_hwc_batched", {"", DType::U8, {1, 30, 50, 3}}, u8},
  };
  for (const Variant& v : variants) {
    Edit e;
    e.replace = cam;
    e.spec = v.spec;
    e.bytes = v.bytes;
    const std::string path = write_edited(src, (t.path / (std::string(v.name) + ".safetensors")).string(), e);
    EXPECT_EQ(image_of(path), ref) << v.name;
  }
}
