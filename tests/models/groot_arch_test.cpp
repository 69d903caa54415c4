// GR00T N1.7's table, built from documented sizes (NVIDIA/Isaac-GR00T gr00t/configs/model/
// gr00t_n1d7.py and gr00t/model/modules/dit.py; Qwen3-VL-2B configs). The checks are the
// arithmetic of those sizes and NVIDIA's "~3B parameter model" (hardware_recommendation.md).
#include <gtest/gtest.h>

#include <map>

#include "models/groot_arch.h"

namespace vlac {

TEST(GrootArch, ModuleCounts) {
  auto a = groot_policy_arch(GrootDims{}, default_policy_inputs(PolicyKind::GrootN17));
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  std::map<std::string, uint64_t> per;
  for (const auto& p : a->params) per[a->modules[p.module].name] += p.numel();
  EXPECT_EQ(per["vision"], 406957056ull);            // ViT 24 x 12.6M + patch/pos + 4 mergers
  EXPECT_EQ(per["language"], 915198976ull);          // 12 kept layers x 50.3M (incl. q/k norms) + embedding + norm
  EXPECT_EQ(per["dit"], 550386688ull);               // 8 cross + 8 self blocks + time/out projections
  EXPECT_EQ(per["projectors"], 327356544ull);        // 32-embodiment state/action MLPs + positions
  EXPECT_EQ(per["vlln"], 4096ull);
  // 256 px -> 16 x 16 patches -> 64 merged tokens per camera.
  EXPECT_EQ(a->image_tokens_per_cam, 64);
}

TEST(GrootArch, FullBackboneIsAboutThreeBillion) {
  // The checkpoint name "GR00T-N1.7-3B": with all 28 Cosmos-Reason2-2B LLM layers the model is
  // ~3B; training drops the layers above select_layer (qwen3_backbone.py pops them).
  GrootDims d;
  d.select_layer = d.lm_layers_total;
  auto a = groot_policy_arch(d, default_policy_inputs(PolicyKind::GrootN17));
  ASSERT_TRUE(a.is_ok());
  uint64_t all = 0;
  for (const auto& p : a->params) all += p.numel();
  EXPECT_NEAR(static_cast<double>(all) / 1e9, 3.0, 0.15);
}

TEST(GrootArch, RejectsImagesOffThePatchGrid) {
  PolicyInputs in = default_policy_inputs(PolicyKind::GrootN17);
  in.image_h = in.image_w = 250;
  EXPECT_EQ(groot_policy_arch(GrootDims{}, in).status().exit_code(), 2);
}

}  // namespace vlac
