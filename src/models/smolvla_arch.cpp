// SmolVLA tensor table (names as lerobot saves them; sizes from spec 7.2, which reproduce its
// ~450M stored / ~403M used parameters) and per-block activation shapes.
#include "models/smolvla_arch.h"

#include <string>

namespace vlac {

Status SmolVlaDims::validate() const {
  const int64_t all[] = {image_size, patch_size, vision_width, vision_depth, vision_mlp, vision_heads,
                         shuffle_factor, text_width, text_layers, text_heads, text_kv_heads, head_dim,
                         text_mlp, vocab, expert_width, expert_mlp, expert_layers, self_attn_every_n_layers,
                         max_state_dim, max_action_dim};
  for (int64_t v : all)
    if (v <= 0) return invalid_argument("smolvla dimensions must be positive");
  if (image_size % patch_size != 0 || (image_size / patch_size) % shuffle_factor != 0)
    return invalid_argument("smolvla: image size " + std::to_string(image_size) + " must be a multiple of " +
                            std::to_string(patch_size * shuffle_factor) + " (patch 16 x pixel-shuffle 4)");
  return Status::ok();
}

Result<PolicyArch> smolvla_policy_arch(SmolVlaDims d, const PolicyInputs& in) {
  if (in.image_h != in.image_w)
    return unsupported("smolvla resizes every camera to a square (resize_imgs_with_padding); give one --image-size");
  d.image_size = in.image_h;
  VLAC_RETURN_IF_ERROR(d.validate());
  PolicyArch a;
  a.kind = PolicyKind::SmolVla;
  a.inputs = in;
  // lerobot defaults: freeze_vision_encoder=True, train_expert_only=True (the whole VLM frozen);
  // load_vlm_weights=False builds the VLM from its config in fp32, load_vlm_weights=True loads it
  // with torch_dtype=bfloat16 (DtypeRule::AlwaysBf16 = bf16 only under TrainOptions::vlm_bf16).
  a.modules = {
      {"vision", ModuleRole::Vision, false, DtypeRule::AlwaysBf16, {}},
      {"connector", ModuleRole::Projector, false, DtypeRule::AlwaysBf16, {0}},
      {"language", ModuleRole::Language, false, DtypeRule::AlwaysBf16, {1}, {3}},
      {"expert", ModuleRole::Expert, true, DtypeRule::Follow, {2, 4}, {2}},
      {"heads", ModuleRole::Heads, true, DtypeRule::Follow, {}},
      {"lm_head", ModuleRole::Unused, false, DtypeRule::AlwaysBf16, {}},
  };
  const std::string vlm = "model.vlm_with_expert.vlm.";
  const std::string vm = vlm + "model.vision_model.";
  const std::string tm = vlm + "model.text_model.";
  const std::string ex = "model.vlm_with_expert.lm_expert.";
  auto add = [&](std::string name, std::vector<int64_t> shape, int m, bool grad = true) {
    a.params.push_back({std::move(name), std::move(shape), m, grad, false});
  };
  const int64_t V = d.vision_width;
  add(vm + "embeddings.patch_embedding.weight", {V, 3, d.patch_size, d.patch_size}, 0);
  add(vm + "embeddings.patch_embedding.bias", {V}, 0);
  add(vm + "embeddings.position_embedding.weight", {d.patches_per_image(), V}, 0);
  for (int64_t i = 0; i < d.vision_depth; ++i) {
    const std::string l = vm + "encoder.layers." + std::to_string(i) + ".";
    for (const char* p : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      add(l + "self_attn." + p + ".weight", {V, V}, 0);
      add(l + "self_attn." + p + ".bias", {V}, 0);
    }
    for (const char* n : {"layer_norm1", "layer_norm2"}) {
      add(l + n + ".weight", {V}, 0);
      add(l + n + ".bias", {V}, 0);
    }
    add(l + "mlp.fc1.weight", {d.vision_mlp, V}, 0);
    add(l + "mlp.fc1.bias", {d.vision_mlp}, 0);
    add(l + "mlp.fc2.weight", {V, d.vision_mlp}, 0);
    add(l + "mlp.fc2.bias", {V}, 0);
  }
  add(vm + "post_layernorm.weight", {V}, 0);
  add(vm + "post_layernorm.bias", {V}, 0);
  const int64_t shuffled = V * d.shuffle_factor * d.shuffle_factor;
  add(vlm + "model.connector.modality_projection.proj.weight", {d.text_width, shuffled}, 1);

  const int64_t T = d.text_width, q = d.text_heads * d.head_dim, kv = d.text_kv_heads * d.head_dim;
  add(tm + "embed_tokens.weight", {d.vocab, T}, 2);
  for (int64_t i = 0; i < d.text_layers; ++i) {
    const std::string l = tm + "layers." + std::to_string(i) + ".";
    add(l + "self_attn.q_proj.weight", {q, T}, 2);
    add(l + "self_attn.k_proj.weight", {kv, T}, 2);
    add(l + "self_attn.v_proj.weight", {kv, T}, 2);
    add(l + "self_attn.o_proj.weight", {T, q}, 2);
    add(l + "mlp.gate_proj.weight", {d.text_mlp, T}, 2);
    add(l + "mlp.up_proj.weight", {d.text_mlp, T}, 2);
    add(l + "mlp.down_proj.weight", {T, d.text_mlp}, 2);
    add(l + "input_layernorm.weight", {T}, 2);
    add(l + "post_attention_layernorm.weight", {T}, 2);
  }
  add(tm + "norm.weight", {T}, 2, false);  // prefix hidden states are discarded
  add(vlm + "lm_head.weight", {d.vocab, T}, 5, false);

  const int64_t E = d.expert_width;
  for (int64_t i = 0; i < d.expert_layers; ++i) {
    const std::string l = ex + "layers." + std::to_string(i) + ".";
    const bool cross = i % d.self_attn_every_n_layers != 0;
    const int64_t kv_in = cross ? kv : E;  // cross layers project the VLM's K/V (320 -> 320)
    add(l + "self_attn.q_proj.weight", {q, E}, 3);
    add(l + "self_attn.k_proj.weight", {kv, kv_in}, 3);
    add(l + "self_attn.v_proj.weight", {kv, kv_in}, 3);
    add(l + "self_attn.o_proj.weight", {E, q}, 3);
    add(l + "mlp.gate_proj.weight", {d.expert_mlp, E}, 3);
    add(l + "mlp.up_proj.weight", {d.expert_mlp, E}, 3);
    add(l + "mlp.down_proj.weight", {E, d.expert_mlp}, 3);
    add(l + "input_layernorm.weight", {E}, 3);
    add(l + "post_attention_layernorm.weight", {E}, 3);
  }
  add(ex + "norm.weight", {E}, 3);

  auto lin = [&](const std::string& name, int64_t out, int64_t inw) {
    add("model." + name + ".weight", {out, inw}, 4);
    add("model." + name + ".bias", {out}, 4);
  };
  lin("state_proj", T, d.max_state_dim);
  lin("action_in_proj", E, d.max_action_dim);
  lin("action_out_proj", d.max_action_dim, E);
  lin("action_time_mlp_in", E, 2 * E);
  lin("action_time_mlp_out", E, E);

  // Activations.
  const int64_t per_cam = d.tokens_per_image();
  const int64_t prefix = per_cam * in.cams + in.prompt_tokens + 1;  // + state token
  const int64_t chunk = in.chunk;
  a.image_tokens_per_cam = per_cam;
  a.prefix_tokens = prefix;
  ActBlock patch;
  patch.name = "patch embedding";
  patch.module = 0;
  patch.transformer = false;
  patch.raw_elements = in.cams * 3 * d.image_size * d.image_size;
  a.blocks.push_back(patch);
  ActBlock v;
  v.name = "SigLIP layer";
  v.module = 0;
  v.count = d.vision_depth;
  v.seqs = in.cams;
  v.tokens_q = v.tokens_kv = d.patches_per_image();
  v.width = v.q_width = v.kv_width = V;
  v.heads = d.vision_heads;
  v.ffn_width = d.vision_mlp;
  v.flash = true;  // transformers' SmolVLM vision tower defaults to SDPA
  a.blocks.push_back(v);
  ActBlock c;
  c.name = "connector";
  c.module = 1;
  c.transformer = false;
  c.raw_elements = in.cams * per_cam * shuffled;
  a.blocks.push_back(c);
  // Even layers attend jointly over prefix + chunk, odd layers over the prefix only.
  const int64_t n_even = (d.text_layers + 1) / 2, n_odd = d.text_layers / 2;
  ActBlock t;
  t.name = "SmolLM2 layer (joint)";
  t.module = 2;
  t.count = n_even;
  t.tokens_q = prefix;
  t.tokens_kv = prefix + chunk;
  t.width = T;
  t.q_width = q;
  t.kv_width = kv;
  t.heads = d.text_heads;
  t.ffn_width = d.text_mlp;
  t.ffn_tensors = 4;
  // smolvlm_with_expert.py's eager_attention_forward upcasts Q and K to fp32 and takes the
  // softmax in fp32 before casting the probabilities back, whatever the weights' dtype.
  t.softmax_fp32 = true;
  t.qk_fp32 = true;
  a.blocks.push_back(t);
  t.name = "SmolLM2 layer (prefix only)";
  t.count = n_odd;
  t.tokens_kv = prefix;
  a.blocks.push_back(t);
  const int64_t e_even = (d.expert_layers + 1) / 2, e_odd = d.expert_layers / 2;
  ActBlock e;
  e.name = "expert layer (joint self-attn)";
  e.module = 3;
  e.count = e_even;
  e.tokens_q = chunk;
  e.tokens_kv = prefix + chunk;
  e.width = E;
  e.q_width = q;
  e.kv_width = kv;
  e.heads = d.text_heads;
  e.ffn_width = d.expert_mlp;
  e.ffn_tensors = 4;
  e.softmax_fp32 = true;
  e.qk_fp32 = true;
  a.blocks.push_back(e);
  e.name = "expert layer (cross-attn to VLM K/V)";
  e.count = e_odd;
  e.tokens_kv = prefix;
  e.kv_in_width = kv;
  a.blocks.push_back(e);
  ActBlock h;
  h.name = "state/action/time heads";
  h.module = 4;
  h.transformer = false;
  h.raw_elements = d.max_state_dim + chunk * (d.max_action_dim + 4 * E);
  a.blocks.push_back(h);
  a.description = "SmolVLA (lerobot): SigLIP-B/16 @" + std::to_string(d.image_size) + " px, SmolLM2 " +
                  std::to_string(d.text_layers) + " layers x " + std::to_string(T) + ", expert " +
                  std::to_string(E) + " (src/models/smolvla_arch)";
  return a;
}

}  // namespace vlac
