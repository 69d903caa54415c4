// ACT's table reproduces ../shared/spec/pi05.md section 7.3 (~51.6M for 14-dim: ResNet-18 trunk
// 11.17M with frozen BN as buffers, encoder 17.33M, decoder 5.39M, VAE encoder 17.38M, ~0.35M
// projections; ~34.2M used at inference) and torchvision's resnet18 count (11,689,512 with fc).
#include <gtest/gtest.h>

#include <map>

#include <nlohmann/json.hpp>

#include "models/act_arch.h"

namespace vlac {

TEST(ActArch, ResNet18TrunkMatchesTorchvision) {
  uint64_t conv = 0, bn = 0;
  for (const auto& t : resnet18_trunk_tensors()) {
    uint64_t n = 1;
    for (int64_t s : t.shape) n *= static_cast<uint64_t>(s);
    (t.is_buffer ? bn : conv) += n;
  }
  // torchvision resnet18: 11,689,512 parameters = convs + BN weight/bias (9,600) + fc (513,000).
  EXPECT_EQ(conv, 11689512ull - 9600ull - 513000ull);
  EXPECT_EQ(bn, 4ull * 4800ull);  // weight, bias, running_mean, running_var per BN channel
}

TEST(ActArch, CountsMatchSpec) {
  auto a = build_policy_arch(PolicyKind::Act, PolicyInputs{});
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  std::map<std::string, uint64_t> per;
  uint64_t params = 0;
  for (const auto& p : a->params) {
    if (p.is_buffer) continue;
    per[a->modules[p.module].name] += p.numel();
    params += p.numel();
  }
  EXPECT_EQ(per["backbone"], 11166912ull);
  EXPECT_EQ(per["encoder"], 17332736ull);
  EXPECT_EQ(per["decoder"], 5385856ull);
  EXPECT_EQ(per["vae_encoder"], 17381440ull);
  EXPECT_EQ(per["input_proj"] + per["heads"], 346638ull);
  EXPECT_EQ(params, 51613582ull);                           // "~51.6M"
  EXPECT_EQ(params - per["vae_encoder"], 34232142ull);      // "~34.2M used at inference"
  // One 480x640 camera -> 15 x 20 feature tokens, + latent and state tokens.
  EXPECT_EQ(a->prefix_tokens, 302);
}

TEST(ActArch, OriginalSevenDecoderLayers) {
  nlohmann::json c = {{"n_decoder_layers", 7}};
  auto a = build_policy_arch(PolicyKind::Act, PolicyInputs{}, &c, "config.json");
  ASSERT_TRUE(a.is_ok());
  uint64_t params = 0;
  for (const auto& p : a->params)
    if (!p.is_buffer) params += p.numel();
  EXPECT_EQ(params, 51613582ull + 6ull * 5384832ull);  // six more decoder layers
}

TEST(ActArch, ResNetActivationsScaleWithImage) {
  int64_t e1 = 0, x1 = 0, e2 = 0, x2 = 0;
  resnet18_saved_activations(224, 224, &e1, &x1);
  resnet18_saved_activations(448, 448, &e2, &x2);
  EXPECT_EQ(e2, 4 * e1);
  EXPECT_EQ(x2, 4 * x1);
  EXPECT_EQ(x1, 64 * 56 * 56 * 8);  // int64 max-pool indices at /4
}

}  // namespace vlac
