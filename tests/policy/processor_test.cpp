// The processor spec from bytes (as a package stores it) and its pure steps: normalizer modes with
// lerobot's epsilon rule, state discretization, task cleaning, prompt, relative-action mask,
// tokenizer truncation/padding, and one clear error per bad processor file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "policy/pi05_processor.h"
#include "policy/tokenizer.h"

using namespace vlac;

namespace {

const std::string kFixtures = std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/pi05";

std::span<const uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// A safetensors file in memory with F32 tensors.
std::string safetensors(const std::vector<std::pair<std::string, std::vector<float>>>& ts) {
  std::string header = "{";
  size_t off = 0;
  std::string data;
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& [name, v] = ts[i];
    header += (i ? "," : "") + std::string("\"") + name + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(v.size()) +
              "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + v.size() * 4) + "]}";
    data.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    off += v.size() * 4;
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

Pi05Normalizer normalizer(NormMode mode, std::vector<float> a, std::vector<float> b, const char* na, const char* nb) {
  Pi05Normalizer n;
  n.origin = "test";
  n.norm_map["STATE"] = mode;
  n.stats["observation.state"][na] = std::move(a);
  n.stats["observation.state"][nb] = std::move(b);
  return n;
}

const char* kPre = R"({"name": "policy_preprocessor", "steps": [
  {"registry_name": "rename_observations_processor", "config": {"rename_map": {"cam0": "observation.images.base"}}},
  {"registry_name": "to_batch_processor", "config": {}},
  {"registry_name": "relative_actions_processor", "config": {"enabled": true, "exclude_joints": ["gripper"], "action_names": ["a", "Left_Gripper", "b"]}},
  {"registry_name": "normalizer_processor", "config": {"eps": 1e-08,
     "features": {"observation.state": {"type": "STATE", "shape": [3]}, "action": {"type": "ACTION", "shape": [3]}},
     "norm_map": {"VISUAL": "IDENTITY", "STATE": "MIN_MAX", "ACTION": "QUANTILE10"}},
   "state_file": "pre_stats.safetensors"},
  {"registry_name": "pi05_prepare_state_tokenizer_processor_step", "config": {}},
  {"registry_name": "tokenizer_processor", "config": {"max_length": 20, "task_key": "task", "padding_side": "right",
     "padding": "max_length", "truncation": true, "tokenizer_name": "tokenizer"}},
  {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": null}}]})";
const char* kPost = R"({"name": "policy_postprocessor", "steps": [
  {"registry_name": "unnormalizer_processor", "config": {"eps": 1e-08, "features": {"action": {"type": "ACTION", "shape": [3]}},
     "norm_map": {"STATE": "MIN_MAX", "ACTION": "QUANTILE10"}}, "state_file": "post_stats.safetensors"},
  {"registry_name": "absolute_actions_processor", "config": {"enabled": true}},
  {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": null}}]})";

}  // namespace

TEST(Normalizer, ModesMatchLerobotFormulas) {
  const std::vector<float> x{0.5f, 2.0f, -1.0f};
  {
    Pi05Normalizer n = normalizer(NormMode::Quantiles, {0.0f, 1.0f, -2.0f}, {1.0f, 1.0f, 2.0f}, "q01", "q99");
    std::vector<float> v = x;
    ASSERT_TRUE(n.apply("observation.state", "STATE", v.data(), 3, false, 3).is_ok());
    EXPECT_EQ(v[0], 2.0f * (0.5f - 0.0f) / 1.0f - 1.0f);
    EXPECT_EQ(v[1], 2.0f * (2.0f - 1.0f) / 1e-8f - 1.0f);  // q99 == q01: denominator eps
    EXPECT_EQ(v[2], 2.0f * (-1.0f + 2.0f) / 4.0f - 1.0f);
    ASSERT_TRUE(n.apply("observation.state", "STATE", v.data(), 3, true, 3).is_ok());
    EXPECT_NEAR(v[0], 0.5f, 1e-7);
    EXPECT_NEAR(v[2], -1.0f, 1e-7);
  }
  {
    Pi05Normalizer n = normalizer(NormMode::MeanStd, {1.0f, 0.0f, 0.0f}, {2.0f, 0.0f, 4.0f}, "mean", "std");
    std::vector<float> v = x;
    ASSERT_TRUE(n.apply("observation.state", "STATE", v.data(), 3, false, 3).is_ok());
    EXPECT_EQ(v[0], (0.5f - 1.0f) / (2.0f + 1e-8f));
    EXPECT_EQ(v[1], 2.0f / 1e-8f);  // std 0: divided by eps
    std::vector<float> u{1.0f, 1.0f, 1.0f};
    ASSERT_TRUE(n.apply("observation.state", "STATE", u.data(), 3, true, 3).is_ok());
    EXPECT_EQ(u, (std::vector<float>{3.0f, 0.0f, 4.0f}));  // inverse x·std + mean (no eps)
  }
  {
    Pi05Normalizer n = normalizer(NormMode::MinMax, {0.0f, 0.0f, 0.0f}, {4.0f, 0.0f, 2.0f}, "min", "max");
    std::vector<float> v = x;
    ASSERT_TRUE(n.apply("observation.state", "STATE", v.data(), 3, false, 3).is_ok());
    EXPECT_EQ(v[0], 2.0f * 0.5f / 4.0f - 1.0f);
    EXPECT_EQ(v[1], 2.0f * 2.0f / 1e-8f - 1.0f);
    std::vector<float> u{1.0f, 1.0f, -1.0f};
    ASSERT_TRUE(n.apply("observation.state", "STATE", u.data(), 3, true, 3).is_ok());
    EXPECT_EQ(u, (std::vector<float>{4.0f, 1e-8f, 0.0f}));
  }
  {
    Pi05Normalizer n = normalizer(NormMode::Quantile10, {0.0f, 0.0f, 0.0f}, {2.0f, 2.0f, 2.0f}, "q10", "q90");
    std::vector<float> v = x;
    ASSERT_TRUE(n.apply("observation.state", "STATE", v.data(), 3, false, 3).is_ok());
    EXPECT_EQ(v[0], -0.5f);
    EXPECT_EQ(v[1], 1.0f);
  }
  {
    // IDENTITY, or a key without stats: unchanged.
    Pi05Normalizer n = normalizer(NormMode::Identity, {0, 0, 0}, {1, 1, 1}, "q01", "q99");
    std::vector<float> v = x;
    ASSERT_TRUE(n.apply("observation.state", "STATE", v.data(), 3, false, 3).is_ok());
    EXPECT_EQ(v, x);
    n.norm_map["STATE"] = NormMode::Quantiles;
    ASSERT_TRUE(n.apply("observation.other", "STATE", v.data(), 3, false, 3).is_ok());
    EXPECT_EQ(v, x);
  }
}

TEST(Normalizer, MissingOrMisfitStatsAreClearErrors) {
  Pi05Normalizer n = normalizer(NormMode::Quantiles, {0, 0, 0}, {1, 1, 1}, "mean", "std");
  std::vector<float> v{0, 0, 0};
  Status st = n.apply("observation.state", "STATE", v.data(), 3, false, 3);
  EXPECT_EQ(st.code(), StatusCode::InvalidFormat);
  EXPECT_NE(st.message().find("observation.state.q01"), std::string::npos) << st.message();
  n = normalizer(NormMode::Quantiles, {0, 0}, {1, 1}, "q01", "q99");
  st = n.apply("observation.state", "STATE", v.data(), 3, false, 3);
  EXPECT_EQ(st.code(), StatusCode::ShapeMismatch) << st.message();
}

TEST(StatePrompt, DiscretizeLikeNumpyDigitize) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> s{-1.0f, std::nextafter(-1.0f, -2.0f), 1.0f, 0.99f, 0.0f, -1e-30f, 1e-30f, 5e7f, nan,
                             -1.0f + 1.0f / 128.0f, std::nextafter(-1.0f + 1.0f / 128.0f, -1.0f)};
  const std::vector<int> want{0, -1, 255, 254, 128, 127, 128, 255, 255, 1, 0};
  EXPECT_EQ(pi05_discretize_state(s.data(), s.size()), want);
}

TEST(StatePrompt, TaskCleaningAndFormat) {
  EXPECT_EQ(pi05_clean_task("  pick_up the red cube\nthen stop "), "pick up the red cube then stop");
  EXPECT_EQ(pi05_clean_task("\t\r\n a_b \x0b\x0c"), "a b");
  EXPECT_EQ(pi05_clean_task("\xc2\xa0stack\xe3\x80\x80"), "stack");  // NBSP, ideographic space
  EXPECT_EQ(pi05_clean_task("Keep\tTabs\rAnd CASE"), "Keep\tTabs\rAnd CASE");
  EXPECT_EQ(pi05_clean_task("   "), "");
  EXPECT_EQ(pi05_prompt("fold_it", {0, -1, 255}), "Task: fold it, State: 0 -1 255;\nAction: ");
}

TEST(ProcessorSpec, ParsesFromBytesByFileName) {
  const std::string pre_stats = safetensors({{"observation.state.min", {0, 0, 0}}, {"observation.state.max", {2, 2, 2}}});
  const std::string post_stats = safetensors({{"action.q10", {0, 1, 2}}, {"action.q90", {1, 2, 3}}});
  const std::string pre = kPre, post = kPost;  // the spans below point into these
  ProcessorFiles in;
  in.origin = "pkg.vlac";
  in.files["policy_preprocessor.json"] = bytes(pre);
  in.files["policy_postprocessor.json"] = bytes(post);
  in.files["pre_stats.safetensors"] = bytes(pre_stats);
  in.files["post_stats.safetensors"] = bytes(post_stats);
  auto p = parse_pi05_processor(in);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_TRUE(p->has_preprocessor && p->has_postprocessor);
  EXPECT_EQ(p->rename_map.at("cam0"), "observation.images.base");
  EXPECT_TRUE(p->relative_enabled && p->absolute_enabled);
  EXPECT_EQ(p->relative_mask(4), (std::vector<bool>{true, false, true, true}));
  ASSERT_TRUE(p->normalizer && p->unnormalizer && p->tokenizer_step);
  EXPECT_EQ(p->normalizer->mode_for("observation.state", "STATE"), NormMode::MinMax);
  EXPECT_EQ(p->unnormalizer->mode_for("action", "ACTION"), NormMode::Quantile10);
  EXPECT_EQ(p->unnormalizer->stats.at("action").at("q90"), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(p->tokenizer_step->options.max_length, 20);
  EXPECT_FALSE(p->tokenizer);  // no tokenizer/tokenizer.model among the files
  // No processor files at all: an empty processor (no processing).
  auto none = parse_pi05_processor(ProcessorFiles{{}, "dir"});
  ASSERT_TRUE(none.is_ok());
  EXPECT_TRUE(none->empty());
}

TEST(ProcessorSpec, RelativeMaskRules) {
  Pi05Processor p;
  EXPECT_EQ(p.relative_mask(3), (std::vector<bool>{true, true, true}));  // no names, no exclusions
  p.exclude_joints = {"gripper"};
  EXPECT_EQ(p.relative_mask(2), (std::vector<bool>{true, true}));  // no names: all relative
  p.action_names = std::vector<std::string>{"shoulder_pan", "Right_Gripper", "GRIPPER", "wrist"};
  EXPECT_EQ(p.relative_mask(5), (std::vector<bool>{true, false, false, true, true}));
  p.exclude_joints = {""};
  EXPECT_EQ(p.relative_mask(2), (std::vector<bool>{true, true}));
}

TEST(ProcessorSpec, BadFilesGiveOneClearError) {
  const std::string stats = safetensors({{"action.q01", {0}}, {"action.q99", {1}}});
  auto parse = [&](const std::string& pre, const std::string& post, bool with_stats) {
    ProcessorFiles in;
    in.origin = "pol";
    if (!pre.empty()) in.files["policy_preprocessor.json"] = bytes(pre);
    if (!post.empty()) in.files["policy_postprocessor.json"] = bytes(post);
    if (with_stats) in.files["s.safetensors"] = bytes(stats);
    return parse_pi05_processor(in).status();
  };
  const std::string unknown = R"({"steps": [{"registry_name": "my_custom_step", "config": {}}]})";
  Status st = parse(unknown, "", false);
  EXPECT_EQ(st.code(), StatusCode::Unsupported);
  EXPECT_NE(st.message().find("my_custom_step"), std::string::npos) << st.message();
  const std::string missing_stats =
      R"({"steps": [{"registry_name": "unnormalizer_processor", "config": {}, "state_file": "s.safetensors"}]})";
  st = parse("", missing_stats, false);
  EXPECT_EQ(st.code(), StatusCode::NotFound);
  EXPECT_NE(st.message().find("s.safetensors"), std::string::npos) << st.message();
  EXPECT_TRUE(parse("", missing_stats, true).is_ok());
  const std::string bad_mode =
      R"({"steps": [{"registry_name": "unnormalizer_processor", "config": {"norm_map": {"ACTION": "LOG"}}}]})";
  st = parse("", bad_mode, false);
  EXPECT_EQ(st.code(), StatusCode::Unsupported);
  EXPECT_NE(st.message().find("LOG"), std::string::npos) << st.message();
  const std::string abs_only = R"({"steps": [{"registry_name": "absolute_actions_processor", "config": {"enabled": true}}]})";
  st = parse("", abs_only, false);
  EXPECT_EQ(st.code(), StatusCode::InvalidFormat);
  EXPECT_NE(st.message().find("relative_actions_processor"), std::string::npos) << st.message();
  st = parse("{\"steps\": [", "", false);
  EXPECT_EQ(st.code(), StatusCode::InvalidFormat);
  EXPECT_NE(st.message().find("policy_preprocessor.json"), std::string::npos) << st.message();
  const std::string bf16_dev =
      R"({"steps": [{"registry_name": "device_processor", "config": {"device": "cuda", "float_dtype": "bfloat16"}}]})";
  EXPECT_EQ(parse(bf16_dev, "", false).code(), StatusCode::Unsupported);
  const std::string bad_len =
      R"({"steps": [{"registry_name": "tokenizer_processor", "config": {"max_length": "long"}}]})";
  EXPECT_EQ(parse(bad_len, "", false).code(), StatusCode::InvalidFormat);
}

TEST(ProcessorSpec, FolderFileNamesForThePackager) {
  std::vector<std::string> names = pi05_processor_file_names(kFixtures + "/pipe_b_quantiles/policy");
  EXPECT_EQ(names, (std::vector<std::string>{"policy_preprocessor.json",
                                             "policy_preprocessor_step_3_normalizer_processor.safetensors",
                                             "policy_postprocessor.json",
                                             "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
                                             "tokenizer/tokenizer.model"}));
  names = pi05_processor_file_names(kFixtures + "/tiny_a/policy");
  EXPECT_EQ(names.size(), 4u);
  EXPECT_TRUE(pi05_processor_file_names(kFixtures + "/no_such_dir").empty());
  auto p = load_pi05_processor(kFixtures + "/pipe_b_meanstd_relative/policy");
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_TRUE(p->tokenizer != nullptr);
  EXPECT_TRUE(p->relative_enabled && p->absolute_enabled);
  EXPECT_EQ(p->relative_mask(7), (std::vector<bool>{true, true, true, true, true, false, false}));
  EXPECT_EQ(p->normalizer->mode_for("observation.state", "STATE"), NormMode::MeanStd);
}

TEST(Tokenizer, BosTruncationPaddingAndBadModels) {
  auto t = Tokenizer::from_path(kFixtures + "/tokenizer");  // a folder holding tokenizer.model
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  EXPECT_EQ(t->bos_id(), 2);
  EXPECT_EQ(t->pad_id(), 0);
  TokenizeOptions o;
  o.max_length = 64;
  auto full = tokenize_prompt(*t, "Task: fold the towel, State: 0 163;\nAction: ", o);
  ASSERT_TRUE(full.is_ok());
  ASSERT_EQ(full->ids.size(), 64u);
  EXPECT_EQ(full->ids[0], 2);
  size_t n = 0;
  for (uint8_t m : full->mask) n += m;
  ASSERT_GT(n, 8u);
  for (size_t i = n; i < 64; ++i) EXPECT_EQ(full->ids[i], 0);
  o.max_length = 8;  // truncation keeps BOS and the first 7 ids
  auto cut = tokenize_prompt(*t, "Task: fold the towel, State: 0 163;\nAction: ", o);
  ASSERT_TRUE(cut.is_ok());
  EXPECT_EQ(cut->ids, std::vector<int64_t>(full->ids.begin(), full->ids.begin() + 8));
  EXPECT_EQ(cut->mask, std::vector<uint8_t>(8, 1));
  o.max_length = 64;
  o.pad_left = true;
  auto left = tokenize_prompt(*t, "Task: x", o);
  ASSERT_TRUE(left.is_ok());
  EXPECT_EQ(left->mask.front(), 0);
  EXPECT_EQ(left->mask.back(), 1);
  size_t first = 0;
  while (first < 64 && !left->mask[first]) ++first;
  ASSERT_LT(first, 64u);
  EXPECT_EQ(left->ids[first], 2);  // BOS leads the real tokens, padding before it
  for (size_t i = 0; i < first; ++i) EXPECT_EQ(left->ids[i], 0);
  const std::string junk = "this is not a sentencepiece model";
  auto bad = Tokenizer::from_bytes(bytes(junk), "junk.model");
  EXPECT_EQ(bad.status().code(), StatusCode::InvalidFormat);
  EXPECT_NE(bad.status().message().find("junk.model"), std::string::npos);
  EXPECT_EQ(Tokenizer::from_path("/nonexistent/tokenizer.model").status().code(), StatusCode::NotFound);
}
