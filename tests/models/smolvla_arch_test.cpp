// SmolVLA's table reproduces ../shared/spec/pi05.md section 7.2: SigLIP 86.4M, connector 11.8M,
// 16 text layers 157.3M + embedding 47.3M, expert 98.2M, projections 1.6M, ~403M used, ~450M stored.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "models/smolvla_arch.h"

namespace vlac {

TEST(SmolVlaArch, CountsMatchSpec) {
  auto a = build_policy_arch(PolicyKind::SmolVla, PolicyInputs{});
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  std::map<std::string, uint64_t> per;
  uint64_t all = 0;
  std::set<std::string> names;
  for (const auto& p : a->params) {
    per[a->modules[p.module].name] += p.numel();
    all += p.numel();
    EXPECT_TRUE(names.insert(p.name).second) << p.name;
  }
  EXPECT_EQ(per["vision"], 86433024ull);
  EXPECT_EQ(per["connector"], 11796480ull);
  EXPECT_EQ(per["language"], 157317120ull + 47308800ull + 960ull);  // layers + embedding + final norm
  EXPECT_EQ(per["expert"], 98245840ull);
  EXPECT_EQ(per["heads"], 1635152ull);
  EXPECT_EQ(per["lm_head"], 47308800ull);
  EXPECT_EQ(all - per["lm_head"], 402737376ull);  // "~403M used"
  EXPECT_EQ(all, 450046176ull);                   // "~450M as stored"
  // 64 tokens per 512 px camera after pixel shuffle; prefix = 3 x 64 + 48 + state token.
  EXPECT_EQ(a->image_tokens_per_cam, 64);
  EXPECT_EQ(a->prefix_tokens, 3 * 64 + 48 + 1);
  // lerobot defaults: the whole VLM frozen, expert and projections trained.
  EXPECT_FALSE(a->modules[a->module_index("vision")].trainable_default);
  EXPECT_FALSE(a->modules[a->module_index("language")].trainable_default);
  EXPECT_TRUE(a->modules[a->module_index("expert")].trainable_default);
}

TEST(SmolVlaArch, RejectsImageSizesThePixelShuffleCannotTake) {
  PolicyInputs in;
  in.image_h = in.image_w = 500;
  EXPECT_EQ(build_policy_arch(PolicyKind::SmolVla, in).status().exit_code(), 2);
  in.image_h = in.image_w = 384;  // 24 x 24 patches, shuffled by 4 -> 36 tokens
  auto a = build_policy_arch(PolicyKind::SmolVla, in);
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  EXPECT_EQ(a->image_tokens_per_cam, 36);
}

}  // namespace vlac
