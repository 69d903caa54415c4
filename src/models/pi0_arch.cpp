// pi0 tensor table derived from pi0.5's (spec 7.1): expert norms become plain RMSNorm weights
// [E], the heads become state_proj / action_in / action_out / action_time_mlp_in (2E->E) / _out.
#include "models/pi0_arch.h"

namespace vlac {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<WeightSpec> pi0_weights(const Pi05Dims& d, Pi05Layout layout) {
  const std::string root = layout == Pi05Layout::FineTune ? "model." : "";
  const int64_t E = d.expert_width;
  std::vector<WeightSpec> out;
  for (WeightSpec w : pi05_weights(d, layout)) {
    if (w.part == Pi05Part::Heads) continue;  // replaced below
    if (w.part == Pi05Part::Expert) {
      // adaRMS "...norm.dense.weight" [3E, E] -> plain "...norm.weight" [E]; drop the dense bias.
      if (ends_with(w.name, ".dense.bias")) continue;
      if (ends_with(w.name, ".dense.weight")) {
        w.name = w.name.substr(0, w.name.size() - std::string(".dense.weight").size()) + ".weight";
        w.shape = {E};
      }
    }
    out.push_back(std::move(w));
  }
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    out.push_back(WeightSpec{root + name, std::move(shape), Pi05Part::Heads, true});
  };
  const int64_t A = d.max_action_dim;
  add("state_proj.weight", {E, A});  // max_state_dim == max_action_dim == 32 in lerobot
  add("state_proj.bias", {E});
  add("action_in_proj.weight", {E, A});
  add("action_in_proj.bias", {E});
  add("action_out_proj.weight", {A, E});
  add("action_out_proj.bias", {A});
  add("action_time_mlp_in.weight", {E, 2 * E});
  add("action_time_mlp_in.bias", {E});
  add("action_time_mlp_out.weight", {E, E});
  add("action_time_mlp_out.bias", {E});
  return out;
}

PolicyArch pi0_policy_arch(const Pi05Dims& d, const PolicyInputs& in) {
  PolicyArch a;
  a.kind = PolicyKind::Pi0;
  a.inputs = in;
  a.modules = {
      {"vision", ModuleRole::Vision, true, DtypeRule::Fp32InBf16, {}},
      {"projector", ModuleRole::Projector, true, DtypeRule::Fp32InBf16, {0}},
      {"language", ModuleRole::Language, true, DtypeRule::Follow, {1}, {3}},
      {"expert", ModuleRole::Expert, true, DtypeRule::Follow, {2, 4}, {2}},
      {"heads", ModuleRole::Heads, true, DtypeRule::Follow, {}},
      {"lm_head", ModuleRole::Unused, true, DtypeRule::Follow, {}},
  };
  for (const WeightSpec& w : pi0_weights(d, Pi05Layout::FineTune)) {
    if (w.name.find("paligemma.lm_head") != std::string::npos) continue;  // tied to embed_tokens
    int m = static_cast<int>(w.part);  // Vision, Projector, Language, Expert, Heads, LmHead in order
    bool grad = w.part != Pi05Part::LmHead &&
                (w.read_at_inference || w.name.find("q_proj") != std::string::npos);
    a.params.push_back({w.name, w.shape, m, grad, false});
  }
  // pi0's suffix has one extra token (the continuous state) before the actions.
  PaliGemmaBlockSizes s{d.image_size, d.patch_size, d.vision_width, d.vision_depth, d.vision_mlp,
                        d.vision_heads, d.lm_width, d.lm_depth, d.lm_mlp, d.lm_heads, d.kv_heads,
                        d.head_dim, d.expert_width, d.expert_mlp, 1};
  add_paligemma_blocks(s, &a);
  ActBlock h;  // state_proj, action_in, action_time_mlp_in (2E per token), _out, action_out inputs
  h.name = "action/time heads";
  h.module = 4;
  h.transformer = false;
  h.raw_elements = d.max_action_dim + in.chunk * (d.max_action_dim + 4 * d.expert_width);
  a.blocks.push_back(h);
  a.description = "pi0 (lerobot): pi0.5's SigLIP/Gemma/expert geometry, plain-RMSNorm expert, "
                  "state_proj + action_time_mlp heads (src/models/pi0_arch)";
  return a;
}

}  // namespace vlac
