// The planner's view of each policy: pi0.5 from the lead's tensor table (pi05_arch), the others
// from their own tables; training inputs from defaults or a lerobot config.json. No memory math here.
#include "models/policy_arch.h"

#include <nlohmann/json.hpp>

#include "models/act_arch.h"
#include "models/groot_arch.h"
#include "models/pi05_arch.h"
#include "models/pi0_arch.h"
#include "models/smolvla_arch.h"

namespace vlac {

const char* policy_kind_name(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::Pi05: return "pi05";
    case PolicyKind::Pi0: return "pi0";
    case PolicyKind::SmolVla: return "smolvla";
    case PolicyKind::Act: return "act";
    case PolicyKind::GrootN17: return "groot-n1.7";
  }
  return "?";
}

Result<PolicyKind> parse_policy_kind(const std::string& name) {
  if (name == "pi05" || name == "pi0.5") return PolicyKind::Pi05;
  if (name == "pi0") return PolicyKind::Pi0;
  if (name == "smolvla") return PolicyKind::SmolVla;
  if (name == "act") return PolicyKind::Act;
  if (name == "groot-n1.7" || name == "groot" || name == "gr00t-n1.7") return PolicyKind::GrootN17;
  return invalid_argument("unknown policy '" + name + "' (known: pi05, pi0, smolvla, act, groot-n1.7)");
}

const char* module_role_name(ModuleRole role) {
  switch (role) {
    case ModuleRole::Vision: return "vision";
    case ModuleRole::Projector: return "projector";
    case ModuleRole::Language: return "language";
    case ModuleRole::Expert: return "expert";
    case ModuleRole::Heads: return "heads";
    case ModuleRole::Encoder: return "encoder";
    case ModuleRole::Unused: return "unused";
  }
  return "?";
}

uint64_t ParamTensor::numel() const {
  uint64_t n = 1;
  for (int64_t s : shape) n *= static_cast<uint64_t>(s);
  return n;
}

int PolicyArch::module_index(const std::string& name) const {
  for (size_t i = 0; i < modules.size(); ++i)
    if (modules[i].name == name) return static_cast<int>(i);
  return -1;
}

PolicyInputs default_policy_inputs(PolicyKind kind) {
  PolicyInputs in;
  switch (kind) {
    case PolicyKind::Pi05:  // openpi's three camera slots; lerobot tokenizer_max_length 200
      in = {3, 224, 224, 200, 50, 32, 32};
      break;
    case PolicyKind::Pi0:  // pi0 pads the prompt to 48 tokens
      in = {3, 224, 224, 48, 50, 32, 32};
      break;
    case PolicyKind::SmolVla:  // resize_imgs_with_padding 512x512, prompt <= 48 tokens
      in = {3, 512, 512, 48, 50, 32, 32};
      break;
    case PolicyKind::Act:  // lerobot ACT defaults: one 480x640 camera, 14-dim ALOHA state/action, chunk 100
      in = {1, 480, 640, 0, 100, 14, 14};
      break;
    case PolicyKind::GrootN17:  // image_target_size 256, action_horizon 40, max_state/action_dim 132
      in = {1, 256, 256, 64, 40, 132, 132};
      break;
  }
  return in;
}

namespace {

// Generic lerobot keys: chunk_size, cameras (VISUAL input features + empty_cameras), prompt length.
Status apply_lerobot_inputs(const nlohmann::json& c, const std::string& path, PolicyInputs* in) {
  if (!c.is_object()) return invalid_format(path + ": config is not a JSON object");
  auto num = [&](const char* key, int64_t* out) -> Status {
    auto it = c.find(key);
    if (it == c.end() || it->is_null()) return Status::ok();
    if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > 8192)
      return invalid_format(path + ": '" + key + "' must be an integer between 1 and 8192");
    *out = it->get<int64_t>();
    return Status::ok();
  };
  VLAC_RETURN_IF_ERROR(num("chunk_size", &in->chunk));
  VLAC_RETURN_IF_ERROR(num("tokenizer_max_length", &in->prompt_tokens));
  if (auto it = c.find("input_features"); it != c.end() && !it->is_null()) {
    if (!it->is_object()) return invalid_format(path + ": 'input_features' must be an object");
    int64_t cams = 0;
    for (auto f = it->begin(); f != it->end(); ++f) {
      if (!f->is_object()) return invalid_format(path + ": input_features['" + f.key() + "'] must be an object");
      auto t = f->find("type");
      if (t != f->end() && t->is_string() && t->get<std::string>() == "VISUAL") ++cams;
    }
    int64_t empty = 0;
    if (auto e = c.find("empty_cameras"); e != c.end() && !e->is_null()) {
      if (!e->is_number_integer() || e->get<int64_t>() < 0 || e->get<int64_t>() > 64)
        return invalid_format(path + ": 'empty_cameras' must be an integer between 0 and 64");
      empty = e->get<int64_t>();
    }
    if (cams + empty > 16) return invalid_format(path + ": more than 16 cameras in input_features");
    if (cams + empty > 0) in->cams = cams + empty;
  }
  return Status::ok();
}

void fill_defaults(const PolicyInputs& def, PolicyInputs* in) {
  if (in->cams <= 0) in->cams = def.cams;
  if (in->image_h <= 0) in->image_h = def.image_h;
  if (in->image_w <= 0) in->image_w = def.image_w;
  if (in->prompt_tokens <= 0) in->prompt_tokens = def.prompt_tokens;
  if (in->chunk <= 0) in->chunk = def.chunk;
  if (in->state_dim <= 0) in->state_dim = def.state_dim;
  if (in->action_dim <= 0) in->action_dim = def.action_dim;
}

// pi0.5 from the lead's table: the in-memory training layout is lerobot's (embed_tokens tied to
// paligemma.lm_head, one copy; the untrained expert lm_head kept but never reached by the loss).
// lerobot logs num_learnable_params=3616757520 for pi05 (huggingface/lerobot#2366): exactly the
// unique weights (3,353,433,872) plus the expert lm_head (263,323,648).
PolicyArch pi05_policy_arch(const Pi05Dims& d, const PolicyInputs& in) {
  PolicyArch a;
  a.kind = PolicyKind::Pi05;
  a.inputs = in;
  a.modules = {
      {"vision", ModuleRole::Vision, true, DtypeRule::Fp32InBf16, {}},
      {"projector", ModuleRole::Projector, true, DtypeRule::Fp32InBf16, {0}},
      {"language", ModuleRole::Language, true, DtypeRule::Follow, {1}, {3}},
      {"expert", ModuleRole::Expert, true, DtypeRule::Follow, {2, 4}, {2}},
      // The flow-matching heads sit outside paligemma_with_expert, which is the only part
      // lerobot casts to bfloat16 (to_bfloat16_for_selected_params): they stay fp32.
      {"heads", ModuleRole::Heads, true, DtypeRule::Fp32InBf16, {}},
      {"lm_head", ModuleRole::Unused, true, DtypeRule::Follow, {}},
  };
  // lerobot 0.6.1 under transformers 5.17 builds PaliGemma's lm_head as its own tensor, not tied
  // to embed_tokens: the measured named_parameters() of PI05Policy hold 4,143,404,816 parameters
  // (tests/fixtures/train_memory/measured.json) = the 3,616,757,520 lerobot#2366 logged with an
  // older stack + one 257152 x 2048 lm_head. Both lm_heads are stored, neither gets a gradient.
  for (const WeightSpec& w : pi05_weights(d, Pi05Layout::FineTune)) {
    int m = 0;
    switch (w.part) {
      case Pi05Part::Vision: m = 0; break;
      case Pi05Part::Projector: m = 1; break;
      case Pi05Part::Language: m = 2; break;
      case Pi05Part::Expert: m = 3; break;
      case Pi05Part::Heads: m = 4; break;
      case Pi05Part::LmHead: m = 5; break;
    }
    // Unread at inference = the loss never reaches it either (last VLM layer's o_proj/MLP/
    // post-norm, final norm, lm_heads); its q_proj still feeds the joint attention (zero grad,
    // but allocated), so it keeps a gradient.
    bool grad = w.part != Pi05Part::LmHead &&
                (w.read_at_inference || w.name.find("q_proj") != std::string::npos);
    a.params.push_back({w.name, w.shape, m, grad, false});
  }
  PaliGemmaBlockSizes s{d.image_size, d.patch_size, d.vision_width, d.vision_depth, d.vision_mlp,
                        d.vision_heads, d.lm_width, d.lm_depth, d.lm_mlp, d.lm_heads, d.kv_heads,
                        d.head_dim, d.expert_width, d.expert_mlp, 0};
  add_paligemma_blocks(s, &a);
  // Heads: action_in (A wide), time MLP in/out (E wide, per sample), action_out input (E wide).
  ActBlock h;
  h.name = "action/time heads";
  h.module = 4;
  h.transformer = false;
  h.raw_elements = in.chunk * (d.max_action_dim + d.expert_width) + 2 * d.expert_width;
  a.blocks.push_back(h);
  a.description = "pi0.5 (lerobot): SigLIP " + std::to_string(d.vision_width) + "x" +
                  std::to_string(d.vision_depth) + ", Gemma " + std::to_string(d.lm_width) + "x" +
                  std::to_string(d.lm_depth) + ", expert " + std::to_string(d.expert_width) +
                  " (adaRMS), tables from src/models/pi05_arch";
  return a;
}

}  // namespace

void add_paligemma_blocks(const PaliGemmaBlockSizes& s, PolicyArch* a) {
  const PolicyInputs& in = a->inputs;
  const int64_t per_cam = (s.image_size / s.patch_size) * (s.image_size / s.patch_size);
  const int64_t prefix = per_cam * in.cams + in.prompt_tokens;
  const int64_t suffix = in.chunk + s.suffix_extra_tokens;
  a->image_tokens_per_cam = per_cam;
  a->prefix_tokens = prefix;
  const int vis = a->module_index("vision"), proj = a->module_index("projector"),
            lang = a->module_index("language"), exp = a->module_index("expert");

  ActBlock patch;  // the patch-embedding conv keeps its input image
  patch.name = "patch embedding";
  patch.module = vis;
  patch.transformer = false;
  patch.raw_elements = in.cams * 3 * s.image_size * s.image_size;
  a->blocks.push_back(patch);

  ActBlock v;  // SigLIP encoder layer, once per camera
  v.name = "SigLIP layer";
  v.module = vis;
  v.count = s.vision_depth;
  v.seqs = in.cams;
  v.tokens_q = v.tokens_kv = per_cam;
  v.width = v.q_width = v.kv_width = s.vision_width;
  v.heads = s.vision_heads;
  v.ffn_width = s.vision_mlp;
  v.ffn_tensors = 2;
  // transformers 5.x builds SigLIP with SDPA: no scores kept (measured: 17 MB per camera-layer
  // in fp32 = the Korthikanti terms without a*s^2).
  v.flash = true;
  a->blocks.push_back(v);

  ActBlock p;
  p.name = "projector";
  p.module = proj;
  p.transformer = false;
  p.raw_elements = in.cams * per_cam * s.vision_width;
  a->blocks.push_back(p);

  // Training runs prefix and suffix jointly: every layer's attention is one (P+S)^2 matrix,
  // split here as P rows (VLM) + S rows (expert).
  ActBlock l;
  l.name = "Gemma layer (prefix)";
  l.module = lang;
  l.count = s.lm_depth;
  l.tokens_q = prefix;
  l.tokens_kv = prefix + suffix;
  l.width = s.lm_width;
  l.q_width = s.lm_heads * s.head_dim;
  l.kv_width = s.kv_heads * s.head_dim;
  l.heads = s.lm_heads;
  l.ffn_width = s.lm_mlp;
  l.ffn_tensors = 4;  // gate, up, gelu(gate), product
  l.softmax_fp32 = true;  // modeling_gemma.eager_attention_forward: softmax(dtype=float32).to(q.dtype)
  l.fp32_norms = true;    // PiGemmaRMSNorm
  a->blocks.push_back(l);

  ActBlock e = l;
  e.name = "expert layer (chunk)";
  e.module = exp;
  e.tokens_q = suffix;
  e.width = s.expert_width;
  e.ffn_width = s.expert_mlp;
  a->blocks.push_back(e);
}

Result<PolicyArch> build_policy_arch(PolicyKind kind, const PolicyInputs& requested,
                                     const nlohmann::json* config, const std::string& config_path) {
  PolicyInputs in;
  if (config != nullptr) VLAC_RETURN_IF_ERROR(apply_lerobot_inputs(*config, config_path, &in));
  // Explicit overrides win over the config.
  if (requested.cams > 0) in.cams = requested.cams;
  if (requested.image_h > 0) in.image_h = requested.image_h;
  if (requested.image_w > 0) in.image_w = requested.image_w;
  if (requested.prompt_tokens > 0) in.prompt_tokens = requested.prompt_tokens;
  if (requested.chunk > 0) in.chunk = requested.chunk;
  if (requested.state_dim > 0) in.state_dim = requested.state_dim;
  if (requested.action_dim > 0) in.action_dim = requested.action_dim;

  switch (kind) {
    case PolicyKind::Pi05:
    case PolicyKind::Pi0: {
      Pi05Dims d = Pi05Dims::full();
      if (config != nullptr) {
        VLAC_ASSIGN_OR_RETURN(d, pi05_dims_from_config(*config, config_path));
      }
      PolicyInputs def = default_policy_inputs(kind);
      def.image_h = def.image_w = d.image_size;
      fill_defaults(def, &in);
      if (in.image_h != d.image_size || in.image_w != d.image_size)
        return unsupported(std::string(policy_kind_name(kind)) + ": images are fixed at " +
                           std::to_string(d.image_size) + " px by the SigLIP position table (" +
                           std::to_string(d.patches_per_image()) + " rows); --image-size cannot change it");
      if (kind == PolicyKind::Pi05) return pi05_policy_arch(d, in);
      return pi0_policy_arch(d, in);
    }
    case PolicyKind::SmolVla: {
      fill_defaults(default_policy_inputs(kind), &in);
      return smolvla_policy_arch(SmolVlaDims{}, in);
    }
    case PolicyKind::Act: {
      fill_defaults(default_policy_inputs(kind), &in);
      ActDims d;
      if (config != nullptr) {
        auto it = config->find("n_decoder_layers");
        if (it != config->end() && it->is_number_integer() && it->get<int64_t>() > 0 && it->get<int64_t>() < 1000)
          d.decoder_layers = it->get<int64_t>();
      }
      return act_policy_arch(d, in);
    }
    case PolicyKind::GrootN17: {
      fill_defaults(default_policy_inputs(kind), &in);
      return groot_policy_arch(GrootDims{}, in);
    }
  }
  return internal_error("unknown policy kind");
}

}  // namespace vlac
