// GR00T N1.7 tensor table, checked against the model code's own tensor list: lerobot 0.6.1's
// port (policies/groot/groot_n1_7.py, "mirrors the public N1.7 checkpoint config") built on the
// device from GR00TN17Config's defaults with the hard-coded Cosmos-Reason2-2B (Qwen3-VL-2B)
// config, its named_parameters() dumped (tests/fixtures/train_memory/groot_n17_tensors.json):
// 3,144,016,000 parameters, 1,523,500,032 frozen backbone + 1,620,515,968 trained head; the
// test GrootTableMatchesTheModelCode holds this table to that list. Module layout follows
// NVIDIA/Isaac-GR00T (gr00t/configs/model/gr00t_n1d7.py, qwen3_backbone.py, dit.py): LLM layers
// beyond select_layer are popped, visual + language_model frozen unless tune_visual / tune_llm,
// even DiT blocks cross-attend to the 2048-wide backbone features, the lm_head is tied to
// embed_tokens (one tensor). The checkpoint config differs from the Gr00tN1d7Config dataclass
// defaults (select_layer 16 not 12, 32 DiT blocks not 16, plus 4 vl_self_attention blocks).
// Dtypes at load: Isaac-GR00T's launcher has load_bf16=False (from_pretrained without a dtype:
// fp32 under transformers 4.x) and backbone_trainable_params_fp32=True; lerobot's GrootPolicy
// casts every parameter to fp32 (model_params_fp32=True). Either way: fp32 parameters, bf16
// autocast compute.
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
  const int64_t S = d.vl_sa_heads * d.vl_sa_head_dim, BE = d.backbone_embedding_dim;
  for (int64_t i = 0; i < d.vl_sa_layers; ++i) {
    const std::string b = "action_head.vl_self_attention.transformer_blocks." + std::to_string(i) + ".";
    layernorm(b + "norm1", BE, 2);
    linear(b + "attn1.to_q", S, BE, 2);
    linear(b + "attn1.to_k", S, BE, 2);
    linear(b + "attn1.to_v", S, BE, 2);
    linear(b + "attn1.to_out.0", BE, S, 2);
    layernorm(b + "norm3", BE, 2);
    linear(b + "ff.net.0.proj", 4 * BE, BE, 2);
    linear(b + "ff.net.2", BE, 4 * BE, 2);
  }

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
  // Tuned (tune_visual), per image and layer, from the census of the measured run
  // (groot_b32_tunevl): the fp32 norm1/norm2 inputs (the residual stream is fp32 under
  // autocast), bf16 copies for qkv, proj and fc1, the attention's six per-image bf16 tensors
  // (q, k, v, q and k after the rotary embedding, output), the GELU input and fc2's input.
  {
    const int64_t t = patches, w = V, f = d.vision_mlp;
    for (int64_t cam = 0; cam < in.cams; ++cam)
      for (int64_t x : {4 * t * w, 2 * t * w, 2 * t * w, 2 * t * w, 2 * t * w, 2 * t * w, 2 * t * w, 2 * t * w,
                        2 * t * w, 4 * t * w, 2 * t * w, 2 * t * f, 2 * t * f})
        v.saved_tensor_bytes.push_back(x);
  }
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
  // Tuned (tune_llm), per layer, from the model code (Qwen3 decoder layer, SDPA) and the census:
  // Qwen3RMSNorm upcasts its (fp32 residual) input and keeps it with the normalised fp32 tensor,
  // each of q/k/v_proj and gate/up_proj casts its own bf16 input, q_norm/k_norm keep the fp32
  // upcast and the bf16 result, SDPA keeps q and k after RoPE, v and its output (= o_proj's
  // input), the SwiGLU keeps gate's and up's outputs, act(gate) and the product (down's input).
  {
    const int64_t sw = prefix * L, sq = prefix * q, skv = prefix * kv, sf = prefix * d.lm_mlp;
    l.saved_tensor_bytes = {4 * sw, 4 * sw, 2 * sw, 2 * sw, 2 * sw, 4 * sq, 2 * sq, 4 * skv, 2 * skv,
                            2 * sq, 2 * skv, 2 * skv, 2 * sq, 4 * sw, 4 * sw, 2 * sw, 2 * sw,
                            2 * sf, 2 * sf, 2 * sf, 2 * sf};
  }
  a.blocks.push_back(l);
  // The action head, tensor by tensor from the model code (lerobot 0.6.1 groot_n1_7.py,
  // action_head/cross_attention_dit.py, diffusers Attention/FeedForward) under bf16 autocast with
  // fp32 parameters, per sample. Checked against the saved-tensor census of the measured run
  // (tools/measure_train_memory.py, groot_b32: 5.85 GiB saved besides the weights' bf16 casts).
  // Autocast rules that set the dtypes: LayerNorm runs in fp32; F.linear/bmm/SDPA in bf16, each
  // call casting its fp32 input anew (only leaf weights are cached), so every Linear saves its own
  // bf16 copy of an fp32 input; bf16 + fp32 adds promote to fp32. The residual stream is therefore
  // fp32 throughout: the backbone's hidden states (fp32 embedding + bf16 sublayer outputs), the
  // per-embodiment MLPs' outputs (bf16 bmm + fp32 bias) and every block output. SDPA (no stored
  // scores) keeps q, k, v, its output and fp32 row statistics; nn.Dropout keeps its 1-byte mask.
  const int64_t T = sa, Dd = D, F = 4 * D, Sv = prefix, Dkv = d.backbone_embedding_dim;
  ActBlock ln;
  ln.name = "vlln";
  ln.module = 2;
  ln.transformer = false;
  ln.saved_tensor_bytes = {4 * Sv * Dkv};  // LayerNorm input: the backbone's fp32 hidden states
  a.blocks.push_back(ln);
  // BasicTransformerBlock (norm_type layer_norm): norm1 input (fp32), one bf16 copy of its output
  // per to_q/to_k/to_v, q/k/v and the SDPA output (bf16), the to_out and block-final dropout
  // masks, norm3 input (fp32), the ff proj input copy, the GELU input and dropout mask (F-wide),
  // the down projection's input (the dropped bf16 GELU output) and the FeedForward's final mask.
  auto basic_block = [](int64_t t, int64_t w, int64_t f, bool ada, int64_t kv_tokens, int64_t kv_in,
                        int64_t kv_width) {
    std::vector<int64_t> out = {4 * t * w};     // norm1 input (fp32 residual)
    if (ada) out.push_back(4 * t * w);          // AdaLayerNorm: norm(x) * (1 + scale) keeps norm(x)
    out.push_back(2 * t * w);                   // to_q input (bf16 copy)
    const bool cross = kv_tokens > 0;
    const int64_t st = cross ? kv_tokens : t, sw = cross ? kv_in : w, kw = cross ? kv_width : w;
    out.push_back(2 * st * sw);                 // to_k input (a bf16 copy of its own)
    out.push_back(2 * st * sw);                 // to_v input
    out.push_back(2 * t * w);                   // q
    out.push_back(2 * st * kw);                 // k
    out.push_back(2 * st * kw);                 // v
    out.push_back(2 * t * w);                   // SDPA output = to_out input
    out.push_back(t * w);                       // to_out dropout mask
    out.push_back(t * w);                       // block final_dropout mask
    out.push_back(4 * t * w);                   // norm3 input (fp32 residual)
    out.push_back(2 * t * w);                   // ff proj input (bf16 copy)
    out.push_back(2 * t * f);                   // GELU input
    out.push_back(t * f);                       // dropout mask
    out.push_back(2 * t * f);                   // down projection input
    out.push_back(t * w);                       // FeedForward final dropout mask
    return out;
  };
  ActBlock vs;  // diffusers BasicTransformerBlock: SDPA, dropout 0.2, GELU FFN 4x
  vs.name = "VL self-attention block";
  vs.module = 2;
  vs.count = d.vl_sa_layers;
  vs.tokens_q = vs.tokens_kv = prefix;
  vs.width = BE;
  vs.q_width = vs.kv_width = S;
  vs.heads = d.vl_sa_heads;
  vs.ffn_width = 4 * BE;
  vs.dropout = true;
  vs.flash = true;
  vs.saved_tensor_bytes = basic_block(Sv, BE, 4 * BE, false, 0, 0, 0);
  a.blocks.push_back(vs);
  // DiT: AdaLayerNorm blocks; even blocks cross-attend to the VL features (K/V projected from
  // the fp32 2048-wide features, each of to_k and to_v casting its own bf16 copy), odd blocks
  // self-attend (interleave_self_attention). AlternateVLDiT only masks image vs text tokens.
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
  c.saved_tensor_bytes = basic_block(T, Dd, F, true, Sv, Dkv, Dd);
  a.blocks.push_back(c);
  ActBlock s = c;
  s.name = "DiT block (self-attn)";
  s.count = d.dit_layers / 2;
  s.tokens_kv = sa;
  s.kv_in_width = 0;
  s.saved_tensor_bytes = basic_block(T, Dd, F, true, 0, 0, 0);
  a.blocks.push_back(s);
  // Per-embodiment MLPs (CategorySpecificLinear: bmm(x, W[cat_ids]) + b[cat_ids]): the gathered
  // fp32 weight is cast to bf16 for the bmm, and that per-sample bf16 copy is what bmm keeps for
  // x's gradient -- in every layer whose input requires grad (not state_encoder.layer1 nor
  // action_encoder.W1, fed by the batch): 9.83M weights, 19.7 MB per sample. Plus the heads'
  // small activations: W2/W3 inputs, the action encoder's fp32 output and swish, the DiT output
  // norm, proj_out_2's input, the decoder's fp32 output and layer inputs, the loss terms.
  const int64_t A = d.max_action_dim, Ch = in.chunk;
  ActBlock h;
  h.name = "state/action encoders, decoder";
  h.module = 4;
  h.transformer = false;
  h.saved_tensor_bytes = {2 * H * I, 2 * 2 * I * I, 2 * I * I, 2 * H * H, 2 * H * A,  // bf16 weight copies
                          2 * Ch * 2 * I, 2 * Ch * I, 2 * 4 * Ch * I,                  // W2, W3 inputs; fp32 out, swish
                          4 * T * D, 4 * T * D, 2 * T * D,                            // DiT out, norm_out, proj_out_2 in
                          4 * T * H, 2 * T * H, 2 * T * H, 3 * 4 * Ch * A};            // decoder, loss
  a.blocks.push_back(h);
  a.description = "GR00T N1.7: Qwen3-VL ViT " + std::to_string(V) + "x" + std::to_string(d.vision_depth) +
                  ", Qwen3 LLM " + std::to_string(L) + "x" + std::to_string(d.select_layer) + " (of " +
                  std::to_string(d.lm_layers_total) + "), DiT " + std::to_string(D) + "x" +
                  std::to_string(d.dit_layers) + " + VL self-attention x" + std::to_string(d.vl_sa_layers) +
                  "; checked against the model code's tensor list (src/models/groot_arch)";
  return a;
}

}  // namespace vlac
