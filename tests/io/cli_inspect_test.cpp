// `vlac inspect` end to end: runs the built CLI (VLAC_BINARY) on small files written here and
// checks the exit code, the JSON fields (exact bytes) and the one-line error on a bad file.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_test_util.h"
#include "st_test_util.h"

namespace vlac {
namespace {

using nlohmann::json;
using testing::good_st;
using testing::TempDir;
using testing::write_bytes;

// `vlac ARGS` (shell text, quoted by the caller), stdout and stderr apart.
using CliRun = clitest::Apart;
CliRun run_vlac(const std::string& args) { return clitest::run_vlac_apart(args); }

TEST(CliInspect, JsonOfSmallFile) {
  TempDir dir;
  std::string path = dir.file("m.safetensors");
  const std::string bytes = good_st({{"enc.w", "F32", {2, 3}, 4}, {"enc.b", "BF16", {3}, 2}, {"dec.w", "U8", {0}, 1}},
                                    "{\"format\":\"pt\"}");
  write_bytes(path, bytes);
  CliRun r = run_vlac("inspect --json --quiet " + clitest::sh_quote(path));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  json j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["n_tensors"], 3);
  EXPECT_EQ(j["total_bytes"], 30);
  ASSERT_EQ(j["tensors"].size(), 3u);
  EXPECT_EQ(j["tensors"][0]["name"], "enc.w");
  EXPECT_EQ(j["tensors"][0]["dtype"], "F32");
  EXPECT_EQ(j["tensors"][0]["shape"], json::array({2, 3}));
  EXPECT_EQ(j["tensors"][0]["bytes"], 24);
  EXPECT_EQ(j["tensors"][0]["file"], "m.safetensors");
  EXPECT_EQ(j["totals"]["by_prefix"]["enc"]["bytes"], 30);
  EXPECT_EQ(j["totals"]["by_prefix"]["enc"]["tensors"], 2);
  EXPECT_EQ(j["totals"]["by_prefix"]["dec"]["bytes"], 0);
  EXPECT_EQ(j["totals"]["by_dtype"]["BF16"]["bytes"], 6);
  EXPECT_EQ(j["totals"]["by_dtype"]["F32"]["tensors"], 1);
  EXPECT_EQ(j["metadata"]["format"], "pt");
  ASSERT_EQ(j["files"].size(), 1u);
  EXPECT_EQ(j["files"][0]["kind"], "weights");
  EXPECT_EQ(j["files"][0]["name"], "m.safetensors");
  EXPECT_EQ(j["files"][0]["path"], path);
  EXPECT_EQ(j["files"][0]["bytes"], bytes.size());
  EXPECT_TRUE(j["config"].is_null());
}

TEST(CliInspect, PolicyFolder) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors"),
              good_st({{"model.a.x", "F32", {4}, 4}, {"model.a.y", "F32", {4}, 4}, {"model.b.z", "F16", {2}, 2}}));
  write_bytes(dir.file("config.json"),
              "{\"type\":\"pi05\",\"chunk_size\":50,\"input_features\":{\"observation.state\":{\"type\":\"STATE\","
              "\"shape\":[32]}},\"unrelated\":1}");
  write_bytes(dir.file("policy_preprocessor.json"), "{}");
  write_bytes(dir.file("policy_preprocessor_step_3_normalizer_processor.safetensors"), good_st({}));
  CliRun r = run_vlac("inspect --json --quiet " + clitest::sh_quote(dir.path()));
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["kind"], "policy");
  EXPECT_EQ(j["config"]["type"], "pi05");
  EXPECT_EQ(j["config"]["chunk_size"], 50);
  EXPECT_EQ(j["config"]["input_features"]["observation.state"]["shape"], json::array({32}));
  EXPECT_FALSE(j["config"].contains("unrelated"));
  // All names start with "model.": grouped by two components.
  EXPECT_EQ(j["totals"]["by_prefix"]["model.a"]["bytes"], 32);
  EXPECT_EQ(j["totals"]["by_prefix"]["model.b"]["bytes"], 4);
  std::map<std::string, std::string> kinds;
  for (const auto& f : j["files"]) kinds[f["name"]] = f["kind"];
  EXPECT_EQ(kinds["config.json"], "config");
  EXPECT_EQ(kinds["model.safetensors"], "weights");
  EXPECT_EQ(kinds["policy_preprocessor.json"], "processor");
  EXPECT_EQ(kinds["policy_preprocessor_step_3_normalizer_processor.safetensors"], "stats");

  // Human output names the config and the tensors.
  CliRun h = run_vlac("inspect " + clitest::sh_quote(dir.path()));
  ASSERT_EQ(h.rc, 0) << h.err;
  EXPECT_NE(h.out.find("config.json declares"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("model.b.z"), std::string::npos);
  EXPECT_NE(h.out.find("observation.state"), std::string::npos);
  EXPECT_NE(h.err.find("peak:"), std::string::npos) << h.err;  // the meter's summary line
}

TEST(CliInspect, BadFileIsOneLineExitTwo) {
  TempDir dir;
  std::string path = dir.file("bad.safetensors");
  write_bytes(path, testing::st_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}"));
  CliRun r = run_vlac("inspect --quiet " + clitest::sh_quote(path));
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(r.out, "");
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line: " << r.err;
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tensor 'w'"), std::string::npos) << r.err;

  CliRun m = run_vlac("inspect --quiet " + clitest::sh_quote(dir.file("missing.safetensors")));
  EXPECT_EQ(m.rc, 2);
  EXPECT_NE(m.err.find("missing.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace vlac
