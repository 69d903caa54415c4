// GR00T N1.7's table. The per-module counts are those of the model code's own tensor list
// (lerobot 0.6.1's port, measured: tests/fixtures/train_memory/groot_n17_tensors.json; the
// tensor-by-tensor check is TrainMemory.GrootTableMatchesTheModelCode) and NVIDIA's "~3B
// parameter model" (hardware_recommendation.md, the checkpoint name GR00T-N1.7-3B).
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
  EXPECT_EQ(per["language"], 1116542976ull);         // 16 kept layers x 50.3M (incl. q/k norms) + embedding + norm
  EXPECT_EQ(per["dit"], 1091722240ull);              // 16 cross + 16 self blocks + time/out projections
  EXPECT_EQ(per["projectors"], 327356544ull);        // 32-embodiment state/action MLPs + positions
  EXPECT_EQ(per["vlln"], 201437184ull);              // vlln LayerNorm + 4 VL self-attention blocks
  // 256 px -> 16 x 16 patches -> 64 merged tokens per camera.
  EXPECT_EQ(a->image_tokens_per_cam, 64);
}

TEST(GrootArch, FullBackboneIsAboutThreeBillion) {
  // The checkpoint name "GR00T-N1.7-3B": the model as loaded -- LLM layers above select_layer 16
  // popped (qwen3_backbone.py) -- holds 3.14B parameters (measured).
  GrootDims d;
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
