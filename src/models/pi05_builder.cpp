// pi0.5 model builder (spec: ../shared/spec/pi05.md sections 1-4, fixtures README for the
// settled points). Builds graphs on meta only: weight references, never weight bytes.
#include "models/pi05_builder.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "io/json_reader.h"

namespace vlac {

using ir::Attrs;
using ir::OpKind;
using ir::ValueId;
using ir::ValueInfo;

namespace {

constexpr double kNormEps = 1e-6;
constexpr double kRopeBase = 10000.0;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

const std::string kPwe = "paligemma_with_expert.";
const std::string kPg = "paligemma_with_expert.paligemma.model.";
const std::string kLm = "paligemma_with_expert.paligemma.model.language_model.";
const std::string kEx = "paligemma_with_expert.gemma_expert.model.";

}  // namespace

ir::ValueId Pi05Graph::output(const std::string& name) const {
  for (const auto& [n, v] : outputs)
    if (n == name) return v;
  return ir::kNone;
}


// ---------------------------------------------------------------------------------------------
// Weight binding

// Binds lerobot names to weight nodes of one graph (one node per tensor, shared by all users).
class Pi05Model::Binder {
 public:
  Binder(const Pi05Model& m, ir::Graph* g) : m_(m), g_(g) {}

  /// The full key of a bare name (optional "model." prefix), or "" if absent.
  static std::string resolve(const TensorSet& ts, const std::string& bare) {
    for (const std::string& name : {"model." + bare, bare})
      if (ts.find(name)) return name;
    return {};
  }

  Result<ValueId> get(const std::string& bare, const std::vector<int64_t>& shape) {
    auto cached = cache_.find(bare);
    if (cached != cache_.end()) return cached->second;
    const std::string name = resolve(*m_.tensors_, bare);
    if (name.empty())
      return not_found(m_.weights_path_ + ": missing tensor '" + m_.root_ + bare + "'");
    const TensorSet::Entry* e = m_.tensors_->find(name);
    if (e->info->shape != shape)
      return shape_mismatch(m_.weights_path_ + ": tensor '" + name + "' has shape " +
                            shape_str(e->info->shape) + ", expected " + shape_str(shape));
    if (!dtype_is_float(e->info->dtype) || e->info->dtype == DType::F64 ||
        e->info->dtype == DType::F8_E4M3 || e->info->dtype == DType::F8_E5M2)
      return unsupported(m_.weights_path_ + ": tensor '" + name + "' has dtype " +
                         dtype_name(e->info->dtype) + " (vlac reads F32, BF16 and F16 weights)");
    ir::WeightRef ref;
    ref.name = name;
    ref.file_id = 0;
    for (size_t i = 0; i < m_.tensors_->files().size(); ++i)
      if (m_.tensors_->files()[i].get() == e->file) ref.file_id = uint32_t(i);
    ref.offset = e->file->data_offset() + e->info->data_begin;
    ref.dtype = e->info->dtype;
    ref.shape = e->info->shape;
    ref.bytes = e->info->nbytes();
    ValueId v = g_->weight(std::move(ref));
    cache_.emplace(bare, v);
    return v;
  }

 private:
  const Pi05Model& m_;
  ir::Graph* g_;
  std::map<std::string, ValueId> cache_;
};

// ---------------------------------------------------------------------------------------------
// Sizes from shapes

Status Pi05Model::derive_dims() {
  const TensorSet& ts = *tensors_;
  auto shape_of = [&](const std::string& bare) -> const std::vector<int64_t>* {
    std::string n = Binder::resolve(ts, bare);
    return n.empty() ? nullptr : &ts.find(n)->info->shape;
  };
  auto need = [&](const std::string& bare, size_t rank) -> Result<std::vector<int64_t>> {
    const auto* s = shape_of(bare);
    if (!s) return not_found(weights_path_ + ": missing tensor '" + root_ + bare + "'");
    if (s->size() != rank)
      return shape_mismatch(weights_path_ + ": tensor '" + Binder::resolve(ts, bare) + "' has shape " +
                            shape_str(*s) + ", expected rank " + std::to_string(rank));
    for (int64_t d : *s)
      if (d <= 0)
        return shape_mismatch(weights_path_ + ": tensor '" + Binder::resolve(ts, bare) +
                              "' has an empty dimension " + shape_str(*s));
    return *s;
  };
  root_ = ts.find("model.action_in_proj.weight") || ts.find("model." + kPg + "multi_modal_projector.linear.weight")
              ? "model." : "";
  // Vision keys with or without "vision_model." (transformers >= 5.6 flattened SiglipVisionModel).
  vision_root_ = kPg + "vision_tower.vision_model.";
  if (!shape_of(vision_root_ + "embeddings.patch_embedding.weight") &&
      shape_of(kPg + "vision_tower.embeddings.patch_embedding.weight"))
    vision_root_ = kPg + "vision_tower.";
  legacy_time_names_ = !shape_of("time_mlp_in.weight") && shape_of("action_time_mlp_in.weight");
  embed_name_ = shape_of(kLm + "embed_tokens.weight") ? kLm + "embed_tokens.weight"
                                                       : kPwe + "paligemma.lm_head.weight";

  Pi05Dims& d = dims_;
  VLAC_ASSIGN_OR_RETURN(auto patch, need(vision_root_ + "embeddings.patch_embedding.weight", 4));
  d.vision_width = patch[0];
  d.channels = patch[1];
  if (patch[2] != patch[3])
    return unsupported(weights_path_ + ": patch_embedding " + shape_str(patch) + " is not square");
  d.patch_size = patch[2];
  d.image_size = config_.image_resolution;
  d.vision_heads = config_.vision_heads;
  VLAC_ASSIGN_OR_RETURN(auto pos, need(vision_root_ + "embeddings.position_embedding.weight", 2));
  n_img_ = pos[0];
  if (d.image_size % d.patch_size != 0 || d.patches_per_image() != n_img_)
    return shape_mismatch(weights_path_ + ": position_embedding has " + std::to_string(n_img_) +
                          " rows but image_resolution " + std::to_string(d.image_size) + " with patch " +
                          std::to_string(d.patch_size) + " gives " +
                          std::to_string(d.patches_per_image()) + " patches");
  d.vision_depth = 0;
  while (shape_of(vision_root_ + "encoder.layers." + std::to_string(d.vision_depth) + ".layer_norm1.weight"))
    ++d.vision_depth;
  if (d.vision_depth > 0) {
    VLAC_ASSIGN_OR_RETURN(auto fc1, need(vision_root_ + "encoder.layers.0.mlp.fc1.weight", 2));
    d.vision_mlp = fc1[0];
  }
  if (d.vision_width % d.vision_heads != 0)
    return invalid_format(config_path() + ": SigLIP width " + std::to_string(d.vision_width) +
                          " is not divisible by vision_num_attention_heads " + std::to_string(d.vision_heads));

  VLAC_ASSIGN_OR_RETURN(auto emb, need(embed_name_, 2));
  d.vocab = emb[0];
  d.lm_width = emb[1];
  d.lm_depth = 0;
  while (shape_of(kLm + "layers." + std::to_string(d.lm_depth) + ".input_layernorm.weight")) ++d.lm_depth;
  if (d.lm_depth == 0) return not_found(weights_path_ + ": missing tensor '" + root_ + kLm + "layers.0.input_layernorm.weight'");
  VLAC_ASSIGN_OR_RETURN(auto k0, need(kLm + "layers.0.self_attn.k_proj.weight", 2));
  d.kv_heads = 1;  // pi0.5's Gemmas have one KV head: head_dim = k_proj rows
  d.head_dim = k0[0];
  if (d.head_dim % 2 != 0)
    return shape_mismatch(weights_path_ + ": k_proj rows " + std::to_string(d.head_dim) + " (head_dim) must be even for RoPE");

  VLAC_ASSIGN_OR_RETURN(auto ada, need(kEx + "layers.0.input_layernorm.dense.weight", 2));
  d.expert_width = ada[1];
  VLAC_ASSIGN_OR_RETURN(auto eq, need(kEx + "layers.0.self_attn.q_proj.weight", 2));
  if (eq[0] % d.head_dim != 0)
    return shape_mismatch(weights_path_ + ": expert q_proj rows " + std::to_string(eq[0]) +
                          " are not a multiple of head_dim " + std::to_string(d.head_dim));
  d.expert_heads = eq[0] / d.head_dim;
  VLAC_ASSIGN_OR_RETURN(auto eg, need(kEx + "layers.0.mlp.gate_proj.weight", 2));
  d.expert_mlp = eg[0];
  int64_t ex_depth = 0;
  while (shape_of(kEx + "layers." + std::to_string(ex_depth) + ".input_layernorm.dense.weight")) ++ex_depth;
  if (ex_depth != d.lm_depth)
    return shape_mismatch(weights_path_ + ": the action expert has " + std::to_string(ex_depth) +
                          " layers, the VLM " + std::to_string(d.lm_depth) + " (pi0.5 needs equal depth)");
  // Query heads and MLP of the VLM: from layer 0 unless it is the (K/V-only) last layer.
  if (d.lm_depth > 1) {
    VLAC_ASSIGN_OR_RETURN(auto q0, need(kLm + "layers.0.self_attn.q_proj.weight", 2));
    if (q0[0] % d.head_dim != 0)
      return shape_mismatch(weights_path_ + ": q_proj rows " + std::to_string(q0[0]) +
                            " are not a multiple of head_dim " + std::to_string(d.head_dim));
    d.lm_heads = q0[0] / d.head_dim;
    VLAC_ASSIGN_OR_RETURN(auto g0, need(kLm + "layers.0.mlp.gate_proj.weight", 2));
    d.lm_mlp = g0[0];
  } else {
    d.lm_heads = d.expert_heads;
    d.lm_mlp = 1;
  }
  VLAC_ASSIGN_OR_RETURN(auto ain, need("action_in_proj.weight", 2));
  d.max_action_dim = ain[1];
  if (ain[1] != config_.max_action_dim)
    return shape_mismatch(weights_path_ + ": tensor '" + Binder::resolve(ts, "action_in_proj.weight") +
                          "' has " + std::to_string(ain[1]) + " input columns but config.json max_action_dim is " +
                          std::to_string(config_.max_action_dim));
  return Status::ok();
}

std::string Pi05Model::config_path() const { return dir_ + "/config.json"; }

Result<Pi05Model> Pi05Model::load(const std::string& policy_dir) {
  Pi05Model m;
  m.dir_ = policy_dir;
  VLAC_ASSIGN_OR_RETURN(m.config_, parse_pi05_config(m.config_path()));
  VLAC_ASSIGN_OR_RETURN(TensorSet ts, TensorSet::open(policy_dir));
  m.weights_path_ = ts.source();
  m.tensors_ = std::make_unique<TensorSet>(std::move(ts));
  VLAC_RETURN_IF_ERROR(m.derive_dims());
  // Bind and check every weight inference reads: build both graphs once.
  VLAC_ASSIGN_OR_RETURN(Pi05Graph pg, m.build_prefix(m.nominal_prefix()));
  VLAC_ASSIGN_OR_RETURN(Pi05Graph sg, m.build_step(int64_t(m.config_.cameras.size()) * m.n_img_ +
                                                   m.config_.tokenizer_max_length));
  (void)pg;
  (void)sg;
  return m;
}

Pi05EulerSpec Pi05Model::euler() const {
  Pi05EulerSpec e;
  e.steps = config_.num_inference_steps;
  e.dt = float(-1.0 / double(e.steps));
  return e;
}

Pi05PrefixShape Pi05Model::nominal_prefix() const {
  return Pi05PrefixShape{config_.cameras, config_.tokenizer_max_length};
}

bool Pi05Model::lerobot_bf16_weight(const std::string& name) {
  if (name.find("paligemma_with_expert") == std::string::npos) return false;
  for (const char* keep : {"vision_tower", "multi_modal_projector", "input_layernorm",
                           "post_attention_layernorm", "model.norm"})
    if (name.find(keep) != std::string::npos) return false;
  return true;
}

bool Pi05Model::gather_only_weight(const std::string& name) {
  return name.find("embed_tokens") != std::string::npos || name.find("lm_head") != std::string::npos;
}

bool Pi05Model::vision_weight(const std::string& name) {
  if (name.find("position_embedding") != std::string::npos) return false;  // read by an fp32 Add
  return name.find("vision_tower") != std::string::npos || name.find("multi_modal_projector") != std::string::npos;
}

DType Pi05Model::run_dtype(const ir::WeightRef& r, bool bf16, bool vision_bf16) {
  const bool table = r.name.find("embed_tokens") != std::string::npos || r.name.find("lm_head") != std::string::npos;
  if (table && r.dtype == DType::BF16) return DType::BF16;
  if (table && r.dtype == DType::F32) return bf16 ? DType::BF16 : DType::F32;
  // vision_bf16 (an opt-in beyond lerobot's bf16 mode): SigLIP's matrices in bf16 too.
  const bool to_bf16 = lerobot_bf16_weight(r.name) || (vision_bf16 && vision_weight(r.name));
  return bf16 && to_bf16 && r.shape.size() == 2 ? DType::BF16 : DType::F32;
}

// ---------------------------------------------------------------------------------------------
// Graphs

namespace {

// Small helpers over Graph::add that keep the builder readable.
struct G {
  ir::Graph& g;
  Result<ValueId> op(OpKind k, std::vector<ValueId> in, Attrs a, std::string name) {
    return g.add(k, std::move(in), std::move(a), std::move(name));
  }
  Result<ValueId> reshape(ValueId x, std::vector<int64_t> s, std::string name) {
    return g.add(OpKind::Reshape, {x}, Attrs{{"shape", std::move(s)}}, std::move(name));
  }
};

}  // namespace

Result<ValueId> Pi05Model::add_vision(ir::Graph& g, Binder& w, ValueId img, const std::string& tag,
                                      const std::string& proj_tag,
                                      std::vector<std::pair<std::string, ValueId>>* debug_out,
                                      const std::string& cam) const {
  const Pi05Dims& d = dims_;
  G b{g};
  const int64_t V = d.vision_width, W = d.lm_width;
  auto vm = [&](const std::string& s) { return vision_root_ + s; };
  VLAC_ASSIGN_OR_RETURN(ValueId pw, w.get(vm("embeddings.patch_embedding.weight"), {V, d.channels, d.patch_size, d.patch_size}));
  VLAC_ASSIGN_OR_RETURN(ValueId pb, w.get(vm("embeddings.patch_embedding.bias"), {V}));
  VLAC_ASSIGN_OR_RETURN(ValueId pe, w.get(vm("embeddings.position_embedding.weight"), {n_img_, V}));
  // A batched image input [N,C,R,R] (build_vision): the N images' tokens one after another,
  // every op row-wise except attention, which stays within an image (kv_block). -1 in the
  // reshapes lets ir::respecialize give it any N.
  const bool batched = g.info(img).shape.size() == 4;
  const int64_t rows = batched ? -1 : n_img_;
  VLAC_ASSIGN_OR_RETURN(ValueId h, b.op(OpKind::PatchEmbed, {img, pw, pb}, {}, tag + ".patch_embed"));
  if (batched) {
    VLAC_ASSIGN_OR_RETURN(h, b.reshape(h, {-1, n_img_, V}, tag + ".patch_embed.images"));
    VLAC_ASSIGN_OR_RETURN(h, b.op(OpKind::Add, {h, pe}, {}, tag + ".pos_embed"));
    VLAC_ASSIGN_OR_RETURN(h, b.reshape(h, {-1, V}, tag + ".pos_embed.rows"));
  } else {
    VLAC_ASSIGN_OR_RETURN(h, b.op(OpKind::Add, {h, pe}, {}, tag + ".pos_embed"));
  }
  const int64_t vh = d.vision_heads, vhd = V / vh;
  Attrs att{{"scale", 1.0 / std::sqrt(double(vhd))}};
  if (batched) att.set("kv_block", n_img_);
  for (int64_t l = 0; l < d.vision_depth; ++l) {
    const std::string p = "encoder.layers." + std::to_string(l) + ".";
    const std::string t = tag + "." + std::to_string(l) + ".";
    VLAC_ASSIGN_OR_RETURN(ValueId n1w, w.get(vm(p + "layer_norm1.weight"), {V}));
    VLAC_ASSIGN_OR_RETURN(ValueId n1b, w.get(vm(p + "layer_norm1.bias"), {V}));
    VLAC_ASSIGN_OR_RETURN(ValueId u, b.op(OpKind::LayerNorm, {h, n1w, n1b}, Attrs{{"eps", kNormEps}}, t + "ln1"));
    ValueId qkv[3];
    const char* names[3] = {"q_proj", "k_proj", "v_proj"};
    for (int i = 0; i < 3; ++i) {
      VLAC_ASSIGN_OR_RETURN(ValueId pw2, w.get(vm(p + "self_attn." + names[i] + ".weight"), {V, V}));
      VLAC_ASSIGN_OR_RETURN(ValueId pb2, w.get(vm(p + "self_attn." + names[i] + ".bias"), {V}));
      VLAC_ASSIGN_OR_RETURN(ValueId y, b.op(OpKind::Linear, {u, pw2, pb2}, {}, t + names[i]));
      VLAC_ASSIGN_OR_RETURN(qkv[i], b.reshape(y, {rows, vh, vhd}, t + names[i] + ".heads"));
    }
    VLAC_ASSIGN_OR_RETURN(ValueId a, b.op(OpKind::Attention, {qkv[0], qkv[1], qkv[2]}, att, t + "attention"));
    VLAC_ASSIGN_OR_RETURN(a, b.reshape(a, {rows, V}, t + "attention.merge"));
    VLAC_ASSIGN_OR_RETURN(ValueId ow, w.get(vm(p + "self_attn.out_proj.weight"), {V, V}));
    VLAC_ASSIGN_OR_RETURN(ValueId ob, w.get(vm(p + "self_attn.out_proj.bias"), {V}));
    VLAC_ASSIGN_OR_RETURN(a, b.op(OpKind::Linear, {a, ow, ob}, {}, t + "out_proj"));
    VLAC_ASSIGN_OR_RETURN(h, b.op(OpKind::Add, {h, a}, {}, t + "residual1"));
    VLAC_ASSIGN_OR_RETURN(ValueId n2w, w.get(vm(p + "layer_norm2.weight"), {V}));
    VLAC_ASSIGN_OR_RETURN(ValueId n2b, w.get(vm(p + "layer_norm2.bias"), {V}));
    VLAC_ASSIGN_OR_RETURN(u, b.op(OpKind::LayerNorm, {h, n2w, n2b}, Attrs{{"eps", kNormEps}}, t + "ln2"));
    VLAC_ASSIGN_OR_RETURN(ValueId f1w, w.get(vm(p + "mlp.fc1.weight"), {d.vision_mlp, V}));
    VLAC_ASSIGN_OR_RETURN(ValueId f1b, w.get(vm(p + "mlp.fc1.bias"), {d.vision_mlp}));
    VLAC_ASSIGN_OR_RETURN(ValueId f2w, w.get(vm(p + "mlp.fc2.weight"), {V, d.vision_mlp}));
    VLAC_ASSIGN_OR_RETURN(ValueId f2b, w.get(vm(p + "mlp.fc2.bias"), {V}));
    VLAC_ASSIGN_OR_RETURN(ValueId f, b.op(OpKind::Linear, {u, f1w, f1b}, {}, t + "fc1"));
    VLAC_ASSIGN_OR_RETURN(f, b.op(OpKind::GeluTanh, {f}, {}, t + "gelu"));
    VLAC_ASSIGN_OR_RETURN(f, b.op(OpKind::Linear, {f, f2w, f2b}, {}, t + "fc2"));
    VLAC_ASSIGN_OR_RETURN(h, b.op(OpKind::Add, {h, f}, {}, t + "residual2"));
  }
  VLAC_ASSIGN_OR_RETURN(ValueId plw, w.get(vm("post_layernorm.weight"), {V}));
  VLAC_ASSIGN_OR_RETURN(ValueId plb, w.get(vm("post_layernorm.bias"), {V}));
  VLAC_ASSIGN_OR_RETURN(h, b.op(OpKind::LayerNorm, {h, plw, plb}, Attrs{{"eps", kNormEps}}, tag + ".post_layernorm"));
  if (debug_out) debug_out->emplace_back("vision_out." + cam, h);
  VLAC_ASSIGN_OR_RETURN(ValueId jw, w.get(kPg + "multi_modal_projector.linear.weight", {W, V}));
  VLAC_ASSIGN_OR_RETURN(ValueId jb, w.get(kPg + "multi_modal_projector.linear.bias", {W}));
  VLAC_ASSIGN_OR_RETURN(ValueId tok, b.op(OpKind::Linear, {h, jw, jb}, {}, proj_tag));
  if (debug_out) debug_out->emplace_back("image_tokens." + cam, tok);
  return tok;
}

Result<ValueId> Pi05Model::add_text_embed(ir::Graph& g, Binder& w, ValueId ids) const {
  const Pi05Dims& d = dims_;
  G b{g};
  const int64_t W = d.lm_width;
  VLAC_ASSIGN_OR_RETURN(ValueId table, w.get(embed_name_, {d.vocab, W}));
  // transformers' GemmaTextScaledWordEmbedding: sqrt(W) held as a float32 tensor, cast to the
  // table's dtype (attr round_scale_to_table: the executor rounds it to the run dtype).
  const double scale = double(float(std::sqrt(double(W))));
  VLAC_ASSIGN_OR_RETURN(ValueId te, b.op(OpKind::Embedding, {table, ids},
                                         Attrs{{"scale", scale}, {"round_scale_to_table", int64_t{1}}},
                                         "text_embed"));
  if (g.info(te).dtype != DType::F32) {  // a bf16/f16 table gives rows in its dtype
    VLAC_ASSIGN_OR_RETURN(te, b.op(OpKind::Cast, {te}, Attrs{{"dtype", std::string("F32")}}, "text_embed.f32"));
  }
  return te;
}

Status Pi05Model::add_lm(ir::Graph& g, Binder& w, ValueId h, ValueId pos,
                         std::vector<std::pair<std::string, ValueId>>* outs, bool debug) const {
  const Pi05Dims& d = dims_;
  G b{g};
  const int64_t W = d.lm_width, hd = d.head_dim;
  const int64_t nh = d.lm_heads, attn = nh * hd;
  for (int64_t l = 0; l < d.lm_depth; ++l) {
    const std::string p = kLm + "layers." + std::to_string(l) + ".";
    const std::string t = "lm." + std::to_string(l) + ".";
    const bool last = l + 1 == d.lm_depth;
    VLAC_ASSIGN_OR_RETURN(ValueId inw, w.get(p + "input_layernorm.weight", {W}));
    VLAC_ASSIGN_OR_RETURN(ValueId u, b.op(OpKind::RMSNorm, {h, inw}, Attrs{{"eps", kNormEps}}, t + "input_layernorm"));
    VLAC_ASSIGN_OR_RETURN(ValueId kw, w.get(p + "self_attn.k_proj.weight", {hd, W}));
    VLAC_ASSIGN_OR_RETURN(ValueId vw, w.get(p + "self_attn.v_proj.weight", {hd, W}));
    VLAC_ASSIGN_OR_RETURN(ValueId k, b.op(OpKind::Linear, {u, kw}, {}, t + "k_proj"));
    VLAC_ASSIGN_OR_RETURN(k, b.reshape(k, {-1, 1, hd}, t + "k.heads"));
    VLAC_ASSIGN_OR_RETURN(k, b.op(OpKind::RoPE, {k, pos}, Attrs{{"base", kRopeBase}}, t + "k.rope"));
    VLAC_ASSIGN_OR_RETURN(ValueId v, b.op(OpKind::Linear, {u, vw}, {}, t + "v_proj"));
    VLAC_ASSIGN_OR_RETURN(v, b.reshape(v, {-1, 1, hd}, t + "v.heads"));
    outs->emplace_back("prefix.k." + std::to_string(l), k);
    outs->emplace_back("prefix.v." + std::to_string(l), v);
    if (last) break;  // the last layer's hidden state is never read
    VLAC_ASSIGN_OR_RETURN(ValueId qw, w.get(p + "self_attn.q_proj.weight", {attn, W}));
    VLAC_ASSIGN_OR_RETURN(ValueId ow, w.get(p + "self_attn.o_proj.weight", {W, attn}));
    VLAC_ASSIGN_OR_RETURN(ValueId q, b.op(OpKind::Linear, {u, qw}, {}, t + "q_proj"));
    VLAC_ASSIGN_OR_RETURN(q, b.reshape(q, {-1, nh, hd}, t + "q.heads"));
    VLAC_ASSIGN_OR_RETURN(q, b.op(OpKind::RoPE, {q, pos}, Attrs{{"base", kRopeBase}}, t + "q.rope"));
    VLAC_ASSIGN_OR_RETURN(ValueId a, b.op(OpKind::Attention, {q, k, v},
                                          Attrs{{"scale", 1.0 / std::sqrt(double(hd))}}, t + "attention"));
    VLAC_ASSIGN_OR_RETURN(a, b.reshape(a, {-1, attn}, t + "attention.merge"));
    VLAC_ASSIGN_OR_RETURN(a, b.op(OpKind::Linear, {a, ow}, {}, t + "o_proj"));
    VLAC_ASSIGN_OR_RETURN(h, b.op(OpKind::Add, {h, a}, {}, t + "residual1"));
    VLAC_ASSIGN_OR_RETURN(ValueId pw, w.get(p + "post_attention_layernorm.weight", {W}));
    VLAC_ASSIGN_OR_RETURN(u, b.op(OpKind::RMSNorm, {h, pw}, Attrs{{"eps", kNormEps}}, t + "post_attention_layernorm"));
    VLAC_ASSIGN_OR_RETURN(ValueId gw, w.get(p + "mlp.gate_proj.weight", {d.lm_mlp, W}));
    VLAC_ASSIGN_OR_RETURN(ValueId uw, w.get(p + "mlp.up_proj.weight", {d.lm_mlp, W}));
    VLAC_ASSIGN_OR_RETURN(ValueId dw, w.get(p + "mlp.down_proj.weight", {W, d.lm_mlp}));
    VLAC_ASSIGN_OR_RETURN(ValueId gt, b.op(OpKind::Linear, {u, gw}, {}, t + "gate_proj"));
    VLAC_ASSIGN_OR_RETURN(ValueId up, b.op(OpKind::Linear, {u, uw}, {}, t + "up_proj"));
    VLAC_ASSIGN_OR_RETURN(ValueId m, b.op(OpKind::GeGLU, {gt, up}, {}, t + "geglu"));
    VLAC_ASSIGN_OR_RETURN(m, b.op(OpKind::Linear, {m, dw}, {}, t + "down_proj"));
    VLAC_ASSIGN_OR_RETURN(h, b.op(OpKind::Add, {h, m}, {}, t + "residual2"));
    if (debug) outs->emplace_back("prefix_hidden." + std::to_string(l), h);
  }
  return Status::ok();
}

Result<Pi05Graph> Pi05Model::build_vision(int64_t images) const {
  if (images < 0) return invalid_argument("pi0.5 vision: a negative image count");
  const Pi05Dims& d = dims_;
  Pi05Graph out;
  ir::Graph& g = out.graph;
  Binder w(*this, &g);
  std::vector<int64_t> shape{d.channels, d.image_size, d.image_size};
  if (images > 0) shape.insert(shape.begin(), images);
  ValueId img = g.add_input(kPi05InImage, ValueInfo{DType::F32, shape});
  VLAC_ASSIGN_OR_RETURN(ValueId tok, add_vision(g, w, img, "vision", "projector", nullptr, ""));
  out.outputs.emplace_back(kPi05OutImageTokens, tok);
  g.mark_output(tok);
  VLAC_RETURN_IF_ERROR(ir::verify(g));
  return out;
}

Result<Pi05Graph> Pi05Model::build_text_embed(int64_t n_text) const {
  if (n_text < 1) return invalid_argument("pi0.5 text embedding: at least one token");
  Pi05Graph out;
  ir::Graph& g = out.graph;
  Binder w(*this, &g);
  ValueId ids = g.add_input(kPi05InTokens, ValueInfo{DType::I64, {n_text}});
  VLAC_ASSIGN_OR_RETURN(ValueId te, add_text_embed(g, w, ids));
  out.outputs.emplace_back(kPi05OutTextEmbeddings, te);
  g.mark_output(te);
  VLAC_RETURN_IF_ERROR(ir::verify(g));
  return out;
}

Result<Pi05Graph> Pi05Model::build_lm(int64_t prefix_len) const {
  if (prefix_len < 1) return invalid_argument("pi0.5 language model: empty prefix");
  Pi05Graph out;
  ir::Graph& g = out.graph;
  Binder w(*this, &g);
  ValueId h = g.add_input(kPi05InPrefixEmbeddings, ValueInfo{DType::F32, {prefix_len, dims_.lm_width}});
  ValueId pos = g.add_input(kPi05InPrefixPos, ValueInfo{DType::I64, {prefix_len}});
  VLAC_RETURN_IF_ERROR(add_lm(g, w, h, pos, &out.outputs, false));
  for (const auto& [name, v] : out.outputs) g.mark_output(v);
  VLAC_RETURN_IF_ERROR(ir::verify(g));
  return out;
}

Result<Pi05Graph> Pi05Model::build_prefix(const Pi05PrefixShape& shape, bool debug) const {
  const Pi05Dims& d = dims_;
  Pi05Graph out;
  ir::Graph& g = out.graph;
  Binder w(*this, &g);
  G b{g};
  if (shape.cameras.empty()) return invalid_argument("pi0.5 prefix: at least one camera must be present");
  if (shape.n_text < 0) return invalid_argument("pi0.5 prefix: negative token count");
  const int64_t P = int64_t(shape.cameras.size()) * n_img_ + shape.n_text;

  ValueId pos = g.add_input(kPi05InPrefixPos, ValueInfo{DType::I64, {P}});
  std::vector<ValueId> pieces;
  for (const std::string& cam : shape.cameras) {
    ValueId img = g.add_input(pi05_image_input(cam), ValueInfo{DType::F32, {d.channels, d.image_size, d.image_size}});
    VLAC_ASSIGN_OR_RETURN(ValueId tok, add_vision(g, w, img, "vision[" + cam + "]", "projector[" + cam + "]",
                                                  debug ? &out.outputs : nullptr, cam));
    pieces.push_back(tok);
  }
  if (shape.n_text > 0) {
    ValueId ids = g.add_input(kPi05InTokens, ValueInfo{DType::I64, {shape.n_text}});
    VLAC_ASSIGN_OR_RETURN(ValueId te, add_text_embed(g, w, ids));
    pieces.push_back(te);
  }
  ValueId h = pieces[0];
  if (pieces.size() > 1) {
    VLAC_ASSIGN_OR_RETURN(h, b.op(OpKind::Concat, pieces, Attrs{{"axis", int64_t{0}}}, "prefix.embeddings"));
  }
  if (debug) out.outputs.emplace_back("prefix.embeddings", h);

  VLAC_RETURN_IF_ERROR(add_lm(g, w, h, pos, &out.outputs, debug));
  for (const auto& [name, v] : out.outputs) g.mark_output(v);
  VLAC_RETURN_IF_ERROR(ir::verify(g));
  return out;
}

Result<Pi05Graph> Pi05Model::build_step(int64_t prefix_len, bool debug) const {
  const Pi05Dims& d = dims_;
  Pi05Graph out;
  ir::Graph& g = out.graph;
  Binder w(*this, &g);
  G b{g};
  const int64_t H = config_.chunk_size, A = d.max_action_dim, E = d.expert_width, hd = d.head_dim;
  const int64_t nh = d.expert_heads, attn = nh * hd, P = prefix_len;
  const std::string tin = legacy_time_names_ ? "action_time_mlp_in." : "time_mlp_in.";
  const std::string tout = legacy_time_names_ ? "action_time_mlp_out." : "time_mlp_out.";

  ValueId x = g.add_input(kPi05InX, ValueInfo{DType::F32, {H, A}});
  ValueId t = g.add_input(kPi05InTime, ValueInfo{DType::F32, {1}});
  ValueId pos = g.add_input(kPi05InSuffixPos, ValueInfo{DType::I64, {H}});
  std::vector<ValueId> pk, pv;
  for (int64_t l = 0; l < d.lm_depth; ++l) {
    pk.push_back(g.add_input("prefix.k." + std::to_string(l), ValueInfo{DType::F32, {P, 1, hd}}));
    pv.push_back(g.add_input("prefix.v." + std::to_string(l), ValueInfo{DType::F32, {P, 1, hd}}));
  }
  // cond = SiLU(time_mlp_out(SiLU(time_mlp_in(sincos(t)))))
  VLAC_ASSIGN_OR_RETURN(ValueId te, b.op(OpKind::TimeEmbedding, {t},
                                         Attrs{{"dim", E}, {"min_period", config_.min_period},
                                               {"max_period", config_.max_period}}, "time_embedding"));
  VLAC_ASSIGN_OR_RETURN(ValueId t1w, w.get(tin + "weight", {E, E}));
  VLAC_ASSIGN_OR_RETURN(ValueId t1b, w.get(tin + "bias", {E}));
  VLAC_ASSIGN_OR_RETURN(ValueId t2w, w.get(tout + "weight", {E, E}));
  VLAC_ASSIGN_OR_RETURN(ValueId t2b, w.get(tout + "bias", {E}));
  VLAC_ASSIGN_OR_RETURN(ValueId c, b.op(OpKind::Linear, {te, t1w, t1b}, {}, "time_mlp_in"));
  VLAC_ASSIGN_OR_RETURN(c, b.op(OpKind::SiLU, {c}, {}, "time_mlp_in.silu"));
  VLAC_ASSIGN_OR_RETURN(c, b.op(OpKind::Linear, {c, t2w, t2b}, {}, "time_mlp_out"));
  VLAC_ASSIGN_OR_RETURN(ValueId cond, b.op(OpKind::SiLU, {c}, {}, kPi05Cond));
  if (debug) out.outputs.emplace_back(kPi05Cond, cond);

  VLAC_ASSIGN_OR_RETURN(ValueId aiw, w.get("action_in_proj.weight", {E, A}));
  VLAC_ASSIGN_OR_RETURN(ValueId aib, w.get("action_in_proj.bias", {E}));
  VLAC_ASSIGN_OR_RETURN(ValueId h, b.op(OpKind::Linear, {x, aiw, aib}, {}, "action_in_proj"));
  if (debug) out.outputs.emplace_back("action_tokens", h);

  auto ada = [&](const std::string& dense, ValueId hx, const std::string& name) -> Result<ir::NodeId> {
    VLAC_ASSIGN_OR_RETURN(ValueId dw, w.get(dense + ".dense.weight", {3 * E, E}));
    VLAC_ASSIGN_OR_RETURN(ValueId db, w.get(dense + ".dense.bias", {3 * E}));
    VLAC_ASSIGN_OR_RETURN(ValueId mod, b.op(OpKind::Linear, {cond, dw, db}, {}, name + ".dense"));
    return g.add_node(OpKind::AdaRMSNorm, {hx, mod}, Attrs{{"eps", kNormEps}}, name);
  };
  for (int64_t l = 0; l < d.lm_depth; ++l) {
    const std::string p = kEx + "layers." + std::to_string(l) + ".";
    const std::string tg = "expert." + std::to_string(l) + ".";
    VLAC_ASSIGN_OR_RETURN(ir::NodeId n1, ada(p + "input_layernorm", h, tg + "input_layernorm"));
    const ValueId u = g.node(n1).outputs[0], g1 = g.node(n1).outputs[1];
    VLAC_ASSIGN_OR_RETURN(ValueId qw, w.get(p + "self_attn.q_proj.weight", {attn, E}));
    VLAC_ASSIGN_OR_RETURN(ValueId kw, w.get(p + "self_attn.k_proj.weight", {hd, E}));
    VLAC_ASSIGN_OR_RETURN(ValueId vw, w.get(p + "self_attn.v_proj.weight", {hd, E}));
    VLAC_ASSIGN_OR_RETURN(ValueId ow, w.get(p + "self_attn.o_proj.weight", {E, attn}));
    VLAC_ASSIGN_OR_RETURN(ValueId q, b.op(OpKind::Linear, {u, qw}, {}, tg + "q_proj"));
    VLAC_ASSIGN_OR_RETURN(q, b.reshape(q, {H, nh, hd}, tg + "q.heads"));
    VLAC_ASSIGN_OR_RETURN(q, b.op(OpKind::RoPE, {q, pos}, Attrs{{"base", kRopeBase}}, tg + "q.rope"));
    VLAC_ASSIGN_OR_RETURN(ValueId k, b.op(OpKind::Linear, {u, kw}, {}, tg + "k_proj"));
    VLAC_ASSIGN_OR_RETURN(k, b.reshape(k, {H, 1, hd}, tg + "k.heads"));
    VLAC_ASSIGN_OR_RETURN(k, b.op(OpKind::RoPE, {k, pos}, Attrs{{"base", kRopeBase}}, tg + "k.rope"));
    VLAC_ASSIGN_OR_RETURN(ValueId v, b.op(OpKind::Linear, {u, vw}, {}, tg + "v_proj"));
    VLAC_ASSIGN_OR_RETURN(v, b.reshape(v, {H, 1, hd}, tg + "v.heads"));
    // Keys/values: [prefix cache | own suffix]; no mask (the compact prefix holds only valid
    // tokens and the suffix is bidirectional).
    VLAC_ASSIGN_OR_RETURN(ValueId K, b.op(OpKind::Concat, {pk[size_t(l)], k}, Attrs{{"axis", int64_t{0}}}, tg + "keys"));
    VLAC_ASSIGN_OR_RETURN(ValueId Vv, b.op(OpKind::Concat, {pv[size_t(l)], v}, Attrs{{"axis", int64_t{0}}}, tg + "values"));
    VLAC_ASSIGN_OR_RETURN(ValueId a, b.op(OpKind::Attention, {q, K, Vv},
                                          Attrs{{"scale", 1.0 / std::sqrt(double(hd))}}, tg + "attention"));
    VLAC_ASSIGN_OR_RETURN(a, b.reshape(a, {H, attn}, tg + "attention.merge"));
    VLAC_ASSIGN_OR_RETURN(a, b.op(OpKind::Linear, {a, ow}, {}, tg + "o_proj"));
    VLAC_ASSIGN_OR_RETURN(a, b.op(OpKind::Mul, {a, g1}, {}, tg + "gate1"));
    VLAC_ASSIGN_OR_RETURN(h, b.op(OpKind::Add, {h, a}, {}, tg + "residual1"));
    VLAC_ASSIGN_OR_RETURN(ir::NodeId n2, ada(p + "post_attention_layernorm", h, tg + "post_attention_layernorm"));
    const ValueId u2 = g.node(n2).outputs[0], g2 = g.node(n2).outputs[1];
    VLAC_ASSIGN_OR_RETURN(ValueId gw, w.get(p + "mlp.gate_proj.weight", {d.expert_mlp, E}));
    VLAC_ASSIGN_OR_RETURN(ValueId uw, w.get(p + "mlp.up_proj.weight", {d.expert_mlp, E}));
    VLAC_ASSIGN_OR_RETURN(ValueId dw, w.get(p + "mlp.down_proj.weight", {E, d.expert_mlp}));
    VLAC_ASSIGN_OR_RETURN(ValueId gt, b.op(OpKind::Linear, {u2, gw}, {}, tg + "gate_proj"));
    VLAC_ASSIGN_OR_RETURN(ValueId up, b.op(OpKind::Linear, {u2, uw}, {}, tg + "up_proj"));
    VLAC_ASSIGN_OR_RETURN(ValueId m, b.op(OpKind::GeGLU, {gt, up}, {}, tg + "geglu"));
    VLAC_ASSIGN_OR_RETURN(m, b.op(OpKind::Linear, {m, dw}, {}, tg + "down_proj"));
    VLAC_ASSIGN_OR_RETURN(m, b.op(OpKind::Mul, {m, g2}, {}, tg + "gate2"));
    VLAC_ASSIGN_OR_RETURN(h, b.op(OpKind::Add, {h, m}, {}, tg + "residual2"));
    if (debug) out.outputs.emplace_back("expert_hidden." + std::to_string(l), h);
  }
  VLAC_ASSIGN_OR_RETURN(ir::NodeId nf, ada(kEx + "norm", h, "expert.norm"));
  VLAC_ASSIGN_OR_RETURN(ValueId aow, w.get("action_out_proj.weight", {A, E}));
  VLAC_ASSIGN_OR_RETURN(ValueId aob, w.get("action_out_proj.bias", {A}));
  VLAC_ASSIGN_OR_RETURN(ValueId vel, b.op(OpKind::Linear, {g.node(nf).outputs[0], aow, aob}, {}, "action_out_proj"));
  VLAC_ASSIGN_OR_RETURN(ValueId xn, b.op(OpKind::EulerStep, {x, vel}, Attrs{{"dt", double(euler().dt)}}, "euler_step"));
  out.outputs.emplace_back("velocity", vel);
  out.outputs.emplace_back("x_next", xn);
  for (const auto& [name, v] : out.outputs) g.mark_output(v);
  VLAC_RETURN_IF_ERROR(ir::verify(g));
  return out;
}

}  // namespace vlac
