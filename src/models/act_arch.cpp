// ACT tensor table: torchvision resnet18 trunk enumerated layer by layer, nn.MultiheadAttention
// layers (in_proj [3d, d]), lerobot's projections; reproduces spec 7.3's ~51.6M for 14-dim.
#include "models/act_arch.h"

#include <string>

namespace vlac {

std::vector<ConvTensor> resnet18_trunk_tensors() {
  std::vector<ConvTensor> t;
  auto conv = [&](const std::string& name, int64_t out, int64_t in, int64_t k) {
    t.push_back({name + ".weight", {out, in, k, k}, false});
  };
  auto bn = [&](const std::string& name, int64_t c) {
    for (const char* s : {".weight", ".bias", ".running_mean", ".running_var"}) t.push_back({name + s, {c}, true});
  };
  conv("conv1", 64, 3, 7);
  bn("bn1", 64);
  const int64_t widths[4] = {64, 128, 256, 512};
  int64_t in = 64;
  for (int layer = 0; layer < 4; ++layer) {
    const int64_t c = widths[layer];
    for (int blk = 0; blk < 2; ++blk) {
      const std::string p = "layer" + std::to_string(layer + 1) + "." + std::to_string(blk) + ".";
      const int64_t cin = blk == 0 ? in : c;
      conv(p + "conv1", c, cin, 3);
      bn(p + "bn1", c);
      conv(p + "conv2", c, c, 3);
      bn(p + "bn2", c);
      if (blk == 0 && layer > 0) {  // stride-2 blocks get a 1x1 projection shortcut
        conv(p + "downsample.0", c, cin, 1);
        bn(p + "downsample.1", c);
      }
    }
    in = c;
  }
  return t;
}

void resnet18_saved_activations(int64_t h, int64_t w, int64_t* elements, int64_t* extra_bytes,
                                std::vector<int64_t>* tensors) {
  // What autograd keeps (frozen BN is x*scale+bias with buffer scale: only the scale is saved;
  // in-place ReLU keeps its output, which is also the next conv's saved input):
  //   stem: the image (conv1 input), ReLU output at /2, max-pool output at /4 (+ int64 indices);
  //   each BasicBlock: the ReLU output after conv1 and the block's output ReLU (2 maps of its size).
  auto down = [](int64_t x, int f) { return (x + f - 1) / f; };
  std::vector<int64_t> t = {3 * h * w, 64 * down(h, 2) * down(w, 2)};
  const int64_t pooled = 64 * down(h, 4) * down(w, 4);
  t.push_back(pooled);
  *extra_bytes = pooled * 8;
  const int64_t widths[4] = {64, 128, 256, 512};
  const int strides[4] = {4, 8, 16, 32};
  for (int layer = 0; layer < 4; ++layer)
    for (int k = 0; k < 2 /*blocks*/ * 2 /*maps*/; ++k)
      t.push_back(widths[layer] * down(h, strides[layer]) * down(w, strides[layer]));
  int64_t e = 0;
  for (int64_t x : t) e += x;
  *elements = e;
  if (tensors) *tensors = std::move(t);
}

Result<PolicyArch> act_policy_arch(const ActDims& d, const PolicyInputs& in) {
  if (in.image_h < 32 || in.image_w < 32) return invalid_argument("act: images must be at least 32 px (ResNet-18 stride 32)");
  PolicyArch a;
  a.kind = PolicyKind::Act;
  a.inputs = in;
  a.modules = {
      {"backbone", ModuleRole::Vision, true, DtypeRule::Follow, {}},       // trained at lr 1e-5
      {"input_proj", ModuleRole::Projector, true, DtypeRule::Follow, {0}},
      {"encoder", ModuleRole::Encoder, true, DtypeRule::Follow, {1, 4}},
      {"decoder", ModuleRole::Encoder, true, DtypeRule::Follow, {2, 5}},
      {"vae_encoder", ModuleRole::Encoder, true, DtypeRule::Follow, {}},  // training only
      {"heads", ModuleRole::Heads, true, DtypeRule::Follow, {}},
  };
  auto add = [&](std::string name, std::vector<int64_t> shape, int m, bool buffer = false) {
    a.params.push_back({std::move(name), std::move(shape), m, !buffer, buffer});
  };
  for (const ConvTensor& t : resnet18_trunk_tensors()) add("model.backbone." + t.name, t.shape, 0, t.is_buffer);

  const int64_t D = d.dim_model;
  auto mha = [&](const std::string& p, int m) {
    add(p + ".in_proj_weight", {3 * D, D}, m);
    add(p + ".in_proj_bias", {3 * D}, m);
    add(p + ".out_proj.weight", {D, D}, m);
    add(p + ".out_proj.bias", {D}, m);
  };
  auto linear = [&](const std::string& p, int64_t out, int64_t inw, int m) {
    add(p + ".weight", {out, inw}, m);
    add(p + ".bias", {out}, m);
  };
  auto norm = [&](const std::string& p, int m) {
    add(p + ".weight", {D}, m);
    add(p + ".bias", {D}, m);
  };
  auto encoder_stack = [&](const std::string& root, int64_t layers, int m) {
    for (int64_t i = 0; i < layers; ++i) {
      const std::string l = root + ".layers." + std::to_string(i);
      mha(l + ".self_attn", m);
      linear(l + ".linear1", d.ffn, D, m);
      linear(l + ".linear2", D, d.ffn, m);
      norm(l + ".norm1", m);
      norm(l + ".norm2", m);
    }
    // post-norm (pre_norm=False): the encoder's final norm is nn.Identity
  };
  linear("model.encoder_img_feat_input_proj", D, 512, 1);  // Conv2d 1x1: [D, 512, 1, 1]
  a.params[a.params.size() - 2].shape = {D, 512, 1, 1};
  linear("model.encoder_robot_state_input_proj", D, in.state_dim, 1);
  linear("model.encoder_latent_input_proj", D, d.latent_dim, 1);
  add("model.encoder_1d_feature_pos_embed.weight", {2, D}, 1);  // latent + state tokens
  encoder_stack("model.encoder", d.encoder_layers, 2);
  for (int64_t i = 0; i < d.decoder_layers; ++i) {
    const std::string l = "model.decoder.layers." + std::to_string(i);
    mha(l + ".self_attn", 3);
    mha(l + ".multihead_attn", 3);
    linear(l + ".linear1", d.ffn, D, 3);
    linear(l + ".linear2", D, d.ffn, 3);
    norm(l + ".norm1", 3);
    norm(l + ".norm2", 3);
    norm(l + ".norm3", 3);
  }
  norm("model.decoder.norm", 3);
  if (d.use_vae) {
    add("model.vae_encoder_cls_embed.weight", {1, D}, 4);
    linear("model.vae_encoder_robot_state_input_proj", D, in.state_dim, 4);
    linear("model.vae_encoder_action_input_proj", D, in.action_dim, 4);
    linear("model.vae_encoder_latent_output_proj", 2 * d.latent_dim, D, 4);
    add("model.vae_encoder_pos_enc", {1, in.chunk + 2, D}, 4, true);  // sinusoidal buffer
    encoder_stack("model.vae_encoder", d.vae_encoder_layers, 4);
  }
  add("model.decoder_pos_embed.weight", {in.chunk, D}, 5);
  linear("model.action_head", in.action_dim, D, 5);

  // Activations: cameras go through the shared trunk one image at a time (batched over cams).
  const int64_t fh = (in.image_h + 31) / 32, fw = (in.image_w + 31) / 32;
  a.image_tokens_per_cam = fh * fw;
  const int64_t enc_tokens = 2 + in.cams * fh * fw;
  a.prefix_tokens = enc_tokens;
  ActBlock bb;
  bb.name = "ResNet-18 trunk";
  bb.module = 0;
  bb.transformer = false;
  int64_t el = 0, extra = 0;
  std::vector<int64_t> maps;
  resnet18_saved_activations(in.image_h, in.image_w, &el, &extra, &maps);
  bb.raw_elements = in.cams * el;
  bb.raw_extra_bytes = in.cams * extra;
  for (int64_t c = 0; c < in.cams; ++c) bb.raw_tensor_elements.insert(bb.raw_tensor_elements.end(), maps.begin(), maps.end());
  a.blocks.push_back(bb);
  ActBlock ip;
  ip.name = "input projections";
  ip.module = 1;
  ip.transformer = false;
  ip.raw_elements = in.cams * fh * fw * 512 + in.state_dim + d.latent_dim;
  a.blocks.push_back(ip);
  ActBlock e;  // post-norm DETR layer; nn.MultiheadAttention returns its weights (need_weights) so
  e.name = "encoder layer";  // the softmax is materialised; dropout 0.1 everywhere
  e.module = 2;
  e.count = d.encoder_layers;
  e.tokens_q = e.tokens_kv = enc_tokens;
  e.width = e.q_width = e.kv_width = D;
  e.heads = d.heads;
  e.ffn_width = d.ffn;
  e.dropout = true;
  a.blocks.push_back(e);
  ActBlock ds = e;
  ds.name = "decoder self-attention";
  ds.module = 3;
  ds.count = d.decoder_layers;
  ds.tokens_q = ds.tokens_kv = in.chunk;
  ds.ffn_width = 0;
  ds.norms = 1;
  a.blocks.push_back(ds);
  ActBlock dc = e;
  dc.name = "decoder cross-attention + FFN";
  dc.module = 3;
  dc.count = d.decoder_layers;
  dc.tokens_q = in.chunk;
  dc.tokens_kv = enc_tokens;
  dc.kv_in_width = D;
  a.blocks.push_back(dc);
  if (d.use_vae) {
    ActBlock v = e;
    v.name = "VAE encoder layer";
    v.module = 4;
    v.count = d.vae_encoder_layers;
    v.tokens_q = v.tokens_kv = in.chunk + 2;
    a.blocks.push_back(v);
  }
  ActBlock h;
  h.name = "action head";
  h.module = 5;
  h.transformer = false;
  h.raw_elements = in.chunk * D;
  a.blocks.push_back(h);
  a.description = "ACT (lerobot): ResNet-18 trunk, d_model " + std::to_string(D) + ", " +
                  std::to_string(d.encoder_layers) + " encoder / " + std::to_string(d.decoder_layers) +
                  " decoder layers" + (d.use_vae ? ", VAE encoder " + std::to_string(d.vae_encoder_layers) : std::string()) +
                  " (src/models/act_arch)";
  return a;
}

}  // namespace vlac
