// pi0.5 model builder: sizes from tensor shapes (tiny lerobot fixtures keep gemma_2b/gemma_300m
// variant names), name variants lerobot accepts, what the graphs hold, and one clear error
// per bad input (missing tensor, wrong shape, unsupported config).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/json_reader.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "models/pi05_builder.h"

namespace fs = std::filesystem;
using namespace vlac;

namespace {

const std::string kFixtures = std::string(VLAC_SOURCE_DIR) + "/tests/fixtures/pi05";

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "vlac-builder-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

// Copies a fixture policy into `dst`, renaming/reshaping/dropping tensors through `edit`
// (return false to drop; may change name and shape when the byte count stays) and editing
// config.json through `edit_config`.
void copy_policy(const std::string& src, const fs::path& dst,
                 const std::function<bool(TensorSpec&)>& edit = nullptr,
                 const std::function<void(nlohmann::ordered_json&)>& edit_config = nullptr) {
  fs::create_directories(dst);
  std::ifstream in(src + "/config.json");
  nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(in);
  if (edit_config) edit_config(cfg);
  std::ofstream(dst / "config.json") << cfg.dump(2);
  auto ts = TensorSet::open(src);
  ASSERT_TRUE(ts.is_ok()) << ts.status().message();
  std::vector<TensorSpec> specs;
  std::vector<std::pair<const uint8_t*, uint64_t>> data;
  for (const auto& e : ts->tensors()) {
    TensorSpec s{e.info->name, e.info->dtype, e.info->shape};
    if (edit && !edit(s)) continue;
    specs.push_back(s);
    data.emplace_back(e.file->data(*e.info), e.info->nbytes());
  }
  auto w = SafetensorsWriter::create((dst / "model.safetensors").string(), specs);
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  for (auto& [p, n] : data) ASSERT_TRUE(w->write(p, n).is_ok());
  ASSERT_TRUE(w->finish().is_ok());
}

bool has_node(const ir::Graph& g, const std::string& name) {
  for (const auto& n : g.nodes())
    if (n.name == name) return true;
  return false;
}

}  // namespace

TEST(Pi05Builder, TinyASizesComeFromShapes) {
  auto m = Pi05Model::load(kFixtures + "/tiny_a/policy");
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  const Pi05Dims& d = m->dims();
  EXPECT_EQ(d.vision_width, 32);
  EXPECT_EQ(d.vision_depth, 2);
  EXPECT_EQ(d.vision_mlp, 64);
  EXPECT_EQ(d.vision_heads, 4);
  EXPECT_EQ(d.patch_size, 14);
  EXPECT_EQ(d.image_size, 56);
  EXPECT_EQ(m->image_tokens(), 16);
  EXPECT_EQ(d.lm_width, 48);
  EXPECT_EQ(d.lm_depth, 2);
  EXPECT_EQ(d.lm_mlp, 128);
  EXPECT_EQ(d.lm_heads, 2);
  EXPECT_EQ(d.head_dim, 16);
  EXPECT_EQ(d.expert_width, 32);
  EXPECT_EQ(d.expert_mlp, 64);
  EXPECT_EQ(d.expert_heads, 2);
  EXPECT_EQ(d.vocab, 1024);
  EXPECT_EQ(d.max_action_dim, 8);
  const Pi05Config& c = m->config();
  EXPECT_EQ(c.chunk_size, 6);
  EXPECT_EQ(c.n_action_steps, 4);
  EXPECT_EQ(c.num_inference_steps, 3);
  EXPECT_EQ(c.tokenizer_max_length, 16);
  ASSERT_EQ(c.cameras.size(), 2u);
  EXPECT_EQ(c.cameras[0], "observation.images.base_0_rgb");
  EXPECT_EQ(c.cameras[1], "observation.images.left_wrist_0_rgb");
  const Pi05EulerSpec e = m->euler();
  EXPECT_EQ(e.steps, 3);
  EXPECT_EQ(e.dt, float(-1.0 / 3.0));
  EXPECT_EQ(e.time(0), 1.0f);
  EXPECT_EQ(e.time(2), float(1.0 + 2.0 * (-1.0 / 3.0)));
}

TEST(Pi05Builder, TinyBSizes) {
  auto m = Pi05Model::load(kFixtures + "/tiny_b/policy");
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  const Pi05Dims& d = m->dims();
  EXPECT_EQ(d.vision_width, 48);
  EXPECT_EQ(d.vision_depth, 3);
  EXPECT_EQ(d.vision_heads, 6);
  EXPECT_EQ(d.patch_size, 8);
  EXPECT_EQ(m->image_tokens(), 25);
  EXPECT_EQ(d.lm_width, 96);
  EXPECT_EQ(d.lm_depth, 3);
  EXPECT_EQ(d.lm_mlp, 160);
  EXPECT_EQ(d.lm_heads, 3);
  EXPECT_EQ(d.expert_width, 40);
  EXPECT_EQ(d.expert_mlp, 72);
  EXPECT_EQ(d.vocab, 768);
  EXPECT_EQ(m->config().cameras.size(), 3u);
}

TEST(Pi05Builder, GraphsHoldOnlyWhatInferenceReads) {
  auto m = Pi05Model::load(kFixtures + "/tiny_a/policy");
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  auto pg = m->build_prefix(m->nominal_prefix());
  ASSERT_TRUE(pg.is_ok()) << pg.status().message();
  for (const auto& w : pg->graph.weights()) {
    EXPECT_EQ(w.name.find("lm_head"), std::string::npos) << w.name;
    EXPECT_EQ(w.name.find("language_model.norm"), std::string::npos) << w.name;
    // The last VLM layer (1) contributes only its input norm, k_proj and v_proj.
    if (w.name.find("language_model.layers.1.") != std::string::npos) {
      EXPECT_TRUE(w.name.find("input_layernorm") != std::string::npos || w.name.find("k_proj") != std::string::npos ||
                  w.name.find("v_proj") != std::string::npos)
          << w.name;
    }
  }
  EXPECT_TRUE(has_node(pg->graph, "lm.0.q_proj"));
  EXPECT_FALSE(has_node(pg->graph, "lm.1.q_proj"));
  EXPECT_TRUE(has_node(pg->graph, "lm.1.k_proj"));
  // Outputs: post-RoPE K and V of every layer, [P, 1, head_dim]; P = 2·16 + 16.
  ASSERT_NE(pg->output("prefix.k.1"), ir::kNone);
  EXPECT_EQ(pg->graph.info(pg->output("prefix.k.1")).shape, (std::vector<int64_t>{48, 1, 16}));
  EXPECT_EQ(pg->output("prefix_hidden.0"), ir::kNone);  // debug outputs only on request
  auto dbg = m->build_prefix(m->nominal_prefix(), true);
  ASSERT_TRUE(dbg.is_ok());
  EXPECT_NE(dbg->output("prefix_hidden.0"), ir::kNone);
  EXPECT_NE(dbg->output("image_tokens.observation.images.base_0_rgb"), ir::kNone);

  // A compact prefix: one camera, 5 tokens.
  auto small = m->build_prefix(Pi05PrefixShape{{"observation.images.left_wrist_0_rgb"}, 5});
  ASSERT_TRUE(small.is_ok()) << small.status().message();
  EXPECT_EQ(small->graph.info(small->output("prefix.v.0")).shape, (std::vector<int64_t>{21, 1, 16}));

  auto sg = m->build_step(21);
  ASSERT_TRUE(sg.is_ok()) << sg.status().message();
  EXPECT_EQ(sg->graph.info(sg->output("velocity")).shape, (std::vector<int64_t>{6, 8}));
  EXPECT_EQ(sg->graph.info(sg->output("x_next")).shape, (std::vector<int64_t>{6, 8}));
  for (const auto& w : sg->graph.weights()) EXPECT_EQ(w.name.find("lm_head"), std::string::npos) << w.name;
}

TEST(Pi05Builder, Bf16SplitFollowsLerobot) {
  EXPECT_TRUE(Pi05Model::lerobot_bf16_weight(
      "model.paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(Pi05Model::lerobot_bf16_weight(
      "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"));
  EXPECT_TRUE(Pi05Model::lerobot_bf16_weight(
      "model.paligemma_with_expert.gemma_expert.model.layers.1.mlp.down_proj.weight"));
  EXPECT_FALSE(Pi05Model::lerobot_bf16_weight(
      "model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"));
  EXPECT_FALSE(Pi05Model::lerobot_bf16_weight(
      "model.paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight"));
  EXPECT_FALSE(Pi05Model::lerobot_bf16_weight(
      "model.paligemma_with_expert.gemma_expert.model.layers.0.input_layernorm.dense.weight"));
  EXPECT_FALSE(Pi05Model::lerobot_bf16_weight("model.paligemma_with_expert.gemma_expert.model.norm.dense.bias"));
  EXPECT_FALSE(Pi05Model::lerobot_bf16_weight("model.action_in_proj.weight"));
  EXPECT_FALSE(Pi05Model::lerobot_bf16_weight("model.time_mlp_out.weight"));
}

TEST(Pi05Builder, NameVariantsLerobotAccepts) {
  TempDir t;
  // transformers >= 5.6 spelling (no "vision_model."), legacy time-MLP names, no "model."
  // prefix, and no embed_tokens (the embedding then comes from paligemma.lm_head).
  copy_policy(kFixtures + "/tiny_a/policy", t.path, [](TensorSpec& s) {
    const std::string vm = "vision_tower.vision_model.";
    if (auto p = s.name.find(vm); p != std::string::npos) s.name.replace(p, vm.size(), "vision_tower.");
    if (s.name.find("embed_tokens") != std::string::npos) return false;
    if (s.name.rfind("model.time_mlp_", 0) == 0) s.name = "model.action_" + s.name.substr(6);
    if (s.name.rfind("model.", 0) == 0) s.name = s.name.substr(6);
    return true;
  });
  auto m = Pi05Model::load(t.path.string());
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ(m->dims().vision_depth, 2);
  auto pg = m->build_prefix(m->nominal_prefix());
  ASSERT_TRUE(pg.is_ok());
  bool lm_head = false;
  for (const auto& w : pg->graph.weights()) lm_head = lm_head || w.name == "paligemma_with_expert.paligemma.lm_head.weight";
  EXPECT_TRUE(lm_head);
  auto sg = m->build_step(48);
  ASSERT_TRUE(sg.is_ok()) << sg.status().message();
  bool legacy = false;
  for (const auto& w : sg->graph.weights()) legacy = legacy || w.name == "action_time_mlp_in.weight";
  EXPECT_TRUE(legacy);
}

TEST(Pi05Builder, MissingTensorIsNamed) {
  TempDir t;
  const std::string gone = "model.paligemma_with_expert.gemma_expert.model.layers.1.mlp.up_proj.weight";
  copy_policy(kFixtures + "/tiny_a/policy", t.path, [&](TensorSpec& s) { return s.name != gone; });
  auto m = Pi05Model::load(t.path.string());
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), StatusCode::NotFound);
  EXPECT_EQ(m.status().exit_code(), 2);
  EXPECT_NE(m.status().message().find(gone), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("model.safetensors"), std::string::npos) << m.status().message();
}

TEST(Pi05Builder, WrongShapeIsNamed) {
  TempDir t;
  const std::string bad = "model.paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.o_proj.weight";
  copy_policy(kFixtures + "/tiny_a/policy", t.path, [&](TensorSpec& s) {
    if (s.name == bad) s.shape = {32, 48};  // transposed: same bytes, wrong layout
    return true;
  });
  auto m = Pi05Model::load(t.path.string());
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), StatusCode::ShapeMismatch);
  EXPECT_NE(m.status().message().find(bad), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("[32, 48]"), std::string::npos) << m.status().message();
}

TEST(Pi05Builder, UnsupportedConfigIsNamed) {
  for (const char* key : {"use_visual_memory", "use_proprioceptive_memory"}) {
    TempDir t;
    copy_policy(kFixtures + "/tiny_a/policy", t.path, nullptr, [&](nlohmann::ordered_json& c) { c[key] = true; });
    auto m = Pi05Model::load(t.path.string());
    ASSERT_FALSE(m.is_ok());
    EXPECT_EQ(m.status().code(), StatusCode::Unsupported);
    EXPECT_EQ(m.status().exit_code(), 2);
    EXPECT_NE(m.status().message().find(key), std::string::npos) << m.status().message();
    EXPECT_NE(m.status().message().find("config.json"), std::string::npos) << m.status().message();
  }
  TempDir t;
  copy_policy(kFixtures + "/tiny_a/policy", t.path, nullptr,
              [](nlohmann::ordered_json& c) { c["rtc_config"] = {{"enabled", true}}; });
  auto m = Pi05Model::load(t.path.string());
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("rtc_config"), std::string::npos);
}

TEST(Pi05Builder, ConfigDefaultsAndOrder) {
  TempDir t;
  // Drop optional keys (lerobot defaults apply), reorder cameras, add an empty camera, add an
  // unknown key: camera order follows the file, unknown keys are ignored.
  copy_policy(kFixtures + "/tiny_a/policy", t.path, nullptr, [](nlohmann::ordered_json& c) {
    c.erase("n_action_steps");
    c.erase("min_period");
    c["some_future_key"] = {1, 2, 3};
    c["empty_cameras"] = 1;
    nlohmann::ordered_json f;
    f["observation.images.left_wrist_0_rgb"] = c["input_features"]["observation.images.left_wrist_0_rgb"];
    f["observation.state"] = c["input_features"]["observation.state"];
    f["observation.images.base_0_rgb"] = c["input_features"]["observation.images.base_0_rgb"];
    c["input_features"] = f;
    c["n_action_steps"] = 6;
  });
  auto m = Pi05Model::load(t.path.string());
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  const auto& cams = m->config().cameras;
  ASSERT_EQ(cams.size(), 3u);
  EXPECT_EQ(cams[0], "observation.images.left_wrist_0_rgb");
  EXPECT_EQ(cams[1], "observation.images.base_0_rgb");
  EXPECT_EQ(cams[2], "observation.images.empty_camera_0");
  EXPECT_DOUBLE_EQ(m->config().min_period, 4e-3);
}

TEST(Pi05Builder, ImageResolutionMustMatchPositionEmbedding) {
  TempDir t;
  copy_policy(kFixtures + "/tiny_a/policy", t.path, nullptr,
              [](nlohmann::ordered_json& c) { c["image_resolution"] = {70, 70}; });
  auto m = Pi05Model::load(t.path.string());
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), StatusCode::ShapeMismatch);
  EXPECT_NE(m.status().message().find("position_embedding"), std::string::npos) << m.status().message();
}
