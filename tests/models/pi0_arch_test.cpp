// pi0's table reproduces ../shared/spec/pi05.md section 7.1 (params used 3,238,048,528; expert
// 311,464,960; projections 3,248,160) and the lerobot/pi0 file count of section 2.4.
#include <gtest/gtest.h>

#include <set>

#include "models/pi0_arch.h"

namespace vlac {

TEST(Pi0Arch, CountsMatchSpec) {
  const Pi05Dims d = Pi05Dims::full();
  auto ft = pi0_weights(d, Pi05Layout::FineTune);
  uint64_t used = 0, expert = 0, heads = 0;
  for (const auto& w : ft) {
    if (w.part != Pi05Part::LmHead) used += w.numel();
    if (w.part == Pi05Part::Expert) expert += w.numel();
    if (w.part == Pi05Part::Heads) heads += w.numel();
  }
  EXPECT_EQ(used, 3238048528ull);
  EXPECT_EQ(expert, 311464960ull);
  EXPECT_EQ(heads, 3248160ull);
  // Base layout (lm_head doubles as the embedding, plus the expert lm_head): the lerobot/pi0 file.
  uint64_t base = 0;
  for (const auto& w : pi0_weights(d, Pi05Layout::Base)) base += w.numel();
  EXPECT_EQ(base, 3501372176ull);
  std::set<std::string> names;
  for (const auto& w : ft) EXPECT_TRUE(names.insert(w.name).second) << w.name;
  EXPECT_TRUE(names.count("model.state_proj.weight"));
  EXPECT_TRUE(names.count("model.action_time_mlp_in.weight"));
  EXPECT_TRUE(names.count("model.paligemma_with_expert.gemma_expert.model.layers.0.input_layernorm.weight"));
  EXPECT_FALSE(names.count("model.time_mlp_in.weight"));
  for (const auto& w : ft) EXPECT_EQ(w.name.find(".dense."), std::string::npos) << w.name;
}

TEST(Pi0Arch, PolicyArchModules) {
  PolicyInputs in = default_policy_inputs(PolicyKind::Pi0);
  auto a = build_policy_arch(PolicyKind::Pi0, in);
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  uint64_t used = 0, all = 0;
  for (const auto& p : a->params) {
    all += p.numel();
    if (a->modules[p.module].role != ModuleRole::Unused) used += p.numel();
  }
  EXPECT_EQ(used, 3238048528ull);
  EXPECT_EQ(all, 3238048528ull + 263323648ull);  // + untrained expert lm_head, never reached by the loss
  // 3 cameras x 256 + 48 prompt tokens; suffix = state token + 50 actions.
  EXPECT_EQ(a->prefix_tokens, 3 * 256 + 48);
}

}  // namespace vlac
