// End-to-end tests of `vlac mem plan` through the built binary: the human table, JSON with exact
// bytes, a lerobot config.json, and exit code 2 with one clear line for every kind of bad input.
#include <gtest/gtest.h>

#include <algorithm>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_test_util.h"
#include "models/pi05_arch.h"

namespace {

namespace fs = std::filesystem;

// One folder for the file's tests, removed at exit.
fs::path tmp_dir() {
  static ::vlac::clitest::TempDir d("cli-plan");
  return d.path();
}

// Runs `vlac mem plan <args>` through the shell; `args` is already quoted.
using CliRun = ::vlac::clitest::Apart;
CliRun vlac(const std::string& args) { return ::vlac::clitest::run_vlac_apart("mem plan " + args); }

size_t lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

fs::path write(const std::string& name, const std::string& text) {
  fs::path p = tmp_dir() / name;
  std::ofstream(p) << text;
  return p;
}

TEST(CliMemPlan, Pi05On24GiBNamesTheLevers) {
  CliRun r = vlac("--policy pi05 --gpu 24GiB --quiet");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("does NOT fit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cheapest levers"), std::string::npos);
  EXPECT_NE(r.out.find("[changes the policy]"), std::string::npos);
  for (const char* m : {"vision", "projector", "language", "expert", "heads"})
    EXPECT_NE(r.out.find(m), std::string::npos) << m;
  EXPECT_NE(r.out.find("GiB"), std::string::npos);
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(CliMemPlan, JsonHasExactBytesAndEveryPolicyRuns) {
  for (const char* p : {"pi05", "pi0", "smolvla", "act", "groot-n1.7"}) {
    CliRun r = vlac(std::string("--policy ") + p + " --gpu H100 --json --quiet");
    ASSERT_EQ(r.rc, 0) << p << ": " << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_TRUE(j["total_bytes"].is_number_unsigned()) << p;
    EXPECT_EQ(j["gpu"]["name"], "H100");
    auto u = [&](const char* k) { return j[k].get<uint64_t>(); };
    const uint64_t persistent = u("weight_bytes") + u("optimizer_bytes") + u("ddp_bucket_bytes") + u("gather_bytes");
    EXPECT_EQ(persistent, u("persistent_bytes")) << p;
    EXPECT_EQ(persistent + u("input_bytes") + u("activation_bytes") + u("working_bytes") + u("autocast_copy_bytes") +
                  u("workspace_bytes"),
              u("forward_peak_bytes")) << p;
    EXPECT_EQ(persistent + u("input_bytes") + u("grad_bytes") + u("optimizer_temp_bytes") + u("workspace_bytes"),
              u("optimizer_peak_bytes")) << p;
    EXPECT_EQ(std::max(u("forward_peak_bytes"), u("optimizer_peak_bytes")), u("peak_allocated_bytes")) << p;
    EXPECT_EQ(u("peak_allocated_bytes") + u("allocator_bytes"), u("peak_reserved_bytes")) << p;
    EXPECT_EQ(u("peak_reserved_bytes") + u("cuda_context_bytes"), u("total_bytes")) << p;
    EXPECT_GT(j["modules"].size(), 3u);
  }
}

TEST(CliMemPlan, FlagsChangeThePlan) {
  auto total = [](const std::string& args) {
    CliRun r = vlac(args + " --json --quiet");
    EXPECT_EQ(r.rc, 0) << args << ": " << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_discarded() ? 0ull : j["total_bytes"].get<uint64_t>();
  };
  const uint64_t base = total("--policy pi05 --gpu H100");
  EXPECT_LT(total("--policy pi05 --gpu H100 --dtype bf16"), base);
  EXPECT_LT(total("--policy pi05 --gpu H100 --gradient-checkpointing"), base);
  EXPECT_LT(total("--policy pi05 --gpu H100 --batch 2"), base);
  EXPECT_LT(total("--policy pi05 --gpu H100 --train-expert-only"), total("--policy pi05 --gpu H100 --freeze-vision"));
  EXPECT_LT(total("--policy pi05 --gpu H100 --lora-r 16"), base);
  EXPECT_LT(total("--policy pi05 --gpu H100 --cams 1"), base);
  EXPECT_LT(total("--policy pi05 --gpu H100 --gpus 8 --shard fsdp"), total("--policy pi05 --gpu H100 --gpus 8 --shard zero1"));
  EXPECT_GT(total("--policy smolvla --gpu H100 --image-size 512"), total("--policy smolvla --gpu H100 --image-size 256"));
  EXPECT_GT(total("--policy groot-n1.7 --gpu H100 --tune-llm"), total("--policy groot-n1.7 --gpu H100"));
  EXPECT_EQ(total("--policy pi05 --gpu H100 --optimizer adamw8bit") < base, true);
}

TEST(CliMemPlan, ReadsALerobotConfig) {
  nlohmann::json c = vlac::pi05_config_json(vlac::Pi05Dims::full(), 2, 8, 7, 10);
  c["dtype"] = "bfloat16";
  c["train_expert_only"] = true;
  fs::path p = write("config.json", c.dump());
  CliRun r = vlac("--policy pi05 --config '" + p.string() + "' --gpu RTX4090 --json --quiet");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["inputs"]["cams"], 2);
  EXPECT_EQ(j["inputs"]["chunk"], 10);
  EXPECT_EQ(j["inputs"]["prompt_tokens"], 200);
  EXPECT_EQ(j["options"]["dtype"], "bf16");
  EXPECT_EQ(j["options"]["train_expert_only"], true);
  EXPECT_EQ(j["params"], 4143404816ull);  // lerobot 0.6.1 + transformers 5.17: PaliGemma lm_head untied
}

TEST(CliMemPlan, BadInputIsOneLineAndExitTwo) {
  fs::path broken = write("broken.json", "{\"chunk_size\": ");
  fs::path wrong = write("wrong.json", "{\"chunk_size\": \"fifty\"}");
  fs::path variant = write("variant.json", "{\"paligemma_variant\": \"gemma_7b\"}");
  const std::pair<std::string, std::string> cases[] = {
      {"--gpu H100", "--policy"},
      {"--policy pi05", "--gpu"},
      {"--policy pi6 --gpu H100", "pi6"},
      {"--policy pi05 --gpu GTX9000", "GTX9000"},
      {"--policy pi05 --gpu H100 --batch abc", "--batch"},
      {"--policy pi05 --gpu H100 --batch 0", "--batch"},
      {"--policy pi05 --gpu H100 --dtype fp8", "--dtype"},
      {"--policy pi05 --gpu H100 --mixed-precision yes", "--mixed-precision"},
      {"--policy pi05 --gpu H100 --optimizer lion", "--optimizer"},
      {"--policy pi05 --gpu H100 --shard zero4 --gpus 2", "--shard"},
      {"--policy pi05 --gpu H100 --shard zero2", "--gpus"},
      {"--policy pi05 --gpu H100 --image-size 448", "224"},
      {"--policy pi05 --gpu H100 --lora-targets q_proj", "--lora-r"},
      {"--policy pi05 --gpu H100 --lora-r 8 --lora-targets nothing", "--lora-targets"},
      {"--policy pi05 --gpu H100 --config /nonexistent/config.json", "/nonexistent/config.json"},
      {"--policy pi05 --gpu H100 --config '" + broken.string() + "'", "broken.json"},
      {"--policy pi05 --gpu H100 --config '" + wrong.string() + "'", "chunk_size"},
      {"--policy pi05 --gpu H100 --config '" + variant.string() + "'", "gemma_7b"},
      {"--policy groot-n1.7 --gpu H100 --config '" + wrong.string() + "'", "--config"},
  };
  for (const auto& [args, needle] : cases) {
    CliRun r = vlac(args + " --quiet");
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_EQ(lines(r.err), 1u) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args;
  }
}

}  // namespace
