// The CUDA backend's compile side on a GPU-less machine: `vlac compile --backend cuda` through
// the same engine builder, engines read back by the CPU runtime (a test backend "cuda" whose
// runtime is the CPU's, in a registry of the test's own), so the fused graph is checked against
// the unfused CPU package on the same inputs; every stored weight is where and what the manifest
// says; bad input leaves nothing behind; the CLI works without a GPU.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/compiler.h"
#include "backends/registry.h"
#include "compile/pi05_compile.h"
#include "core/atomic_file.h"
#include "io/safetensors.h"
#include "package/package.h"
#include "pi05_spec/pi05_spec.h"
#include "runtime/graph_package.h"

namespace vlac {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kFixtures = std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/pi05/";

// The CUDA compiler with the CPU's runtime: CUDA engine files are raw weights at the offsets the
// manifest gives, so the CPU executor runs the lowered (fused) programs from them.
class CudaOnCpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda"; }
  DeviceInfo device() const override {
    DeviceInfo d;
    d.backend = "cuda";
    d.description = "cuda engines on the cpu runtime (test)";
    return d;
  }
  BackendCompiler* compiler() override { return compiler_.get(); }
  BackendRuntime& runtime() override { return backend_registry().find("cpu")->runtime(); }

 private:
  std::unique_ptr<BackendCompiler> compiler_ = cuda::make_cuda_compiler();
};

// Compiles with the process registry's "cuda" (the real backend once wired in; else this test's).
void ensure_cuda_compiler() {
  if (!backend_registry().find("cuda")) {
    ASSERT_TRUE(backend_registry().add(std::make_unique<CudaOnCpuBackend>()).is_ok());
  }
}

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/vlac_cudacc_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

Result<Pi05CompileSummary> compile(const std::string& policy, const std::string& out, const std::string& backend,
                                   bool bf16, uint64_t cap = 512ull << 20) {
  Pi05CompileOptions o;
  o.out = out;
  o.backend = backend;
  o.bf16 = bf16;
  o.engine_cap = cap;
  return compile_pi05(policy, o);
}

// The stage inputs of a pi0.5 package, random but fixed; the lm gets a prefix of its own.
struct StageInputs {
  std::vector<float> image, embeddings, x, t{0.7f};
  std::vector<int64_t> tokens, prefix_pos, suffix_pos;
  std::map<std::string, PackageValue> values;
  StageInputs(const Package& pkg, uint32_t seed) {
    const json& p = pkg.manifest().policy;
    const int64_t C = p["channels"], R = p["image_size"], L = p["tokenizer_max_length"], W = p["lm_width"];
    const int64_t V = p["vocab"], H = p["chunk_size"], A = p["max_action_dim"], n_img = p["image_tokens"];
    const int64_t P = int64_t(p["cameras"].size()) * n_img + L;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    auto fill = [&](std::vector<float>& v, int64_t n) {
      v.resize(size_t(n));
      for (float& f : v) f = u(rng);
    };
    fill(image, C * R * R);
    fill(embeddings, P * W);
    fill(x, H * A);
    for (int64_t i = 0; i < L; ++i) tokens.push_back(int64_t(rng() % uint32_t(V)));
    for (int64_t i = 0; i < P; ++i) prefix_pos.push_back(i);
    for (int64_t i = 0; i < H; ++i) suffix_pos.push_back(P + i);
    values[kPi05InImage] = {image.data(), {DType::F32, {1, C, R, R}}};  // a batched vision engine, one image
    values[kPi05InTokens] = {tokens.data(), {DType::I64, {L}}};
    values[kPi05InPrefixEmbeddings] = {embeddings.data(), {DType::F32, {P, W}}};
    values[kPi05InPrefixPos] = {prefix_pos.data(), {DType::I64, {P}}};
    values[kPi05InX] = {x.data(), {DType::F32, {H, A}}};
    values[kPi05InTime] = {t.data(), {DType::F32, {1}}};
    values[kPi05InSuffixPos] = {suffix_pos.data(), {DType::I64, {H}}};
  }
};

std::vector<std::string> stage_outputs(const Package& pkg) {
  const int64_t depth = pkg.manifest().policy["lm_depth"];
  std::vector<std::string> out = {kPi05OutImageTokens, kPi05OutTextEmbeddings, "velocity", "x_next"};
  for (int64_t l = 0; l < depth; ++l) {
    out.push_back("prefix.k." + std::to_string(l));
    out.push_back("prefix.v." + std::to_string(l));
  }
  return out;
}

// Max |a - b| and max |a| of every stage output, CPU package vs CUDA package on the CPU runtime.
struct Diff {
  double max_abs = 0, max_ref = 0;
};
Diff run_both(const std::string& cpu_pkg, const std::string& cuda_pkg) {
  BackendRegistry reg;
  EXPECT_TRUE(reg.add(std::make_unique<CudaOnCpuBackend>()).is_ok());
  auto a = GraphPackage::open(cpu_pkg);
  auto b = GraphPackage::open(cuda_pkg, {}, &reg);
  EXPECT_TRUE(a.is_ok()) << a.status().message();
  EXPECT_TRUE(b.is_ok()) << b.status().message();
  if (!a.is_ok() || !b.is_ok()) return {1e9, 0};
  StageInputs ia(a->package(), 7), ib(b->package(), 7);
  Status sa = a->run(&ia.values), sb = b->run(&ib.values);
  EXPECT_TRUE(sa.is_ok()) << sa.message();
  EXPECT_TRUE(sb.is_ok()) << sb.message();
  Diff d;
  for (const std::string& name : stage_outputs(a->package())) {
    auto pa = ia.values.find(name), pb = ib.values.find(name);
    if (pa == ia.values.end() || pb == ib.values.end()) {
      ADD_FAILURE() << "stage output " << name << " missing";
      continue;
    }
    EXPECT_EQ(pa->second.info, pb->second.info) << name;
    EXPECT_EQ(pa->second.info.dtype, DType::F32) << name;
    const float* x = static_cast<const float*>(pa->second.data);
    const float* y = static_cast<const float*>(pb->second.data);
    for (int64_t i = 0; i < pa->second.info.numel(); ++i) {
      d.max_abs = std::max(d.max_abs, double(std::fabs(x[i] - y[i])));
      d.max_ref = std::max(d.max_ref, double(std::fabs(x[i])));
    }
  }
  return d;
}

TEST(CudaCompile, FusedEnginesGiveTheCpuPackagesNumbersFp32) {
  ensure_cuda_compiler();
  for (const char* fx : {"tiny_a", "tiny_b"}) {
    TempDir t;
    const std::string policy = kFixtures + fx + "/policy";
    ASSERT_TRUE(compile(policy, t / "cpu.vlac", "cpu", false).is_ok());
    auto s = compile(policy, t / "cuda.vlac", "cuda", false);
    ASSERT_TRUE(s.is_ok()) << s.status().message();
    const Diff d = run_both(t / "cpu.vlac", t / "cuda.vlac");
    std::printf("[fuse] %s fp32: max |cpu - fused| %.3g (max |cpu| %.3g)\n", fx, d.max_abs, d.max_ref);
    EXPECT_LE(d.max_abs, 1e-6 * std::max(1.0, d.max_ref)) << fx;
  }
}

TEST(CudaCompile, FusedEnginesGiveTheCpuPackagesNumbersBf16) {
  ensure_cuda_compiler();
  for (const char* fx : {"tiny_a", "tiny_b", "tiny_a_bf16"}) {
    TempDir t;
    const std::string policy = kFixtures + fx + "/policy";
    ASSERT_TRUE(compile(policy, t / "cpu.vlac", "cpu", true).is_ok());
    auto s = compile(policy, t / "cuda.vlac", "cuda", true);
    ASSERT_TRUE(s.is_ok()) << s.status().message();
    const Diff d = run_both(t / "cpu.vlac", t / "cuda.vlac");
    std::printf("[fuse] %s bf16: max |cpu - fused| %.3g (max |cpu| %.3g)\n", fx, d.max_abs, d.max_ref);
    // Same bf16 weights and rounding points; only fp32 sums over other GEMM blockings can move a
    // value across one bf16 rounding boundary (2^-8 relative).
    EXPECT_LE(d.max_abs, 8e-3 * std::max(1.0, d.max_ref)) << fx;
  }
}

TEST(CudaCompile, Bf16AllMatricesStoresEveryMatrixInBf16AndStillRuns) {
  ensure_cuda_compiler();
  TempDir t;
  const std::string policy = kFixtures + "tiny_b/policy";
  Pi05CompileOptions o;
  o.out = t / "all.vlac";
  o.backend = "cuda";
  o.bf16_all_matrices = true;
  ASSERT_TRUE(compile_pi05(policy, o).is_ok());
  ASSERT_TRUE(compile(policy, t / "cpu.vlac", "cpu", true).is_ok());
  auto pkg = Package::open(t / "all.vlac");
  ASSERT_TRUE(pkg.is_ok());
  EXPECT_EQ(pkg->manifest().policy["precision"], "bf16-all-matrices");
  int bf16_vision = 0;
  for (const PackageEngine& pe : pkg->manifest().engines)
    for (const json& w : pe.extra["weights"]) {
      const std::string n = w["name"], dt = w["dtype"];
      const size_t rank = w["shape"].size();
      if (n.find("vision_tower") != std::string::npos && rank == 2 && n.find("position_embedding") == std::string::npos) {
        EXPECT_EQ(dt, "BF16") << n;
        ++bf16_vision;
      }
      if (n.find("dense.weight") != std::string::npos || n.find("multi_modal_projector.linear.weight") != std::string::npos) {
        EXPECT_EQ(dt, "BF16") << n;
      }
      if (rank == 1 || n.find("patch_embedding") != std::string::npos || n.find("position_embedding") != std::string::npos ||
          n.find("action_") != std::string::npos || n.find("time_mlp") != std::string::npos) {
        EXPECT_EQ(dt, "F32") << n;
      }
    }
  EXPECT_GT(bf16_vision, 0);
  const Diff d = run_both(t / "cpu.vlac", t / "all.vlac");
  std::printf("[fuse] tiny_b bf16-all vs lerobot's bf16 split: max |d| %.3g (max %.3g)\n", d.max_abs, d.max_ref);
  EXPECT_LE(d.max_abs, 0.1 * std::max(1.0, d.max_ref));  // SigLIP, projector and adaRMS in bf16: not the same rounding
}

// Reference bytes of `name` from the folder, converted to `dt` (F32 or BF16).
std::vector<uint8_t> folder_bytes(const TensorSet& ts, const std::string& name, DType dt) {
  const TensorSet::Entry* e = ts.find(name);
  EXPECT_NE(e, nullptr) << name;
  if (!e) return {};
  const uint8_t* src = e->file->data(*e->info);
  const int64_t n = int64_t(e->info->nbytes() / dtype_size(e->info->dtype));
  std::vector<uint8_t> out(size_t(n) * dtype_size(dt));
  for (int64_t i = 0; i < n; ++i) {
    float v;
    if (e->info->dtype == DType::F32) std::memcpy(&v, src + 4 * i, 4);
    else {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      v = e->info->dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    if (dt == DType::F32) std::memcpy(out.data() + 4 * i, &v, 4);
    else {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

TEST(CudaCompile, EveryWeightIsWhereAndWhatTheManifestSays) {
  ensure_cuda_compiler();
  for (bool bf16 : {true, false}) {
    TempDir t;
    const std::string policy = kFixtures + "tiny_b/policy";
    // A small cap: several engines per stage, weights read across engines.
    ASSERT_TRUE(compile(policy, t / "cuda.vlac", "cuda", bf16, 64 << 10).is_ok());
    auto pkg = Package::open(t / "cuda.vlac");
    ASSERT_TRUE(pkg.is_ok()) << pkg.status().message();
    ASSERT_TRUE(pkg->verify().is_ok());
    auto ts = TensorSet::open(policy);
    ASSERT_TRUE(ts.is_ok());
    std::map<std::string, int> stored_parts;  // folder tensor -> times stored
    int fused = 0, engines = 0;
    for (const PackageEngine& pe : pkg->manifest().engines) {
      ++engines;
      EXPECT_EQ(pe.backend, "cuda");
      ASSERT_TRUE(pe.extra.contains("backend_info")) << pe.name;
      const json& info = pe.extra["backend_info"];
      EXPECT_EQ(info["layout"], cuda::kEngineLayout);
      // The estimate's weight bytes are the engine file's; activations were planned (arena > 0).
      const PackageSegment* own = pkg->find("engine/" + pe.name);
      ASSERT_NE(own, nullptr);
      EXPECT_EQ(info["estimate"]["weights_bytes"].get<uint64_t>(), own->size) << pe.name;
      EXPECT_GT(info["estimate"]["arena_bytes"].get<uint64_t>(), 0u) << pe.name;
      EXPECT_LE(info["estimate"]["compile_peak_bytes"].get<uint64_t>(), 8u << 20) << pe.name;
      EXPECT_EQ(info["chosen_at_load"].size(), 3u);
      std::map<std::string, json> records;
      for (const json& w : pe.extra["weights"]) records[w["name"].get<std::string>()] = w;
      for (const json& sw : info["weights"]) {
        const std::string name = sw["name"];
        ASSERT_TRUE(records.count(name)) << name;
        const json& r = records[name];
        EXPECT_EQ(r["segment"], "engine/" + pe.name) << name;  // stored by the engine that owns it
        const uint64_t off = r["offset"], bytes = r["bytes"];
        EXPECT_EQ(off % cuda::kEngineAlign, 0u) << name;
        const DType dt = *dtype_from_name(r["dtype"].get<std::string>());
        const std::vector<int64_t> shape = r["shape"];
        EXPECT_EQ(bytes, uint64_t(ir::ValueInfo{dt, shape}.numel()) * dtype_size(dt)) << name;
        const std::string use = sw["use"];
        if (use == "norm") {
          EXPECT_EQ(dt, DType::F32) << name;
        }
        if (use == "conv_gemm") {
          EXPECT_EQ(sw["gemm_shape"], (std::vector<int64_t>{shape[0], shape[1] * shape[2] * shape[3]})) << name;
        }
        auto seg = pkg->data(r["segment"].get<std::string>());
        ASSERT_TRUE(seg.is_ok());
        ASSERT_LE(off + bytes, seg->size());
        std::vector<uint8_t> want;
        if (sw.contains("parts")) {
          ++fused;
          int64_t row = 0;
          for (const json& p : sw["parts"]) {
            const std::string pn = p["name"];
            EXPECT_EQ(p["rows"][0].get<int64_t>(), row);
            row = p["rows"][1].get<int64_t>();
            const std::vector<uint8_t> b = folder_bytes(*ts, pn, dt);
            want.insert(want.end(), b.begin(), b.end());
            ++stored_parts[pn];
          }
          EXPECT_EQ(row, shape[0]) << name;
        } else {
          want = folder_bytes(*ts, name, dt);
          ++stored_parts[name];
        }
        ASSERT_EQ(want.size(), bytes) << name;
        EXPECT_EQ(std::memcmp(seg->data() + off, want.data(), bytes), 0) << name << " differs from the folder's tensor";
      }
    }
    EXPECT_GT(engines, 4);
    EXPECT_GT(fused, 0);
    for (const auto& [n, c] : stored_parts) EXPECT_EQ(c, 1) << n << " stored " << c << " times";
    EXPECT_TRUE(stored_parts.count("model.paligemma_with_expert.gemma_expert.model.layers.0.self_attn.q_proj.weight") ||
                stored_parts.count("paligemma_with_expert.gemma_expert.model.layers.0.self_attn.q_proj.weight"));
  }
}

TEST(CudaCompile, EngineWriterConcatenatesInBoundedChunksAndChecksItsInput) {
  // Two parts, written through a 4 KiB buffer (many chunks per part), F32 -> BF16 and F16 -> F32.
  std::vector<float> a(3000), b(1000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.25f - 100.f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -float(i) * 0.5f;
  std::vector<uint8_t> file(16 + (a.size() + b.size()) * 4);
  std::memcpy(file.data() + 16, a.data(), a.size() * 4);
  std::memcpy(file.data() + 16 + a.size() * 4, b.data(), b.size() * 4);
  std::vector<uint16_t> h(64);
  for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_f16(float(i) - 32.f);
  std::vector<uint8_t> file2(h.size() * 2);
  std::memcpy(file2.data(), h.data(), file2.size());

  struct Counting : FileWeightSource {
    using FileWeightSource::FileWeightSource;
    uint64_t released = 0;
    void release_range(const ir::WeightRef& r, uint64_t o, uint64_t n) override {
      released += n;
      FileWeightSource::release_range(r, o, n);
    }
  } src({{file.data(), file.size(), "mem.safetensors", nullptr}, {file2.data(), file2.size(), "f16.safetensors", nullptr}});
  ir::WeightRef pa{"m.q_proj.weight", 0, 16, DType::F32, {30, 100}, 12000, {}};
  ir::WeightRef pb{"m.k_proj.weight", 0, 16 + 12000, DType::F32, {10, 100}, 4000, {}};
  ir::WeightRef fusedw{"m.qk.weight", 0, 0, DType::F32, {40, 100}, 16000, {}};
  fusedw.parts = {pa, pb};
  ir::WeightRef hw{"n.weight", 1, 0, DType::F16, {64}, 128, {}};
  TempDir t;
  auto ef = cuda::write_cuda_engine_file(t / "e.engine", {{fusedw, DType::BF16}, {hw, DType::F32}},
                                         {DType::BF16, DType::F32}, src, 4096);
  ASSERT_TRUE(ef.is_ok()) << ef.status().message();
  EXPECT_EQ(src.released, 16000u + 128u);
  ASSERT_EQ(ef->weights.size(), 2u);
  EXPECT_EQ(ef->weights[0].offset, 0u);
  EXPECT_EQ(ef->weights[0].bytes, 8000u);
  EXPECT_EQ(ef->weights[1].offset, 8192u);  // 256-aligned
  EXPECT_EQ(ef->bytes, 8192u + 256u);
  auto m = MappedFile::open(t / "e.engine");
  ASSERT_TRUE(m.is_ok());
  for (size_t i = 0; i < 4000; ++i) {
    uint16_t v;
    std::memcpy(&v, m->data() + 2 * i, 2);
    EXPECT_EQ(v, f32_to_bf16(i < 3000 ? a[i] : b[i - 3000])) << i;
  }
  for (size_t i = 0; i < 64; ++i) {
    float v;
    std::memcpy(&v, m->data() + 8192 + 4 * i, 4);
    EXPECT_EQ(v, float(i) - 32.f);
  }

  // Bad input: one error naming the tensor or file, nothing at the path.
  ir::WeightRef outside = pb;
  outside.offset = file.size() - 100;
  ir::WeightRef bad_fused = fusedw;
  bad_fused.parts = {pa, outside};
  auto e1 = cuda::write_cuda_engine_file(t / "bad1.engine", {{bad_fused, DType::BF16}}, {DType::BF16}, src);
  ASSERT_FALSE(e1.is_ok());
  EXPECT_NE(e1.status().message().find("mem.safetensors: tensor 'm.k_proj.weight' lies outside the file"),
            std::string::npos) << e1.status().message();
  ir::WeightRef ints{"i.weight", 0, 16, DType::I32, {10}, 40, {}};
  auto e2 = cuda::write_cuda_engine_file(t / "bad2.engine", {{ints, DType::F32}}, {DType::F32}, src);
  ASSERT_FALSE(e2.is_ok());
  EXPECT_NE(e2.status().message().find("tensor 'i.weight' has dtype I32"), std::string::npos) << e2.status().message();
  ir::WeightRef short_fused = fusedw;
  short_fused.parts = {pa};
  auto e3 = cuda::write_cuda_engine_file(t / "bad3.engine", {{short_fused, DType::BF16}}, {DType::BF16}, src);
  ASSERT_FALSE(e3.is_ok());
  for (const auto& entry : fs::directory_iterator(t.path))
    EXPECT_EQ(entry.path().filename(), "e.engine") << "left behind: " << entry.path();
}

TEST(CudaCompile, BadFolderGivesOneErrorAndLeavesNoFile) {
  ensure_cuda_compiler();
  TempDir t;
  // tiny_a with a truncated model.safetensors.
  fs::create_directory(t.path / "policy");
  for (const auto& e : fs::directory_iterator(kFixtures + "tiny_a/policy"))
    if (e.is_regular_file()) fs::copy_file(e.path(), t.path / "policy" / e.path().filename());
  const fs::path st = t.path / "policy" / "model.safetensors";
  fs::resize_file(st, fs::file_size(st) - 1000);
  auto s = compile((t.path / "policy").string(), t / "out.vlac", "cuda", true);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("model.safetensors"), std::string::npos) << s.status().message();
  EXPECT_FALSE(fs::exists(t / "out.vlac"));
  for (const auto& e : fs::directory_iterator(t.path)) EXPECT_EQ(e.path().filename(), "policy") << e.path();
}

int run_cli(const std::string& args, std::string* out) {
  const std::string cmd = std::string(VLAC_BINARY) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  const int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(CudaCompile, CliCompilesTheDemoPolicyWithoutAGpu) {
  std::string out;
  if (run_cli("compile --help", &out) != 0 || out.find("--backend") == std::string::npos)
    GTEST_SKIP() << "this vlac has no --backend";
  TempDir t;
  out.clear();
  ASSERT_EQ(run_cli("demo " + t / "demo" + " --quiet", &out), 0) << out;
  out.clear();
  const int rc = run_cli("compile " + t / "demo/policy" + " --backend cuda -o " + t / "demo/cuda.vlac" +
                             " --report-json " + t / "report.json",
                         &out);
  if (rc != 0 && out.find("backend 'cuda' is not built into this vlac") != std::string::npos)
    GTEST_SKIP() << "the vlac binary has no cuda backend registered: " << out;
  ASSERT_EQ(rc, 0) << out;
  auto pkg = Package::open(t / "demo/cuda.vlac");
  ASSERT_TRUE(pkg.is_ok()) << pkg.status().message();
  ASSERT_FALSE(pkg->manifest().engines.empty());
  for (const PackageEngine& pe : pkg->manifest().engines) EXPECT_EQ(pe.backend, "cuda");
  EXPECT_TRUE(pkg->verify().is_ok());
}

}  // namespace
}  // namespace vlac
