// The pi0.5 tensor table reproduces the parameter counts of ../shared/spec/pi05.md section 2.4.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "models/pi05_arch.h"

namespace vlac {

static uint64_t count(const std::vector<WeightSpec>& w, bool (*keep)(const WeightSpec&)) {
  uint64_t n = 0;
  for (const auto& s : w)
    if (keep(s)) n += s.numel();
  return n;
}

TEST(Pi05Arch, FullSizeCountsMatchSpec) {
  auto ft = pi05_weights(Pi05Dims::full(), Pi05Layout::FineTune);
  auto base = pi05_weights(Pi05Dims::full(), Pi05Layout::Base);
  // Section 2.4: lerobot fine-tune file (embed_tokens + both lm_heads) and pi05_base layout.
  EXPECT_EQ(count(ft, [](const WeightSpec&) { return true; }), 4143404816ull);
  EXPECT_EQ(count(base, [](const WeightSpec&) { return true; }), 3616757520ull);
  // Unique weights without lm_heads, and what inference strictly reads.
  EXPECT_EQ(count(ft, [](const WeightSpec& s) { return s.part != Pi05Part::LmHead; }), 3353433872ull);
  EXPECT_EQ(count(ft, [](const WeightSpec& s) { return s.read_at_inference; }), 3244377872ull);
  EXPECT_EQ(count(ft, [](const WeightSpec& s) { return s.part == Pi05Part::Vision; }), 412442352ull);
  EXPECT_EQ(count(ft, [](const WeightSpec& s) { return s.part == Pi05Part::Expert; }), 427932672ull);
  EXPECT_EQ(count(ft, [](const WeightSpec& s) { return s.part == Pi05Part::Heads; }), 2165792ull);
  // 811 used tensors + 2 lm_heads in the fine-tune layout.
  EXPECT_EQ(ft.size(), 813u);
  std::set<std::string> names;
  for (const auto& s : ft) EXPECT_TRUE(names.insert(s.name).second) << s.name;
  EXPECT_EQ(ft.front().name.rfind("model.", 0), 0u);
  EXPECT_NE(base.front().name.rfind("model.", 0), 0u);
}

TEST(Pi05Arch, DimsFromConfig) {
  nlohmann::json c = pi05_config_json(Pi05Dims::demo(), 2, 8, 7);
  auto d = pi05_dims_from_config(c, "config.json");
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  // Variant names fix the Gemma sizes, as in lerobot; image size and SigLIP heads come from keys.
  EXPECT_EQ(d->lm_width, 2048);
  EXPECT_EQ(d->expert_width, 1024);
  EXPECT_EQ(d->image_size, 56);
  EXPECT_EQ(d->vision_heads, 4);
  c["paligemma_variant"] = "gemma_7b";
  auto bad = pi05_dims_from_config(c, "cfg/config.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("cfg/config.json"), std::string::npos);
  EXPECT_EQ(bad.status().exit_code(), 2);
  c["paligemma_variant"] = "gemma_2b";
  c["image_resolution"] = {224, 256};
  EXPECT_FALSE(pi05_dims_from_config(c, "config.json").is_ok());
}

TEST(Pi05Arch, DemoDimsAreValidAndSmall) {
  Pi05Dims d = Pi05Dims::demo();
  ASSERT_TRUE(d.validate().is_ok());
  auto w = pi05_weights(d, Pi05Layout::FineTune);
  uint64_t n = 0;
  for (const auto& s : w) n += s.numel();
  EXPECT_LT(n * 4, 8ull << 20);  // well under 8 MiB in fp32
}

}  // namespace vlac
