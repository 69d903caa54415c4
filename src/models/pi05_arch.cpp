// pi0.5 tensor table (names and shapes from ../shared/spec/pi05.md section 2).
#include "models/pi05_arch.h"

#include <nlohmann/json.hpp>

namespace vlac {

const char* pi05_part_name(Pi05Part part) {
  switch (part) {
    case Pi05Part::Vision: return "vision";
    case Pi05Part::Projector: return "projector";
    case Pi05Part::Language: return "language";
    case Pi05Part::Expert: return "expert";
    case Pi05Part::Heads: return "heads";
    case Pi05Part::LmHead: return "lm_head";
  }
  return "?";
}

Pi05Dims Pi05Dims::full() { return Pi05Dims{}; }

Pi05Dims Pi05Dims::demo() {
  Pi05Dims d;
  d.image_size = 56;  // 4x4 = 16 patches of 14 px
  d.vision_width = 64;
  d.vision_depth = 2;
  d.vision_mlp = 128;
  d.vision_heads = 4;
  d.lm_width = 128;
  d.lm_depth = 2;
  d.lm_mlp = 256;
  d.head_dim = 32;
  d.lm_heads = 4;
  d.vocab = 1024;
  d.expert_width = 64;
  d.expert_mlp = 128;
  d.expert_heads = 4;
  return d;
}

Status Pi05Dims::validate() const {
  const int64_t all[] = {image_size, patch_size, channels, vision_width, vision_depth, vision_mlp,
                         vision_heads, lm_width, lm_depth, lm_mlp, head_dim, lm_heads, kv_heads,
                         vocab, expert_width, expert_mlp, expert_heads, max_action_dim};
  for (int64_t v : all)
    if (v <= 0) return invalid_argument("pi0.5 dimensions must be positive");
  if (image_size % patch_size != 0)
    return invalid_argument("image size " + std::to_string(image_size) + " is not a multiple of the patch size " +
                            std::to_string(patch_size));
  if (vision_width % vision_heads != 0)
    return invalid_argument("SigLIP width " + std::to_string(vision_width) + " is not divisible by " +
                            std::to_string(vision_heads) + " heads (vision_num_attention_heads)");
  if (lm_heads != expert_heads)
    return invalid_argument("the VLM and the action expert must have the same number of query heads");
  return Status::ok();
}

uint64_t WeightSpec::numel() const {
  uint64_t n = 1;
  for (int64_t s : shape) n *= static_cast<uint64_t>(s);
  return n;
}

std::vector<WeightSpec> pi05_weights(const Pi05Dims& d, Pi05Layout layout) {
  const std::string root = layout == Pi05Layout::FineTune ? "model." : "";
  const std::string pwe = root + "paligemma_with_expert.";
  const std::string pg = pwe + "paligemma.model.";
  const std::string vm = pg + "vision_tower.vision_model.";
  const std::string lm = pg + "language_model.";
  const std::string ex = pwe + "gemma_expert.model.";
  std::vector<WeightSpec> w;
  auto add = [&](std::string name, std::vector<int64_t> shape, Pi05Part part, bool used = true) {
    w.push_back(WeightSpec{std::move(name), std::move(shape), part, used});
  };
  const int64_t V = d.vision_width, P = d.patch_size, attn = d.lm_heads * d.head_dim,
                kv = d.kv_heads * d.head_dim;

  // SigLIP
  add(vm + "embeddings.patch_embedding.weight", {V, d.channels, P, P}, Pi05Part::Vision);
  add(vm + "embeddings.patch_embedding.bias", {V}, Pi05Part::Vision);
  add(vm + "embeddings.position_embedding.weight", {d.patches_per_image(), V}, Pi05Part::Vision);
  for (int64_t i = 0; i < d.vision_depth; ++i) {
    const std::string l = vm + "encoder.layers." + std::to_string(i) + ".";
    add(l + "layer_norm1.weight", {V}, Pi05Part::Vision);
    add(l + "layer_norm1.bias", {V}, Pi05Part::Vision);
    for (const char* p : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      add(l + "self_attn." + p + ".weight", {V, V}, Pi05Part::Vision);
      add(l + "self_attn." + p + ".bias", {V}, Pi05Part::Vision);
    }
    add(l + "layer_norm2.weight", {V}, Pi05Part::Vision);
    add(l + "layer_norm2.bias", {V}, Pi05Part::Vision);
    add(l + "mlp.fc1.weight", {d.vision_mlp, V}, Pi05Part::Vision);
    add(l + "mlp.fc1.bias", {d.vision_mlp}, Pi05Part::Vision);
    add(l + "mlp.fc2.weight", {V, d.vision_mlp}, Pi05Part::Vision);
    add(l + "mlp.fc2.bias", {V}, Pi05Part::Vision);
  }
  add(vm + "post_layernorm.weight", {V}, Pi05Part::Vision);
  add(vm + "post_layernorm.bias", {V}, Pi05Part::Vision);

  // Projector
  add(pg + "multi_modal_projector.linear.weight", {d.lm_width, V}, Pi05Part::Projector);
  add(pg + "multi_modal_projector.linear.bias", {d.lm_width}, Pi05Part::Projector);

  // Gemma VLM. The last layer only feeds K/V to the expert: its q/o/MLP/post-norm are unread.
  if (layout == Pi05Layout::FineTune) add(lm + "embed_tokens.weight", {d.vocab, d.lm_width}, Pi05Part::Language);
  for (int64_t i = 0; i < d.lm_depth; ++i) {
    const std::string l = lm + "layers." + std::to_string(i) + ".";
    const bool full = i + 1 < d.lm_depth;
    add(l + "input_layernorm.weight", {d.lm_width}, Pi05Part::Language);
    add(l + "self_attn.q_proj.weight", {attn, d.lm_width}, Pi05Part::Language, full);
    add(l + "self_attn.k_proj.weight", {kv, d.lm_width}, Pi05Part::Language);
    add(l + "self_attn.v_proj.weight", {kv, d.lm_width}, Pi05Part::Language);
    add(l + "self_attn.o_proj.weight", {d.lm_width, attn}, Pi05Part::Language, full);
    add(l + "post_attention_layernorm.weight", {d.lm_width}, Pi05Part::Language, full);
    add(l + "mlp.gate_proj.weight", {d.lm_mlp, d.lm_width}, Pi05Part::Language, full);
    add(l + "mlp.up_proj.weight", {d.lm_mlp, d.lm_width}, Pi05Part::Language, full);
    add(l + "mlp.down_proj.weight", {d.lm_width, d.lm_mlp}, Pi05Part::Language, full);
  }
  add(lm + "norm.weight", {d.lm_width}, Pi05Part::Language, false);
  // In the base layout the (tied) lm_head is the only copy of the embedding: inference reads it.
  add(pwe + "paligemma.lm_head.weight", {d.vocab, d.lm_width}, Pi05Part::LmHead, layout == Pi05Layout::Base);

  // Action expert with adaptive RMSNorm ([scale | shift | gate] rows).
  const int64_t E = d.expert_width;
  for (int64_t i = 0; i < d.lm_depth; ++i) {
    const std::string l = ex + "layers." + std::to_string(i) + ".";
    add(l + "self_attn.q_proj.weight", {attn, E}, Pi05Part::Expert);
    add(l + "self_attn.k_proj.weight", {kv, E}, Pi05Part::Expert);
    add(l + "self_attn.v_proj.weight", {kv, E}, Pi05Part::Expert);
    add(l + "self_attn.o_proj.weight", {E, attn}, Pi05Part::Expert);
    add(l + "mlp.gate_proj.weight", {d.expert_mlp, E}, Pi05Part::Expert);
    add(l + "mlp.up_proj.weight", {d.expert_mlp, E}, Pi05Part::Expert);
    add(l + "mlp.down_proj.weight", {E, d.expert_mlp}, Pi05Part::Expert);
    for (const char* n : {"input_layernorm", "post_attention_layernorm"}) {
      add(l + n + ".dense.weight", {3 * E, E}, Pi05Part::Expert);
      add(l + n + ".dense.bias", {3 * E}, Pi05Part::Expert);
    }
  }
  add(ex + "norm.dense.weight", {3 * E, E}, Pi05Part::Expert);
  add(ex + "norm.dense.bias", {3 * E}, Pi05Part::Expert);
  add(pwe + "gemma_expert.lm_head.weight", {d.vocab, E}, Pi05Part::LmHead, false);

  // Flow-matching heads
  add(root + "action_in_proj.weight", {E, d.max_action_dim}, Pi05Part::Heads);
  add(root + "action_in_proj.bias", {E}, Pi05Part::Heads);
  add(root + "action_out_proj.weight", {d.max_action_dim, E}, Pi05Part::Heads);
  add(root + "action_out_proj.bias", {d.max_action_dim}, Pi05Part::Heads);
  add(root + "time_mlp_in.weight", {E, E}, Pi05Part::Heads);
  add(root + "time_mlp_in.bias", {E}, Pi05Part::Heads);
  add(root + "time_mlp_out.weight", {E, E}, Pi05Part::Heads);
  add(root + "time_mlp_out.bias", {E}, Pi05Part::Heads);
  return w;
}

Status apply_pi05_variants(const std::string& paligemma_variant, const std::string& expert_variant,
                           Pi05Dims* d) {
  auto base = [](const std::string& v) {
    const std::string suffix = "_lora";
    return v.size() > suffix.size() && v.compare(v.size() - suffix.size(), suffix.size(), suffix) == 0
               ? v.substr(0, v.size() - suffix.size())
               : v;
  };
  // lerobot's variant table: (width, depth, mlp, heads, kv heads, head_dim).
  struct Variant { const char* name; int64_t width, depth, mlp, heads, kv, head_dim; };
  static constexpr Variant kVariants[] = {
      {"gemma_2b", 2048, 18, 16384, 8, 1, 256},
      {"gemma_300m", 1024, 18, 4096, 8, 1, 256},
  };
  const Variant* vlm = nullptr;
  const Variant* exp = nullptr;
  for (const auto& v : kVariants) {
    if (base(paligemma_variant) == v.name) vlm = &v;
    if (base(expert_variant) == v.name) exp = &v;
  }
  if (vlm == nullptr) return unsupported("unknown paligemma_variant '" + paligemma_variant + "' (known: gemma_2b, gemma_300m)");
  if (exp == nullptr) return unsupported("unknown action_expert_variant '" + expert_variant + "' (known: gemma_2b, gemma_300m)");
  if (vlm->depth != exp->depth || vlm->head_dim != exp->head_dim || vlm->heads != exp->heads)
    return unsupported("variants '" + paligemma_variant + "' and '" + expert_variant +
                       "' differ in depth or attention geometry; pi0.5 needs them equal");
  d->lm_width = vlm->width;
  d->lm_depth = vlm->depth;
  d->lm_mlp = vlm->mlp;
  d->lm_heads = vlm->heads;
  d->kv_heads = vlm->kv;
  d->head_dim = vlm->head_dim;
  d->expert_width = exp->width;
  d->expert_mlp = exp->mlp;
  d->expert_heads = exp->heads;
  return Status::ok();
}

Result<Pi05Dims> pi05_dims_from_config(const nlohmann::json& c, const std::string& path) {
  Pi05Dims d = Pi05Dims::full();
  if (!c.is_object()) return invalid_format(path + ": config is not a JSON object");
  auto str = [&](const char* key, const char* def) -> Result<std::string> {
    auto it = c.find(key);
    if (it == c.end() || it->is_null()) return std::string(def);
    if (!it->is_string()) return invalid_format(path + ": '" + key + "' must be a string");
    return it->get<std::string>();
  };
  auto num = [&](const char* key, int64_t* out) -> Status {
    auto it = c.find(key);
    if (it == c.end() || it->is_null()) return Status::ok();
    if (!it->is_number_integer() || it->get<int64_t>() <= 0)
      return invalid_format(path + ": '" + key + "' must be a positive integer");
    *out = it->get<int64_t>();
    return Status::ok();
  };
  VLAC_ASSIGN_OR_RETURN(std::string vlm, str("paligemma_variant", "gemma_2b"));
  VLAC_ASSIGN_OR_RETURN(std::string exp, str("action_expert_variant", "gemma_300m"));
  VLAC_RETURN_IF_ERROR(apply_pi05_variants(vlm, exp, &d).with_context(path));
  VLAC_RETURN_IF_ERROR(num("max_action_dim", &d.max_action_dim));
  VLAC_RETURN_IF_ERROR(num("vision_num_attention_heads", &d.vision_heads));
  if (auto it = c.find("image_resolution"); it != c.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() || !(*it)[1].is_number_integer())
      return invalid_format(path + ": 'image_resolution' must be a list of two integers");
    if ((*it)[0] != (*it)[1]) return unsupported(path + ": 'image_resolution' must be square for pi0.5");
    d.image_size = (*it)[0].get<int64_t>();
  }
  VLAC_RETURN_IF_ERROR(d.validate().with_context(path));
  return d;
}

nlohmann::json pi05_config_json(const Pi05Dims& d, int n_cameras, int state_dim, int action_dim,
                                int chunk_size, int num_inference_steps) {
  nlohmann::json input_features = nlohmann::json::object();
  for (int i = 0; i < n_cameras; ++i)
    input_features["observation.images.cam" + std::to_string(i)] = {
        {"type", "VISUAL"}, {"shape", {d.channels, d.image_size, d.image_size}}};
  input_features["observation.state"] = {{"type", "STATE"}, {"shape", {state_dim}}};
  return {
      {"type", "pi05"},
      {"n_obs_steps", 1},
      {"input_features", input_features},
      {"output_features", {{"action", {{"type", "ACTION"}, {"shape", {action_dim}}}}}},
      {"device", "cpu"},
      {"use_amp", false},
      {"paligemma_variant", "gemma_2b"},
      {"action_expert_variant", "gemma_300m"},
      {"dtype", "float32"},
      {"chunk_size", chunk_size},
      {"n_action_steps", chunk_size},
      {"max_state_dim", 32},
      {"max_action_dim", d.max_action_dim},
      {"num_inference_steps", num_inference_steps},
      {"time_sampling_beta_alpha", 1.5},
      {"time_sampling_beta_beta", 1.0},
      {"time_sampling_scale", 0.999},
      {"time_sampling_offset", 0.001},
      {"min_period", 0.004},
      {"max_period", 4.0},
      {"image_resolution", {d.image_size, d.image_size}},
      {"empty_cameras", 0},
      {"tokenizer_max_length", 200},
      {"normalization_mapping", {{"VISUAL", "IDENTITY"}, {"STATE", "QUANTILES"}, {"ACTION", "QUANTILES"}}},
      {"use_relative_actions", false},
      {"relative_exclude_joints", {"gripper"}},
      {"use_visual_memory", false},
      {"use_proprioceptive_memory", false},
      {"gradient_checkpointing", false},
      {"freeze_vision_encoder", false},
      {"train_expert_only", false},
      {"vision_num_attention_heads", d.vision_heads},
  };
}

}  // namespace vlac
