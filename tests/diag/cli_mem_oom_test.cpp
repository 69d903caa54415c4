// End-to-end tests of `vlac mem oom` through the built binary: human and JSON output, stdin,
// and exit code 2 with one clear line for every kind of bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "cli/cli_test_util.h"

namespace {

namespace fs = std::filesystem;

// One folder for the file's tests, removed at exit.
fs::path tmp_dir() {
  static ::vlac::clitest::TempDir d("cli-oom");
  return d.path();
}

// Runs `vlac <args>` through the shell; `args` is already quoted.
using CliRun = ::vlac::clitest::Apart;
CliRun vlac(const std::string& args) { return ::vlac::clitest::run_vlac_apart(args); }

std::string fixture(const std::string& name) { return std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/oom/" + name; }
using ::vlac::clitest::sh_quote;

size_t lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(CliMemOom, HumanReportOfTheGuideMessage) {
  CliRun r = vlac("mem oom --quiet " + sh_quote(fixture("guide_80gb.txt")));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* want : {"PyTorch CUDA out of memory on GPU 0", "79.15 GiB", "812.00 MiB", "reserved by PyTorch",
                           "fragmentation", "1. allocator", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                           "[changes what the policy learns]", "[keeps the policy]"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
}

TEST(CliMemOom, JsonFromStdin) {
  CliRun r = vlac("mem oom --json --quiet - < " + sh_quote(fixture("18_keys_values_92_rank_multi_process.txt")));
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["kind"], "cuda");
  EXPECT_EQ(j["tried_to_allocate_bytes"], 599785472u);   // 572.00 MiB
  EXPECT_EQ(j["total_capacity_bytes"], 42402064630u);    // 39.49 GiB
  EXPECT_EQ(j["free_bytes"], 336917955u);                // 321.31 MiB
  EXPECT_EQ(j["allocated_by_pytorch_bytes"], 38697655337u);  // 36.04 GiB
  EXPECT_EQ(j["reserved_unallocated_bytes"], 336980869u);    // 321.37 MiB
  ASSERT_EQ(j["processes"].size(), 5u);
  EXPECT_EQ(j["processes"][0]["pid"], 3721648);
  EXPECT_EQ(j["processes"][0]["bytes"], 434110464u);     // 414.00 MiB
  EXPECT_TRUE(j["processes"][1]["pid"].is_null());
  EXPECT_EQ(j["processes"][1]["self"], true);
  EXPECT_EQ(j["other_processes_bytes"], 1736441856u);
  EXPECT_EQ(j["allocator_env_var"], "PYTORCH_ALLOC_CONF");
  EXPECT_EQ(j["torch_generation"], "2.10");
  ASSERT_GE(j["levers"].size(), 1u);
  EXPECT_EQ(j["levers"][0]["name"], "free_card");
  EXPECT_EQ(j["levers"][0]["changes_policy"], false);
  EXPECT_TRUE(j["levers"][0]["why"].is_string());
}

TEST(CliMemOom, ReportJsonAndSummaryLine) {
  fs::path rep = tmp_dir() / "report.json";
  CliRun r = vlac("mem oom --report-json " + sh_quote(rep.string()) + " " + sh_quote(fixture("27_comfyui_7440_mps_gib_repeated.txt")));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("peak"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(rep));
  EXPECT_NE(r.out.find("PyTorch MPS out of memory"), std::string::npos);
}

TEST(CliMemOom, BadInputExitsTwoWithOneLine) {
  fs::path d = tmp_dir();
  std::ofstream(d / "empty.log").close();
  std::ofstream(d / "not_oom.log") << "epoch 3 loss 0.21\nRuntimeError: CUDA error: out of memory\n";
  {
    std::mt19937 rng(7);
    std::ofstream f(d / "garbage.bin", std::ios::binary);
    for (int i = 0; i < (1 << 20); ++i) f.put(static_cast<char>(rng()));
  }
  struct C { std::string args; std::string has; };
  const C cases[] = {
      {sh_quote((d / "empty.log").string()), "no PyTorch out-of-memory message found in " + (d / "empty.log").string()},
      {sh_quote((d / "not_oom.log").string()), "CUDA error: out of memory"},
      {sh_quote((d / "garbage.bin").string()), "no PyTorch out-of-memory message found in"},
      {"- < " + sh_quote((d / "not_oom.log").string()), "no PyTorch out-of-memory message found in stdin"},
      {sh_quote((d / "missing.log").string()), "no such file"},
      {sh_quote(d.string()), "is a directory"},
  };
  for (const auto& c : cases) {
    CliRun r = vlac("mem oom --quiet " + c.args);
    EXPECT_EQ(r.rc, 2) << c.args << "\n" << r.err;
    EXPECT_EQ(lines(r.err), 1u) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.has), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << c.args;
  }
  CliRun flag = vlac("mem oom --no-such-flag " + sh_quote(fixture("guide_80gb.txt")));
  EXPECT_NE(flag.rc, 0);
}

TEST(CliMemOom, EveryFixtureThroughTheBinary) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/oom")) {
    if (e.path().extension() != ".txt") continue;
    ++n;
    CliRun r = vlac("mem oom --json --quiet " + sh_quote(e.path().string()));
    ASSERT_EQ(r.rc, 0) << e.path() << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << e.path();
    EXPECT_FALSE(j["levers"].empty()) << e.path();
  }
  EXPECT_GE(n, 34u);
}

}  // namespace
