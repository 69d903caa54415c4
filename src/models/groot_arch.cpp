// GR00T N1.7 tensor table. Sources (read 2026): NVIDIA/Isaac-GR00T gr00t/configs/model/gr00t_n1d7.py
// (Cosmos-Reason2-2B backbone, select_layer 12, DiT 16 layers x 32 heads x 48, hidden 1024,
// input_embedding_dim 1536, max_state/action_dim 132, 32 embodiments, tune_* defaults),
// gr00t/model/modules/qwen3_backbone.py (LLM layers beyond select_layer are popped; visual and
// language_model frozen unless tune_visual / tune_llm), gr00t/model/modules/dit.py (block layout:
// AdaLayerNorm linear D->2D, diffusers Attention with biases, even blocks cross-attend to the
// 2048-wide backbone features, FeedForward 4x GELU, proj_out_1/2), gr00t_n1d7.py (state/action
// encoders, decoder, vlln, position embedding). The Qwen3-VL-2B sizes (vision depth 24 x 1024,
// MLP 4096, patch 16, merge 2, 3 deepstack mergers; text 2048 wide, 16/8 heads of 128, MLP 6144,
// vocab 151936, tied lm_head) come from the public Qwen3-VL configs, not from the gated
// Cosmos-Reason2-2B file itself, and the CategorySpecific MLP shapes from the N1.5/N1.6 module of
// the same name: treat the table as documented sizes, not a checked tensor list.
#include "models/groot_arch.h"

#include <string>

namespace vlac {

Result<PolicyArch> groot_policy_arch(const GrootDims& d, const PolicyInputs& in) {
  const int64_t unit = d.patch_size * d.merge;
  if (in.image_h % unit != 0 || in.image_w % unit != 0)
    return invalid_argument("groot-n1.7: image sides must be multiples of " + std::to_string(unit) +
                            " (Qwen3-VL patch 16 x merge 2)");
  PolicyArch a;
  a.kind = PolicyKind::GrootN17;
  a.inputs = in;
  // Defaults: tune_visual=False, tune_llm=False, tune_projector=True, tune_diffusion_model=True,
  // tune_vlln=True.
  a.modules = {
      {"vision", ModuleRole::Vision, false, DtypeRule::Follow, {}},
      {"language", ModuleRole::Language, false, DtypeRule::Follow, {0}},
      {"vlln", ModuleRole::Heads, true, DtypeRule::Follow, {1}},
      {"dit", ModuleRole::Expert, true, DtypeRule::Follow, {2, 4}},
      {"projectors", ModuleRole::Heads, true, DtypeRule::Follow, {}},
  };
  auto add = [&](std::string name, std::vector<int64_t> shape, int m, bool grad = true) {
    a.params.push_back({std::move(name), std::move(shape), m, grad, false});
  };
  auto linear = [&](const std::string& p, int64_t out, int64_t inw, int m, bool bias = true) {
    add(p + ".weight", {out, inw}, m);
    if (bias) add(p + ".bias", {out}, m);
  };
  auto layernorm = [&](const std::string& p, int64_t w, int m) {
    add(p + ".weight", {w}, m);
    add(p + ".bias", {w}, m);
  };
  const std::string vis = "backbone.model.model.visual.";
  const int64_t V = d.vision_width;
  add(vis + "patch_embed.proj.weight", {V, 3, d.temporal_patch, d.patch_size, d.patch_size}, 0);
  add(vis + "patch_embed.proj.bias", {V}, 0);
  add(vis + "pos_embed.weight", {d.vision_pos, V}, 0);
  for (int64_t i = 0; i < d.vision_depth; ++i) {
    const std::string b = vis + "blocks." + std::to_string(i) + ".";
    layernorm(b + "norm1", V, 0);
    layernorm(b + "norm2", V, 0);
    linear(b + "attn.qkv", 3 * V, V, 0);
    linear(b + "attn.proj", V, V, 0);
    linear(b + "mlp.linear_fc1", d.vision_mlp, V, 0);
    linear(b + "mlp.linear_fc2", V, d.vision_mlp, 0);
  }
  const int64_t merged = V * d.merge * d.merge;
  layernorm(vis + "merger.norm", V, 0);
  linear(vis + "merger.linear_fc1", merged, merged, 0);
  linear(vis + "merger.linear_fc2", d.vision_out, merged, 0);
  for (int64_t j = 0; j < d.deepstack; ++j) {
    const std::string m = vis + "deepstack_merger_list." + std::to_string(j) + ".";
    layernorm(m + "norm", merged, 0);  // post-shuffle norm
    linear(m + "linear_fc1", merged, merged, 0);
    linear(m + "linear_fc2", d.vision_out, merged, 0);
  }
  const std::string lm = "backbone.model.model.language_model.";
  const int64_t L = d.lm_width, q = d.lm_heads * d.head_dim, kv = d.lm_kv_heads * d.head_dim;
  add(lm + "embed_tokens.weight", {d.vocab, L}, 1);  // also the tied lm_head
  for (int64_t i = 0; i < d.select_layer; ++i) {
    const std::string l = lm + "layers." + std::to_string(i) + ".";
    linear(l + "self_attn.q_proj", q, L, 1, false);
    linear(l + "self_attn.k_proj", kv, L, 1, false);
    linear(l + "self_attn.v_proj", kv, L, 1, false);
    linear(l + "self_attn.o_proj", L, q, 1, false);
    add(l + "self_attn.q_norm.weight", {d.head_dim}, 1);
    add(l + "self_attn.k_norm.weight", {d.head_dim}, 1);
    linear(l + "mlp.gate_proj", d.lm_mlp, L, 1, false);
    linear(l + "mlp.up_proj", d.lm_mlp, L, 1, false);
    linear(l + "mlp.down_proj", L, d.lm_mlp, 1, false);
    add(l + "input_layernorm.weight", {L}, 1);
    add(l + "post_attention_layernorm.weight", {L}, 1);
  }
  add(lm + "norm.weight", {L}, 1);

  layernorm("action_head.vlln", d.backbone_embedding_dim, 2);

  const std::string dit = "action_head.model.";
  const int64_t D = d.dit_heads * d.dit_head_dim;  // inner_dim 1536
  for (int64_t i = 0; i < d.dit_layers; ++i) {
    const std::string b = dit + "transformer_blocks." + std::to_string(i) + ".";
    const bool cross = i % 2 == 0;  // interleave_self_attention: odd blocks self-attend
    const int64_t kv_in = cross ? d.backbone_embedding_dim : D;
    linear(b + "norm1.linear", 2 * D, D, 3);  // AdaLayerNorm; norm3 has no affine parameters
    linear(b + "attn1.to_q", D, D, 3);
    linear(b + "attn1.to_k", D, kv_in, 3);
    linear(b + "attn1.to_v", D, kv_in, 3);
    linear(b + "attn1.to_out.0", D, D, 3);
    linear(b + "ff.net.0.proj", 4 * D, D, 3);
    linear(b + "ff.net.2", D, 4 * D, 3);
  }
  linear(dit + "timestep_encoder.timestep_embedder.linear_1", D, 256, 3);
  linear(dit + "timestep_encoder.timestep_embedder.linear_2", D, D, 3);
  linear(dit + "proj_out_1", 2 * D, D, 3);
  linear(dit + "proj_out_2", d.dit_out, D, 3);

  // Per-embodiment MLPs: weights [num_embodiments, in, out] and biases [num_embodiments, out].
  const int64_t N = d.max_num_embodiments, H = d.hidden_size, I = d.input_embedding_dim;
  auto cat_linear = [&](const std::string& p, int64_t inw, int64_t out) {
    add(p + ".W", {N, inw, out}, 4);
    add(p + ".b", {N, out}, 4);
  };
  cat_linear("action_head.state_encoder.layer1", d.max_state_dim, H);
  cat_linear("action_head.state_encoder.layer2", H, I);
  cat_linear("action_head.action_encoder.W1", d.max_action_dim, I);
  cat_linear("action_head.action_encoder.W2", 2 * I, I);
  cat_linear("action_head.action_encoder.W3", I, I);
  cat_linear("action_head.action_decoder.layer1", H, H);
  cat_linear("action_head.action_decoder.layer2", H, d.max_action_dim);
  add("action_head.position_embedding.weight", {d.max_seq_len, I}, 4);

  // Activations. One image = 2 identical temporal frames -> (h/16)(w/16) ViT patches, merged 2x2.
  const int64_t patches = (in.image_h / d.patch_size) * (in.image_w / d.patch_size);
  const int64_t per_cam = patches / (d.merge * d.merge);
  const int64_t prefix = per_cam * in.cams + in.prompt_tokens;
  const int64_t sa = 1 + in.chunk;  // state token + action tokens
  a.image_tokens_per_cam = per_cam;
  a.prefix_tokens = prefix;
  ActBlock pe;
  pe.name = "patch embedding";
  pe.module = 0;
  pe.transformer = false;
  pe.raw_elements = in.cams * 3 * d.temporal_patch * in.image_h * in.image_w;
  a.blocks.push_back(pe);
  ActBlock v;  // flash attention (use_flash_attention=True)
  v.name = "Qwen3-VL ViT block";
  v.module = 0;
  v.count = d.vision_depth;
  v.seqs = in.cams;
  v.tokens_q = v.tokens_kv = patches;
  v.width = v.q_width = v.kv_width = V;
  v.heads = d.vision_heads;
  v.ffn_width = d.vision_mlp;
  v.flash = true;
  a.blocks.push_back(v);
  ActBlock mg;
  mg.name = "patch mergers";
  mg.module = 0;
  mg.transformer = false;
  mg.raw_elements = (1 + d.deepstack) * in.cams * per_cam * (2 * merged + d.vision_out);
  a.blocks.push_back(mg);
  ActBlock l;
  l.name = "Qwen3 LLM layer";
  l.module = 1;
  l.count = d.select_layer;
  l.tokens_q = l.tokens_kv = prefix;
  l.width = L;
  l.q_width = q;
  l.kv_width = kv;
  l.heads = d.lm_heads;
  l.ffn_width = d.lm_mlp;
  l.ffn_tensors = 4;
  l.flash = true;
  a.blocks.push_back(l);
  ActBlock ln;
  ln.name = "vlln";
  ln.module = 2;
  ln.transformer = false;
  ln.raw_elements = prefix * d.backbone_embedding_dim;
  a.blocks.push_back(ln);
  // DiT: SDPA attention (no stored scores), dropout 0.2, GELU-tanh FFN 4x. AlternateVLDiT
  // alternates image and text tokens in its cross blocks; counted here over all VL tokens.
  ActBlock c;
  c.name = "DiT block (cross-attn to VL)";
  c.module = 3;
  c.count = (d.dit_layers + 1) / 2;
  c.tokens_q = sa;
  c.tokens_kv = prefix;
  c.width = c.q_width = c.kv_width = D;
  c.kv_in_width = d.backbone_embedding_dim;
  c.heads = d.dit_heads;
  c.ffn_width = 4 * D;
  c.dropout = true;
  c.flash = true;
  a.blocks.push_back(c);
  ActBlock s = c;
  s.name = "DiT block (self-attn)";
  s.count = d.dit_layers / 2;
  s.tokens_kv = sa;
  s.kv_in_width = 0;
  a.blocks.push_back(s);
  ActBlock h;
  h.name = "state/action encoders, decoder";
  h.module = 4;
  h.transformer = false;
  h.raw_elements = d.max_state_dim + H + in.chunk * (d.max_action_dim + 4 * I) + sa * (2 * H + D);
  a.blocks.push_back(h);
  a.description = "GR00T N1.7: Qwen3-VL ViT " + std::to_string(V) + "x" + std::to_string(d.vision_depth) +
                  ", Qwen3 LLM " + std::to_string(L) + "x" + std::to_string(d.select_layer) + " (of " +
                  std::to_string(d.lm_layers_total) + "), DiT " + std::to_string(D) + "x" +
                  std::to_string(d.dit_layers) + "; documented sizes, not a checked tensor list (src/models/groot_arch)";
  return a;
}

}  // namespace vlac
