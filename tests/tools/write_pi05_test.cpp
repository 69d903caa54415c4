// vlac_write_pi05 end to end at demo size: the folder it writes opens with `vlac inspect`, the
// observation it writes runs with `vlac run`, writes are deterministic, bad flags exit 2.
// Runs the built programs (VLAC_BINARY and vlac_write_pi05 next to it); never full size.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/vlac_tools_test_XXXXXX";
    if (char* p = mkdtemp(tmpl.data())) path_ = p;
    else ADD_FAILURE() << "mkdtemp failed";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct ProcRun {
  int rc = -1;
  std::string out, err;
};

ProcRun run(const TempDir& dir, const std::string& program, const std::string& args) {
  const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
  const std::string cmd = "'" + program + "' " + args + " >'" + out + "' 2>'" + err + "' </dev/null";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
}

std::string writer() { return (std::filesystem::path(VLAC_BINARY).parent_path() / "vlac_write_pi05").string(); }

TEST(WritePi05, DemoFolderOpensWithInspectAndRuns) {
  TempDir dir;
  const std::string pol = dir.file("demo"), obs = dir.file("obs.safetensors");
  ProcRun w = run(dir, writer(), "--out '" + pol + "' --seed 3 --write-obs '" + obs + "'");
  ASSERT_EQ(w.rc, 0) << w.err;
  EXPECT_NE(w.out.find("wrote demo pi0.5 policy"), std::string::npos) << w.out;
  EXPECT_NE(w.out.find("peak RSS"), std::string::npos) << w.out;
  const uint64_t bytes = std::filesystem::file_size(pol + "/model.safetensors") + std::filesystem::file_size(pol + "/config.json");
  EXPECT_NE(w.out.find("(" + std::to_string(bytes) + " bytes)"), std::string::npos) << w.out;
  EXPECT_EQ(w.err, "");  // no progress bar when stderr is not a terminal

  ProcRun i = run(dir, VLAC_BINARY, "inspect --json --quiet '" + pol + "'");
  ASSERT_EQ(i.rc, 0) << i.err;
  nlohmann::json j = nlohmann::json::parse(i.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << i.out;
  // Fine-tune layout: every key under "model.", embedding and both lm_heads present, all fp32.
  bool embed = false;
  int lm_heads = 0;
  for (const auto& t : j["tensors"]) {
    const std::string name = t["name"];
    EXPECT_EQ(name.rfind("model.", 0), 0u) << name;
    EXPECT_EQ(t["dtype"], "F32") << name;
    if (name.find("embed_tokens") != std::string::npos) embed = true;
    if (name.find("lm_head") != std::string::npos) ++lm_heads;
  }
  EXPECT_TRUE(embed);
  EXPECT_EQ(lm_heads, 2);

  ProcRun r = run(dir, VLAC_BINARY, "run '" + pol + "' --obs '" + obs + "' --out '" + dir.file("act.safetensors") + "' --quiet");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir.file("act.safetensors")));
}

TEST(WritePi05, BaseLayoutHasNoPrefix) {
  TempDir dir;
  const std::string pol = dir.file("base");
  ProcRun w = run(dir, writer(), "--out '" + pol + "' --layout base");
  ASSERT_EQ(w.rc, 0) << w.err;
  ProcRun i = run(dir, VLAC_BINARY, "inspect --json --quiet '" + pol + "'");
  ASSERT_EQ(i.rc, 0) << i.err;
  nlohmann::json j = nlohmann::json::parse(i.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  ASSERT_FALSE(j["tensors"].empty());
  for (const auto& t : j["tensors"]) EXPECT_NE(std::string(t["name"]).rfind("model.", 0), 0u) << t["name"];
}

TEST(WritePi05, SameSeedSameBytesOtherSeedOtherBytes) {
  TempDir dir;
  ASSERT_EQ(run(dir, writer(), "--out '" + dir.file("a") + "' --seed 7").rc, 0);
  ASSERT_EQ(run(dir, writer(), "--out '" + dir.file("b") + "' --seed 7").rc, 0);
  ASSERT_EQ(run(dir, writer(), "--out '" + dir.file("c") + "' --seed 8").rc, 0);
  const std::string a = slurp(dir.file("a/model.safetensors"));
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, slurp(dir.file("b/model.safetensors")));
  EXPECT_NE(a, slurp(dir.file("c/model.safetensors")));
  EXPECT_EQ(slurp(dir.file("a/config.json")), slurp(dir.file("c/config.json")));
}

TEST(WritePi05, ObsOnlyForAnExistingFolder) {
  TempDir dir;
  const std::string pol = dir.file("p");
  ASSERT_EQ(run(dir, writer(), "--out '" + pol + "'").rc, 0);
  ProcRun o = run(dir, writer(), "--out '" + pol + "' --obs-only --write-obs '" + dir.file("o.safetensors") + "' --obs-tokens 5");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.out.find("(5 prompt tokens)"), std::string::npos) << o.out;
  ProcRun i = run(dir, VLAC_BINARY, "inspect --json --quiet '" + dir.file("o.safetensors") + "'");
  ASSERT_EQ(i.rc, 0) << i.err;
  nlohmann::json j = nlohmann::json::parse(i.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& t : j["tensors"]) by_name[t["name"]] = t;
  ASSERT_TRUE(by_name.count("observation.images.cam0"));
  EXPECT_EQ(by_name["observation.images.cam0"]["shape"], nlohmann::json::array({3, 56, 56}));
  EXPECT_EQ(by_name["observation.language.tokens"]["dtype"], "I64");
  EXPECT_EQ(by_name["observation.language.attention_mask"]["dtype"], "BOOL");
  EXPECT_EQ(by_name["observation.state"]["shape"], nlohmann::json::array({8}));
}

TEST(WritePi05, BadInputExitsTwoWithOneLine) {
  TempDir dir;
  ProcRun a = run(dir, writer(), "--out '" + dir.file("x") + "' --size huge");
  EXPECT_EQ(a.rc, 2);
  EXPECT_NE(a.err.find("--size must be full, medium or demo"), std::string::npos) << a.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("x")));
  ProcRun b = run(dir, writer(), "--out '" + dir.file("missing") + "' --obs-only --write-obs '" + dir.file("o.safetensors") + "'");
  EXPECT_EQ(b.rc, 2) << b.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("o.safetensors")));
  ProcRun c = run(dir, writer(), "--out '" + dir.file("y") + "' --obs-only");
  EXPECT_EQ(c.rc, 2);
  EXPECT_NE(c.err.find("--obs-only needs --write-obs"), std::string::npos) << c.err;
}

}  // namespace
