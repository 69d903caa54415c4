// Training-memory arithmetic. Sources for every rule are cited next to it; docs/mem-plan.md
// explains the model and its limits. No I/O here.
#include "diag/train_plan.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/bytes.h"
#include "diag/alloc_sim.h"

namespace vlac::diag {

// ---- enums -------------------------------------------------------------------------------

const char* to_string(WeightDtype v) { return v == WeightDtype::Fp32 ? "fp32" : "bf16"; }
const char* to_string(MixedPrecision v) {
  switch (v) {
    case MixedPrecision::No: return "no";
    case MixedPrecision::Bf16: return "bf16";
    case MixedPrecision::Fp16: return "fp16";
  }
  return "?";
}
const char* to_string(OptimizerKind v) {
  switch (v) {
    case OptimizerKind::AdamW: return "adamw";
    case OptimizerKind::AdamW8bit: return "adamw8bit";
    case OptimizerKind::Sgd: return "sgd";
    case OptimizerKind::SgdMomentum: return "sgd-momentum";
  }
  return "?";
}
const char* to_string(ShardKind v) {
  switch (v) {
    case ShardKind::None: return "none";
    case ShardKind::Zero1: return "zero1";
    case ShardKind::Zero2: return "zero2";
    case ShardKind::Zero3: return "zero3";
    case ShardKind::Fsdp: return "fsdp";
  }
  return "?";
}

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Result<WeightDtype> parse_weight_dtype(const std::string& s) {
  const std::string v = lower(s);
  if (v == "fp32" || v == "float32") return WeightDtype::Fp32;
  if (v == "bf16" || v == "bfloat16") return WeightDtype::Bf16;
  return invalid_argument("--dtype '" + s + "' is not fp32 or bf16");
}
Result<MixedPrecision> parse_mixed_precision(const std::string& s) {
  const std::string v = lower(s);
  if (v == "no" || v == "none" || v == "off") return MixedPrecision::No;
  if (v == "bf16" || v == "bfloat16") return MixedPrecision::Bf16;
  if (v == "fp16" || v == "float16") return MixedPrecision::Fp16;
  return invalid_argument("--mixed-precision '" + s + "' is not no, bf16 or fp16");
}
Result<OptimizerKind> parse_optimizer(const std::string& s) {
  const std::string v = lower(s);
  if (v == "adamw" || v == "adam") return OptimizerKind::AdamW;
  if (v == "adamw8bit" || v == "adamw-8bit" || v == "adamw_8bit") return OptimizerKind::AdamW8bit;
  if (v == "sgd") return OptimizerKind::Sgd;
  if (v == "sgd-momentum" || v == "sgd_momentum" || v == "sgdm") return OptimizerKind::SgdMomentum;
  return invalid_argument("--optimizer '" + s + "' is not adamw, adamw8bit, sgd or sgd-momentum");
}
Result<ShardKind> parse_shard(const std::string& s) {
  const std::string v = lower(s);
  if (v == "none" || v == "ddp") return ShardKind::None;
  if (v == "zero1") return ShardKind::Zero1;
  if (v == "zero2") return ShardKind::Zero2;
  if (v == "zero3") return ShardKind::Zero3;
  if (v == "fsdp") return ShardKind::Fsdp;
  return invalid_argument("--shard '" + s + "' is not none, zero1, zero2, zero3 or fsdp");
}

TrainOptions default_train_options(PolicyKind kind) {
  TrainOptions o;
  if (kind == PolicyKind::GrootN17) {
    // Isaac-GR00T launch_finetune: load_bf16=False (fp32 parameters), HF Trainer bf16 autocast;
    // hardware_recommendation.md: single-GPU default effective batch 32.
    o.mixed = MixedPrecision::Bf16;
    o.batch = 32;
  }
  return o;
}

TrainOptions openpi_train_options(bool lora) {
  TrainOptions o;
  o.openpi = true;
  o.mixed = MixedPrecision::Bf16;
  o.half_copy = false;
  o.frozen_dtype = WeightDtype::Bf16;
  o.gradient_checkpointing = true;
  o.batch = 32;
  o.ema = !lora;
  o.lora_r = lora ? 16 : 0;
  return o;
}

Status apply_lerobot_train_config(const nlohmann::json& c, const std::string& path, TrainOptions* o) {
  if (!c.is_object()) return invalid_format(path + ": config is not a JSON object");
  auto flag = [&](const char* key, bool* out) -> Status {
    auto it = c.find(key);
    if (it == c.end() || it->is_null()) return Status::ok();
    if (!it->is_boolean()) return invalid_format(path + ": '" + key + "' must be true or false");
    *out = *out || it->get<bool>();
    return Status::ok();
  };
  VLAC_RETURN_IF_ERROR(flag("gradient_checkpointing", &o->gradient_checkpointing));
  VLAC_RETURN_IF_ERROR(flag("freeze_vision_encoder", &o->freeze_vision));
  VLAC_RETURN_IF_ERROR(flag("train_expert_only", &o->train_expert_only));
  VLAC_RETURN_IF_ERROR(flag("load_vlm_weights", &o->vlm_bf16));
  if (auto it = c.find("dtype"); it != c.end() && !it->is_null()) {
    if (!it->is_string()) return invalid_format(path + ": 'dtype' must be a string");
    auto d = parse_weight_dtype(it->get<std::string>());
    if (!d.is_ok()) return invalid_format(path + ": 'dtype' is '" + it->get<std::string>() + "', not float32 or bfloat16");
    o->dtype = d.value();
  }
  return Status::ok();
}

// ---- GPUs --------------------------------------------------------------------------------

const std::vector<GpuSpec>& known_gpus() {
  // memory.total in MiB as nvidia-smi prints it for each card (the allocator gets slightly less:
  // torch reports e.g. 79.19 GiB for an 80 GB H100).
  static const std::vector<GpuSpec> kGpus = {
      {"Jetson-Orin-Nano-8GB", 7620ull << 20, "unified memory shared with the CPU"},
      {"T4", 15360ull << 20, ""},
      {"L4", 23034ull << 20, ""},
      {"A10G", 23028ull << 20, ""},
      {"RTX4090", 24564ull << 20, ""},
      {"RTX3090", 24576ull << 20, ""},
      {"RTX5090", 32607ull << 20, ""},
      {"A100-40", 40960ull << 20, ""},
      {"L40S", 46068ull << 20, ""},
      {"A6000", 49140ull << 20, "RTX A6000"},
      {"A100-80", 81920ull << 20, ""},
      {"H100", 81559ull << 20, "H100 80GB HBM3"},
      {"H200", 143771ull << 20, ""},
  };
  return kGpus;
}

Result<GpuSpec> parse_gpu(const std::string& text) {
  auto canon = [](const std::string& s) {
    std::string out;
    for (char c : s)
      if (std::isalnum(static_cast<unsigned char>(c))) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
  };
  const std::string want = canon(text);
  if (want.empty()) return invalid_argument("--gpu is empty");
  static const std::map<std::string, std::string> kAliases = {
      {"4090", "rtx4090"}, {"3090", "rtx3090"}, {"5090", "rtx5090"}, {"a100", "a10080"},
      {"a10080gb", "a10080"}, {"a10040gb", "a10040"}, {"h10080", "h100"}, {"h10080gb", "h100"},
      {"h100sxm", "h100"}, {"rtxa6000", "a6000"}, {"orinnano", "jetsonorinnano8gb"},
      {"jetsonorinnano", "jetsonorinnano8gb"}, {"orinnano8gb", "jetsonorinnano8gb"}, {"h200141gb", "h200"},
      {"l40s48gb", "l40s"}, {"a600048gb", "a6000"}, {"t416gb", "t4"}, {"24gib", ""}};
  std::string key = want;
  if (auto it = kAliases.find(want); it != kAliases.end() && !it->second.empty()) key = it->second;
  for (const GpuSpec& g : known_gpus())
    if (canon(g.name) == key) return g;
  // A plain size.
  auto size = parse_size(text);
  if (size.is_ok() && size.value() >= (256ull << 20)) return GpuSpec{text, size.value(), "size given"};
  std::string names;
  for (const GpuSpec& g : known_gpus()) names += (names.empty() ? "" : ", ") + g.name;
  return invalid_argument("--gpu '" + text + "' is neither a known card (" + names + ") nor a size like 24GiB");
}

// ---- activations -------------------------------------------------------------------------

std::vector<uint64_t> block_saved_tensors(const ActBlock& b, int e, bool frozen) {
  // Korthikanti et al. 2022 (arXiv:2205.05198, section 4.1), per layer with 16-bit activations:
  // attention 11sbh + 5as^2b, MLP 19sbh, two LayerNorms 4sbh -> sbh(34 + 5as/h). Generalised
  // term by term so that a GPT block (h_q = h_kv = h, MLP 4h, GeLU, dropout) gives exactly that:
  //   attention input sbh, Q s*h_q, K and V s_kv*h_kv each, softmax output a*s*s_kv, (dropout mask
  //   a*s*s_kv bytes + dropout output a*s*s_kv), attention output (o_proj input) s*h_q, dropout mask sbh;
  //   MLP input sbh, `ffn_tensors` f-wide tensors (2: fc1 out + GeLU out; 4 for gated MLPs:
  //   gate, up, act(gate), product), dropout mask sbh; `norms` norm inputs sbh each.
  // Fused attention (FlashAttention/SDPA) stores no a*s^2 terms (the paper's "selective" row).
  // A frozen block in the gradient path keeps no Linear inputs: autograd saves a matmul's input
  // only to form the weight's gradient (the input's gradient needs the weight alone). Those are
  // the attention input (QKV), the attention output (o_proj), the MLP input and the last f-wide
  // tensor (down/fc2 input), and a cross-attention's K/V source. Measured: pi0.5 expert-only
  // keeps 24.1 GiB at batch 8 against 31.9 GiB with the same VLM trainable (freeze-vision).
  // Each term is one tensor (the allocator model needs their sizes, not only their sum).
  std::vector<uint64_t> t;
  auto add = [&](uint64_t bytes) {
    if (bytes) t.push_back(bytes);
  };
  const uint64_t E = static_cast<uint64_t>(e);
  if (!b.saved_tensor_bytes.empty()) {
    for (int64_t x : b.saved_tensor_bytes) add(static_cast<uint64_t>(x));
    return t;
  }
  if (!b.transformer) {
    if (!b.raw_tensor_elements.empty()) {
      for (int64_t x : b.raw_tensor_elements) add(static_cast<uint64_t>(x) * E);
    } else {
      add(static_cast<uint64_t>(b.raw_elements) * E);
    }
    add(static_cast<uint64_t>(b.raw_extra_bytes));
    return t;
  }
  const uint64_t sq = b.seqs * b.tokens_q, skv = b.seqs * b.tokens_kv;
  const uint64_t scores = static_cast<uint64_t>(b.seqs) * b.heads * b.tokens_q * b.tokens_kv;
  const bool keep_lin = !frozen;
  if (b.q_width > 0) {
    if (keep_lin) add(sq * b.width * E);  // attention input
    add(sq * b.q_width * E);              // Q
    if (keep_lin) add(sq * b.q_width * E);  // attention output (o_proj input)
    add(skv * b.kv_width * E);            // K
    add(skv * b.kv_width * E);            // V
    if (b.kv_in_width > 0 && keep_lin) add(skv * b.kv_in_width * E);  // cross-attention keeps its K/V source
    if (!b.flash) {
      add(scores * E);
      if (b.dropout) add(scores * E);
      // transformers' eager attention: softmax(dtype=float32) then .to(q.dtype): the fp32 softmax
      // output is what softmax's backward keeps, the cast what attn @ V keeps.
      if (b.softmax_fp32 && e < 4) add(scores * 4);
    }
    if (b.qk_fp32 && e < 4) {  // fp32 Q, K over the 16-bit ones
      add(sq * b.q_width * 2);
      add(skv * b.kv_width * 2);
    }
    if (b.dropout) {
      if (!b.flash) add(scores);
      add(sq * b.width);
    }
  }
  if (b.ffn_width > 0) {
    if (keep_lin) add(sq * b.width * E);
    for (int i = 0; i < b.ffn_tensors - (frozen ? 1 : 0); ++i) add(sq * b.ffn_width * E);
    if (b.dropout) add(sq * b.width);
  }
  for (int i = 0; i < b.norms; ++i) add(sq * b.width * E);
  if (b.fp32_norms) {
    // PiGemmaRMSNorm (lerobot pi_gemma.py) normalises x.float(): per norm it keeps the fp32
    // normalised input (for the weight's gradient, so not when frozen) and the fp32 scaled
    // output; in a bf16 run also the fp32 upcast and the bf16 cast of the output (the measured
    // sites pi_gemma.py:106/108/120: 2.24 + 2.24 + 1.09 GiB at batch 8).
    const uint64_t n = sq * b.width;
    for (int i = 0; i < b.norms; ++i) {
      if (!frozen) add(4 * n);  // normalised input
      add(4 * n);               // scaled output
      if (e < 4) add(2 * n);    // bf16 cast of the output
    }
  }
  return t;
}

uint64_t block_activation_bytes(const ActBlock& b, int e, bool frozen) {
  uint64_t sum = 0;
  for (uint64_t x : block_saved_tensors(b, e, frozen)) sum += x;
  return sum;
}

uint64_t block_checkpoint_bytes(const ActBlock& b, int e) {
  // Full recomputation keeps each layer's input (2sbh at 16 bits); non-transformer parts are not
  // checkpointed by lerobot/Isaac-GR00T and keep everything.
  if (!b.transformer) return block_activation_bytes(b, e);
  return static_cast<uint64_t>(b.input_elements()) * e;
}

// ---- the plan ----------------------------------------------------------------------------

namespace {

int dtype_bytes(WeightDtype d) { return d == WeightDtype::Fp32 ? 4 : 2; }

struct Target {
  std::string module;  // empty: any
  std::string linear;  // "*" = any Linear weight
};

std::vector<std::string> default_lora_targets(PolicyKind kind, bool openpi) {
  if (openpi) return {"language.*", "expert.*"};  // gemma_2b_lora / gemma_300m_lora: attention + MLP
  switch (kind) {
    case PolicyKind::Pi05:
      // lerobot PI05Policy._get_default_peft_targets: the expert's q/v projections and the
      // projections outside the VLM (pi0.5 has no state_proj; its time MLP is not matched).
      // Measured: 1,287,168 adapter parameters at r=16.
      return {"expert.q_proj", "expert.v_proj", "heads.action_in_proj", "heads.action_out_proj"};
    case PolicyKind::Pi0:
      return {"expert.q_proj", "expert.v_proj", "heads.state_proj", "heads.action_in_proj", "heads.action_out_proj",
              "heads.action_time_mlp_in", "heads.action_time_mlp_out"};
    case PolicyKind::SmolVla:
      return {"language.*", "expert.*"};
    case PolicyKind::Act: return {"encoder.*", "decoder.*"};
    case PolicyKind::GrootN17: return {"dit.*"};  // N1.5's --lora-rank adapted the action head
  }
  return {};
}

Result<std::vector<Target>> parse_targets(const std::vector<std::string>& raw, const PolicyArch& arch) {
  std::vector<Target> out;
  for (const std::string& t : raw) {
    if (t.empty()) return invalid_argument("--lora-targets has an empty entry");
    Target x;
    auto dot = t.find('.');
    std::string first = dot == std::string::npos ? t : t.substr(0, dot);
    if (dot != std::string::npos && arch.module_index(first) >= 0) {
      x.module = first;
      x.linear = t.substr(dot + 1);
    } else if (dot == std::string::npos && arch.module_index(t) >= 0) {
      x.module = t;
      x.linear = "*";
    } else {
      x.linear = t;
    }
    if (x.linear.empty()) return invalid_argument("--lora-targets entry '" + t + "' names no layer");
    out.push_back(x);
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A Linear weight: 2-D, named "*.weight", not an embedding table / positional table.
bool is_linear_weight(const ParamTensor& p) {
  return p.shape.size() == 2 && !p.is_buffer && ends_with(p.name, ".weight") &&
         p.name.find("embed") == std::string::npos && p.name.find("embedding") == std::string::npos;
}

bool lora_matches(const ParamTensor& p, const std::string& module_name, const std::vector<Target>& targets) {
  if (!is_linear_weight(p)) return false;
  for (const Target& t : targets) {
    if (!t.module.empty() && t.module != module_name) continue;
    if (t.linear == "*") return true;
    if (ends_with(p.name, "." + t.linear + ".weight") || p.name == t.linear + ".weight") return true;
  }
  return false;
}

}  // namespace

Result<TrainPlan> plan_training(const PolicyArch& arch, const TrainOptions& o) {
  if (o.batch < 1) return invalid_argument("--batch must be at least 1");
  if (o.grad_accum < 1) return invalid_argument("--grad-accum must be at least 1");
  if (o.gpus < 1 || o.gpus > 100000) return invalid_argument("--gpus must be between 1 and 100000");
  if (o.lora_r < 0 || o.lora_r > 65536) return invalid_argument("--lora-r must be between 0 and 65536");
  if (o.shard != ShardKind::None && o.gpus == 1)
    return invalid_argument("--shard " + std::string(to_string(o.shard)) + " needs --gpus > 1");
  const size_t nm = arch.modules.size();
  TrainPlan plan;
  plan.kind = arch.kind;
  plan.description = arch.description;
  plan.inputs = arch.inputs;
  plan.image_tokens_per_cam = arch.image_tokens_per_cam;
  plan.prefix_tokens = arch.prefix_tokens;
  plan.options = o;
  const bool mixed = o.mixed != MixedPrecision::No;

  // Trainable modules: the stack's default, then un-freeze, then freeze.
  std::vector<bool> trainable(nm), lora(nm, false), in_path(nm, false);
  for (size_t m = 0; m < nm; ++m) {
    const ModuleSpec& s = arch.modules[m];
    bool t = s.trainable_default;
    if (o.tune_vision && s.role == ModuleRole::Vision) t = true;
    if (o.tune_llm && (s.role == ModuleRole::Language || s.role == ModuleRole::Projector)) t = true;
    if (o.freeze_vision && s.role == ModuleRole::Vision) t = false;
    if (o.train_expert_only &&
        (s.role == ModuleRole::Vision || s.role == ModuleRole::Projector || s.role == ModuleRole::Language))
      t = false;
    // lerobot's wrap_with_peft sets requires_grad=False on every parameter before adding the
    // adapters: only adapters train (openpi's freeze filter covers the LLMs only).
    if (o.lora_r > 0 && !o.openpi) t = false;
    trainable[m] = t;
  }
  std::vector<Target> targets;
  if (o.lora_r > 0) {
    VLAC_ASSIGN_OR_RETURN(targets, parse_targets(o.lora_targets.empty() ? default_lora_targets(arch.kind, o.openpi) : o.lora_targets, arch));
  }
  // Weight storage per module.
  auto weight_bytes_of = [&](size_t m) -> int {
    switch (arch.modules[m].dtype_rule) {
      case DtypeRule::Follow: return dtype_bytes(o.dtype);
      case DtypeRule::Fp32InBf16: return (o.dtype == WeightDtype::Bf16 && !mixed) ? 4 : dtype_bytes(o.dtype);
      case DtypeRule::AlwaysBf16: return o.vlm_bf16 ? 2 : dtype_bytes(o.dtype);  // SmolVLM2: load_vlm_weights
    }
    return 4;
  };
  auto act_bytes_of = [&](size_t m) -> int { return mixed ? 2 : weight_bytes_of(m); };

  plan.modules.resize(nm);
  // LoRA: adapters r*(in+out) on each targeted Linear; the module's base weights are frozen
  // (openpi freezes the whole LLM except adapters; PEFT freezes every non-adapter weight).
  std::vector<uint64_t> lora_params(nm, 0);
  std::vector<std::pair<int, uint64_t>> lora_tensors;  // (module, elements): A (r x in), B (out x r)
  if (o.lora_r > 0) {
    for (const ParamTensor& p : arch.params) {
      if (lora_matches(p, arch.modules[p.module].name, targets)) {
        lora_params[p.module] += static_cast<uint64_t>(o.lora_r) * static_cast<uint64_t>(p.shape[0] + p.shape[1]);
        lora[p.module] = true;
        lora_tensors.push_back({p.module, static_cast<uint64_t>(o.lora_r) * static_cast<uint64_t>(p.shape[1])});
        lora_tensors.push_back({p.module, static_cast<uint64_t>(o.lora_r) * static_cast<uint64_t>(p.shape[0])});
      }
    }
    bool any = false;
    for (size_t m = 0; m < nm; ++m) any = any || lora[m];
    if (!any) return invalid_argument("--lora-targets match no Linear layer of " + std::string(policy_kind_name(arch.kind)));
  }
  // Gradient path: a module keeps activations if it, or anything upstream, has trainable weights.
  for (size_t it = 0; it < nm + 1; ++it)
    for (size_t m = 0; m < nm; ++m) {
      bool v = (trainable[m] && !lora[m]) || lora[m];
      for (int u : arch.modules[m].upstream) v = v || in_path[u];
      for (int c : arch.modules[m].coupled) v = v || in_path[c];
      in_path[m] = v;
    }

  for (size_t m = 0; m < nm; ++m) {
    ModulePlan& mp = plan.modules[m];
    mp.name = arch.modules[m].name;
    mp.role = module_role_name(arch.modules[m].role);
    mp.trainable = (trainable[m] && !lora[m]) || lora[m];
    mp.in_grad_path = in_path[m];
  }
  // Count, per module, parameters by what they cost: stored only (frozen, buffers, or requiring
  // grad but never reached by the loss) and trainable-with-gradient by storage width.
  std::vector<uint64_t> stored_bytes(nm, 0), train16(nm, 0), train32(nm, 0), cast32(nm, 0);
  std::vector<SimParam> sim_params;  // the allocator model's view of every tensor (see below)
  uint64_t largest_tensor = 0;
  // What autocast casts (and caches, for leaf tensors that require grad): the weights and biases
  // of Linear and convolution layers. LayerNorm/RMSNorm weights run in fp32, embeddings are not
  // autocast ops, and GR00T's per-embodiment weights are gathered (W[cat_ids]) before their bmm,
  // so their casts are per-sample activations, not cache entries.
  // Weights are "<layer>.weight" or nn.MultiheadAttention's "<layer>.in_proj_weight".
  std::set<std::string> cast_weights;
  for (const ParamTensor& p : arch.params)
    if (p.shape.size() >= 2 && !p.is_buffer && ends_with(p.name, "weight") && p.name.find("embed") == std::string::npos)
      cast_weights.insert(p.name.substr(0, p.name.size() - 6));
  auto autocast_cast = [&](const ParamTensor& p) {
    if (ends_with(p.name, "weight")) return cast_weights.count(p.name.substr(0, p.name.size() - 6)) > 0;
    if (ends_with(p.name, "bias")) return cast_weights.count(p.name.substr(0, p.name.size() - 4)) > 0;
    return false;
  };
  for (const ParamTensor& p : arch.params) {
    const size_t m = static_cast<size_t>(p.module);
    if (o.openpi && arch.modules[m].role == ModuleRole::Unused) continue;  // not in the JAX model
    ModulePlan& mp = plan.modules[m];
    const uint64_t n = p.numel();
    int wb = weight_bytes_of(m);
    // lerobot pi0/pi0.5 with dtype=bfloat16 cast paligemma_with_expert to bf16, then back to fp32
    // every tensor whose name holds one of its params_to_keep_float32 selectors: the norms too
    // (the expert's adaRMS norms are 3E x E Linear layers: 116.7M fp32 parameters, measured).
    if ((arch.kind == PolicyKind::Pi05 || arch.kind == PolicyKind::Pi0) && o.dtype == WeightDtype::Bf16 && !mixed &&
        (p.name.find("input_layernorm") != std::string::npos || p.name.find("post_attention_layernorm") != std::string::npos ||
         p.name.find("model.norm") != std::string::npos))
      wb = 4;
    if (p.is_buffer) {
      stored_bytes[m] += n * 4;
      sim_params.push_back({static_cast<int>(m), n * 4, n * 4, 0, 0, 0, false, 0, 0});
      continue;
    }
    mp.params += n;
    largest_tensor = std::max(largest_tensor, n);
    const bool requires_grad = trainable[m] && !lora[m];
    if (requires_grad) mp.trainable_params += n;
    {
      // The same parameter for the allocator model: built in fp32 by every stack here, then cast.
      const bool grads = requires_grad && (p.gets_grad || o.openpi);
      const int fb = (!requires_grad && o.frozen_dtype) ? dtype_bytes(*o.frozen_dtype) : wb;
      SimParam sp;
      sp.module = static_cast<int>(m);
      sp.construct_bytes = n * 4;
      sp.stored_bytes = n * static_cast<uint64_t>(grads ? wb : fb);
      if (grads) {
        const uint64_t gb = mixed ? 4 : static_cast<uint64_t>(wb);
        sp.grad_bytes = n * gb;
        sp.moment_bytes = o.optimizer == OptimizerKind::AdamW8bit ? n : n * gb;
        sp.moments = o.optimizer == OptimizerKind::Sgd ? 0 : o.optimizer == OptimizerKind::SgdMomentum ? 1 : 2;
        sp.foreach_temp = o.optimizer == OptimizerKind::AdamW && !o.openpi;
        sp.dtype_group = wb == 4 ? 0 : 1;
        if (mixed && wb == 4 && o.half_copy && !o.openpi && autocast_cast(p)) sp.cast_bytes = n * 2;
      }
      sim_params.push_back(sp);
    }
    if (requires_grad && (p.gets_grad || o.openpi)) {
      (wb == 4 ? train32 : train16)[m] += n;
      if (wb == 4 && autocast_cast(p)) cast32[m] += n;
    } else {
      const int fb = (!requires_grad && o.frozen_dtype) ? dtype_bytes(*o.frozen_dtype) : wb;
      stored_bytes[m] += n * fb;
    }
  }
  for (const auto& [m, n] : lora_tensors)  // PEFT keeps adapters in fp32 (autocast_adapter_dtype)
    sim_params.push_back({m, n * 4, n * 4, n * 4, n * 4, o.optimizer == OptimizerKind::Sgd ? 0 : o.optimizer == OptimizerKind::SgdMomentum ? 1 : 2,
                          o.optimizer == OptimizerKind::AdamW && !o.openpi, 0, 0});
  for (size_t m = 0; m < nm; ++m) {
    if (lora_params[m] == 0) continue;
    plan.modules[m].lora_params = lora_params[m];
    plan.modules[m].trainable_params += lora_params[m];
    // PEFT builds adapters in the base layer's dtype but autocast_adapter_dtype=True (its
    // default) keeps bf16/fp16 adapters in fp32 (measured: 1,287,168 fp32 adapter parameters).
    (weight_bytes_of(m) == 4 || !o.openpi ? train32 : train16)[m] += lora_params[m];
    if (weight_bytes_of(m) == 4 || !o.openpi) cast32[m] += lora_params[m];  // adapters are Linear layers
  }

  // Bytes per trainable parameter. Hugging Face "Anatomy of Model's Memory"
  // (huggingface.co/docs/transformers/model_memory_anatomy): weights 4 (fp32) or 6 (mixed: fp32
  // + 16-bit copy), gradients 4, AdamW 8, 8-bit AdamW 2, SGD with momentum 4 -> 18/param for
  // mixed-precision AdamW. Pure 16-bit training keeps gradients and torch.optim state in the
  // parameter dtype (AdamW: zeros_like(param) for both moments).
  // Sharded over N GPUs, mixed precision (the fp32 master belongs to the optimizer partition):
  //   zero1: 2 + 4 + 12/N (Megatron-LM theoretical_memory_usage.py, distributed optimizer: 6 + 12/N)
  //   zero2: 4 + 16/N     (DeepSpeed estimate_zero2_model_states_mem_needs, no offload)
  //   zero3/fsdp: 18/N + the gathered unit (DeepSpeed estimate_zero3_model_states_mem_needs)
  // Pure precision: stage 1 divides optimizer state, 2 also gradients, 3 also parameters.
  const uint64_t N = static_cast<uint64_t>(o.gpus);
  auto div = [&](uint64_t v) { return (v + N - 1) / N; };
  const bool s1 = o.shard != ShardKind::None;
  const bool s2 = o.shard == ShardKind::Zero2 || o.shard == ShardKind::Zero3 || o.shard == ShardKind::Fsdp;
  const bool s3 = o.shard == ShardKind::Zero3 || o.shard == ShardKind::Fsdp;
  auto moments = [&](uint64_t sb) -> uint64_t {
    uint64_t b = 0;
    switch (o.optimizer) {
      case OptimizerKind::AdamW: b = 2 * sb; break;
      case OptimizerKind::AdamW8bit: b = 2; break;  // bitsandbytes: two 8-bit moments
      case OptimizerKind::Sgd: b = 0; break;
      case OptimizerKind::SgdMomentum: b = sb; break;
    }
    if (o.ema) b += sb;  // EMA copy, kept with the optimizer state
    return b;
  };
  // AdamW's foreach step (torch.optim defaults to foreach on CUDA): _multi_tensor_adam takes
  // exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs) per (device, dtype) group, a new tensor
  // per parameter, and the next group's is made before the previous one is released; with the
  // one or two dtype groups of these policies that is one copy of every updated parameter.
  // Measured: optimizer-step peak - (weights + state) - gradients = the gradients' size again
  // (pi0.5 fp32 batch 1: 24.21 GiB = 12.17 GiB gradients + 12.04 GiB).
  // openpi's JAX trainer runs optax under XLA (buffers donated, no torch foreach): not charged.
  const bool foreach_temp = o.optimizer == OptimizerKind::AdamW && !o.openpi;
  for (size_t m = 0; m < nm; ++m) {
    ModulePlan& mp = plan.modules[m];
    mp.weight_bytes = s3 ? div(stored_bytes[m]) : stored_bytes[m];
    for (int wb : {2, 4}) {
      const uint64_t n = wb == 4 ? train32[m] : train16[m];
      if (n == 0) continue;
      if (mixed) {
        // fp32 master + 16-bit working copy (bf16-stored params: the fp32 master is the extra).
        // For fp32-stored params under autocast the copy is the cast cache: alive from the first
        // forward use to the end of backward, not at the optimizer step (autocast_copy_bytes).
        const uint64_t working = (wb == 4 && (!o.half_copy || o.openpi)) ? 0 : 2;
        const uint64_t master = 4;
        const uint64_t opt = moments(4);
        if (foreach_temp) plan.optimizer_temp_bytes += s1 ? div(n * 4) : n * 4;
        if (!s1) {
          if (wb == 4) {
            mp.weight_bytes += n * master;
            plan.autocast_copy_bytes += cast32[m] * working;
          } else {
            mp.weight_bytes += n * (master + working);
          }
          mp.grad_bytes += n * 4;
          mp.optimizer_bytes += n * opt;
        } else if (!s2) {  // zero1
          mp.weight_bytes += n * 2;
          mp.grad_bytes += n * 4;
          mp.optimizer_bytes += div(n * (master + opt));
        } else if (!s3) {  // zero2
          mp.weight_bytes += n * 2;
          mp.grad_bytes += n * 2 + div(n * 4);
          mp.optimizer_bytes += div(n * (master + opt));
        } else {  // zero3 / fsdp
          mp.weight_bytes += div(n * 2);
          mp.grad_bytes += div(n * 4);
          mp.optimizer_bytes += div(n * (master + opt));
        }
      } else {
        const uint64_t w = n * wb, g = n * wb, opt = n * moments(static_cast<uint64_t>(wb));
        if (foreach_temp) plan.optimizer_temp_bytes += s1 ? div(w) : w;
        mp.weight_bytes += s3 ? div(w) : w;
        mp.grad_bytes += s2 ? div(g) : g;
        mp.optimizer_bytes += s1 ? div(opt) : opt;
      }
    }
  }

  // Activations, per micro-batch.
  const uint64_t B = static_cast<uint64_t>(o.batch);
  uint64_t working = 0;
  for (const ActBlock& b : arch.blocks) {
    const size_t m = static_cast<size_t>(b.module);
    const int e = act_bytes_of(m);
    const bool frozen = in_path[m] && !plan.modules[m].trainable;
    const uint64_t full = block_activation_bytes(b, e, frozen);
    if (in_path[m]) {
      const uint64_t saved = o.gradient_checkpointing ? block_checkpoint_bytes(b, e) : full;
      plan.modules[m].activation_bytes += B * saved * static_cast<uint64_t>(b.count);
    }
    if (b.transformer) {
      // The forward's own temporaries beyond what is saved: a layer's input, output and widest
      // intermediates at once -- for one sequence: pi0.5 and SmolVLA embed the cameras one at
      // a time (embed_prefix loops over the images). Backward's are in backward_peak_bytes.
      const uint64_t sq = b.tokens_q;
      uint64_t transient = sq * b.width * 3 + 2 * sq * b.ffn_width;
      if (!b.flash && b.q_width > 0) transient += static_cast<uint64_t>(b.heads) * b.tokens_q * b.tokens_kv;
      working = std::max(working, B * transient * e);
    }
  }
  plan.working_bytes = working;
  // The batch itself: fp32 images and targets.
  const PolicyInputs& in = arch.inputs;
  plan.input_bytes = B * 4 *
      static_cast<uint64_t>(in.cams * 3 * in.image_h * in.image_w + in.chunk * in.action_dim + in.state_dim);

  // ZeRO-3 gathers one submodule's parameters (and reduces its gradients) at a time: DeepSpeed's
  // estimator charges 16-bit params + grads of the largest layer (4 bytes x its parameters; here
  // the largest tensor); FSDP FULL_SHARD gathers one wrapped unit, a transformer layer here.
  // Plain DDP keeps a bucket copy of every gradient (gradient_as_bucket_view=False, the default;
  // torch.nn.parallel.DistributedDataParallel docs).
  if (s3) {
    uint64_t unit = largest_tensor;
    if (o.shard == ShardKind::Fsdp) {
      for (size_t m = 0; m < nm; ++m) {
        int64_t layers = 0;
        for (const ActBlock& b : arch.blocks)
          if (static_cast<size_t>(b.module) == m && b.transformer) layers = std::max(layers, b.count);
        if (layers > 0) unit = std::max(unit, plan.modules[m].params / static_cast<uint64_t>(layers));
      }
    }
    plan.gather_bytes = unit * (mixed ? 4 : 2 * static_cast<uint64_t>(dtype_bytes(o.dtype)));
  }

  for (const ModulePlan& mp : plan.modules) {
    plan.params += mp.params + mp.lora_params;  // adapters counted as parameters too
    plan.trainable_params += mp.trainable_params;
    plan.weight_bytes += mp.weight_bytes;
    plan.grad_bytes += mp.grad_bytes;
    plan.optimizer_bytes += mp.optimizer_bytes;
    plan.activation_bytes += mp.activation_bytes;
  }
  if (o.gpus > 1 && o.shard == ShardKind::None) plan.ddp_bucket_bytes = plan.grad_bytes;

  // Fixed costs. CUDA context: with lazy module loading (the default since CUDA 11.7 / PyTorch
  // 1.13) a few hundred MiB (Hugging Face's anatomy page measured ~1.3 GB with eager loading).
  // Measured for this project on an H200 with torch 2.11.0+cu130: NVML's figure for the process
  // minus torch's reserved bytes was 610 MiB after the first tensor and 684 MiB after the first
  // bf16 cuBLAS matmul and cuDNN conv; 0.74-0.76 GiB after the training runs of
  // tests/fixtures/train_memory (cuDNN/cuBLAS handles, kernels loaded). We charge 640 MiB of
  // context + 32 MiB cuBLAS workspace (PyTorch's CUBLAS_WORKSPACE_CONFIG default on Hopper,
  // ":4096:8"; the workspace comes from the caching allocator, so it is inside torch's counters).
  plan.cuda_context_bytes = o.cuda_context_bytes;
  plan.workspace_bytes = o.workspace_bytes;
  // The step's peak (see train_plan.h): the activations are gone when the optimizer runs, and
  // zero_grad() frees the gradients before the next forward, so the peak is the larger of the
  // two phases, not their sum. Checked against 20 measured lerobot runs (train_plan_test.cpp).
  plan.persistent_bytes = plan.weight_bytes + plan.optimizer_bytes + plan.ddp_bucket_bytes + plan.gather_bytes;
  const uint64_t per_step = plan.activation_bytes + plan.working_bytes + plan.autocast_copy_bytes;
  plan.forward_peak_bytes = plan.persistent_bytes + plan.input_bytes + per_step + plan.workspace_bytes;
  plan.optimizer_peak_bytes =
      plan.persistent_bytes + plan.input_bytes + plan.grad_bytes + plan.optimizer_temp_bytes + plan.workspace_bytes;
  plan.peak_allocated_bytes = std::max(plan.forward_peak_bytes, plan.optimizer_peak_bytes);
  // Peak reserved: PyTorch's caching allocator holds more than the live bytes -- every request
  // rounded to 512 B and carved from 2 MiB / 20 MiB / 2 MiB-rounded segments, and free blocks a
  // later request does not fit (the holes activations leave between the optimizer state, the
  // gradients' places after zero_grad, the fp32 weights lerobot builds before casting to bf16).
  // No margin: the run's tensors, as this plan sizes them, are replayed in order through a model
  // of the allocator (diag/alloc_sim.h) and its overhead at the peak -- reserved minus allocated
  // -- is added to the peak allocated above. Only the allocator is modelled, not which tensor
  // is alive: that is the plan's.
  {
    std::vector<SimLayer> layers;
    std::vector<std::vector<size_t>> module_layers(nm);
    for (const ActBlock& b : arch.blocks) {
      const size_t m = static_cast<size_t>(b.module);
      const int e = act_bytes_of(m);
      const bool frozen = in_path[m] && !plan.modules[m].trainable;
      // pi0.5/SmolVLA/ACT embed the cameras one at a time: a vision layer's tensors are per camera.
      ActBlock one = b;
      int64_t reps = 1;
      if (b.transformer && b.seqs > 1 && b.saved_tensor_bytes.empty()) {
        reps = b.seqs;
        one.seqs = 1;
      }
      std::vector<uint64_t> per = block_saved_tensors(one, e, frozen);
      for (uint64_t& x : per) x *= B;
      if (in_path[m] && o.gradient_checkpointing && b.transformer && arch.modules[m].role == ModuleRole::Vision) {
        // lerobot checkpoints a camera's whole vision tower (embed_image under _apply_checkpoint):
        // one unit per camera keeping its output; backward recomputes all its layers at once.
        for (int64_t r = 0; r < reps; ++r) {
          SimLayer L;
          L.checkpointed = true;
          L.saved = {B * static_cast<uint64_t>(one.input_elements()) * static_cast<uint64_t>(e)};
          for (int64_t l = 0; l < b.count; ++l) L.full.insert(L.full.end(), per.begin(), per.end());
          for (int64_t l = 0; l < b.count; ++l) module_layers[m].push_back(layers.size());
          layers.push_back(std::move(L));
        }
        continue;
      }
      for (int64_t r = 0; r < reps; ++r)
        for (int64_t l = 0; l < b.count; ++l) {
          SimLayer L;
          if (in_path[m]) {
            if (o.gradient_checkpointing && b.transformer) {
              L.checkpointed = true;
              L.full = per;
              L.saved = {B * static_cast<uint64_t>(one.input_elements()) * static_cast<uint64_t>(e)};
            } else {
              L.saved = per;
            }
          } else {
            L.backward = false;
            if (b.transformer) {
              const uint64_t sq = static_cast<uint64_t>(one.tokens_q) * one.seqs, E = static_cast<uint64_t>(e);
              for (int k = 0; k < 3; ++k) L.transient.push_back(B * sq * one.width * E);
              for (int k = 0; k < 2; ++k) L.transient.push_back(B * sq * one.ffn_width * E);
              if (!one.flash && one.q_width > 0)
                L.transient.push_back(B * static_cast<uint64_t>(one.heads) * one.tokens_q * one.tokens_kv * E);
            } else {
              L.transient = per;
            }
          }
          module_layers[m].push_back(layers.size());
          layers.push_back(std::move(L));
        }
    }
    // Each module's gradients come out of its layers' backward, last layer first: its
    // parameters, in table (forward) order, spread evenly over its layers.
    std::vector<std::vector<int>> module_params(nm);
    for (size_t i = 0; i < sim_params.size(); ++i) module_params[static_cast<size_t>(sim_params[i].module)].push_back(static_cast<int>(i));
    for (size_t m = 0; m < nm; ++m) {
      const auto& ls = module_layers[m];
      const auto& ps = module_params[m];
      for (size_t j = 0; j < ps.size(); ++j) {
        if (sim_params[static_cast<size_t>(ps[j])].grad_bytes == 0 && sim_params[static_cast<size_t>(ps[j])].cast_bytes == 0) continue;
        if (ls.empty()) {
          if (!layers.empty()) layers.back().params.push_back(ps[j]);
          continue;
        }
        layers[ls[j * ls.size() / ps.size()]].params.push_back(ps[j]);
      }
    }
    if (o.gpus > 1) {
      for (SimParam& sp : sim_params) {  // what one GPU holds of each tensor
        if (s3) sp.stored_bytes = div(sp.stored_bytes);
        if (s2) sp.grad_bytes = div(sp.grad_bytes);
        if (s1) sp.moment_bytes = div(sp.moment_bytes);
      }
    }
    std::vector<uint64_t> batch;
    for (int64_t c = 0; c < in.cams; ++c) batch.push_back(B * 4 * static_cast<uint64_t>(3 * in.image_h * in.image_w));
    batch.push_back(B * 4 * static_cast<uint64_t>(in.chunk * in.action_dim + in.state_dim));
    // The backward phase's own peak: going from the last layer to the first, what is still saved
    // (this layer and those before it, with their autocast copies), the gradients made so far
    // (this layer's and those after it) and this layer's gradients of its saved tensors in flight
    // (its recomputed tensors when checkpointed).
    {
      std::vector<uint64_t> saved(layers.size(), 0), grads(layers.size(), 0), casts(layers.size(), 0), flight(layers.size(), 0);
      for (size_t l = 0; l < layers.size(); ++l) {
        const SimLayer& L = layers[l];
        if (!L.backward) continue;
        uint64_t biggest = 0, full = 0;
        for (uint64_t x : L.saved) saved[l] += x;
        for (uint64_t x : (L.checkpointed ? L.full : L.saved)) {
          biggest = std::max(biggest, x);
          full += x;
        }
        flight[l] = L.checkpointed ? full + biggest : 2 * biggest;
        for (int pi : L.params) {
          grads[l] += sim_params[static_cast<size_t>(pi)].grad_bytes;
          casts[l] += sim_params[static_cast<size_t>(pi)].cast_bytes;
        }
      }
      uint64_t after = 0, best = 0, before = 0;
      std::vector<uint64_t> upto(layers.size() + 1, 0);
      for (size_t l = 0; l < layers.size(); ++l) upto[l + 1] = upto[l] + saved[l] + casts[l];
      for (size_t l = layers.size(); l-- > 0;) {
        after += grads[l];
        before = upto[l + 1];
        if (layers[l].backward) best = std::max(best, before + after + flight[l]);
      }
      for (const SimLayer& L : layers) (void)L;
      plan.backward_peak_bytes = plan.persistent_bytes + plan.input_bytes + plan.workspace_bytes + best;
    }
    // openpi's JAX trainer runs under XLA's own allocator (BFC, preallocating): not modelled.
    if (!o.openpi) {
      const AllocSimResult sim = simulate_training_allocator(sim_params, layers, batch, o.workspace_bytes);
      plan.sim_peak_allocated_bytes = sim.peak_allocated;
      plan.sim_peak_reserved_bytes = sim.peak_reserved;
      plan.allocator_bytes = sim.peak_reserved - std::min(sim.peak_reserved, sim.peak_allocated);
    }
  }
  plan.peak_allocated_bytes = std::max(plan.peak_allocated_bytes, plan.backward_peak_bytes);
  plan.peak_reserved_bytes = plan.peak_allocated_bytes + plan.allocator_bytes;
  plan.total_bytes = plan.peak_reserved_bytes + plan.cuda_context_bytes;
  return plan;
}

// ---- levers ------------------------------------------------------------------------------

namespace {

struct Setup {
  PolicyInputs inputs;
  TrainOptions opts;
};

struct Planner {
  PolicyKind kind;
  const nlohmann::json* config;
  std::string config_path;
  Result<TrainPlan> run(const Setup& s) const {
    VLAC_ASSIGN_OR_RETURN(PolicyArch arch, build_policy_arch(kind, s.inputs, config, config_path));
    return plan_training(arch, s.opts);
  }
};

// The guide's order (seed 004, "Pull the levers in this order"), restricted to what a plan can
// model: dtype -> halve batch (+ accumulate) -> gradient checkpointing -> freeze vision ->
// train expert only -> LoRA -> shrink inputs -> bigger card.
enum class LeverId { Dtype, HalveBatch, Checkpointing, FreezeVision, ExpertOnly, Lora, Shrink };
constexpr LeverId kOrder[] = {LeverId::Dtype, LeverId::HalveBatch, LeverId::Checkpointing, LeverId::FreezeVision,
                              LeverId::ExpertOnly, LeverId::Lora, LeverId::Shrink};

const char* lever_name(LeverId id) {
  switch (id) {
    case LeverId::Dtype: return "dtype";
    case LeverId::HalveBatch: return "halve_batch";
    case LeverId::Checkpointing: return "gradient_checkpointing";
    case LeverId::FreezeVision: return "freeze_vision";
    case LeverId::ExpertOnly: return "train_expert_only";
    case LeverId::Lora: return "lora";
    case LeverId::Shrink: return "shrink_inputs";
  }
  return "?";
}

// changes_policy follows the guide ("Which levers silently change the run") and matches
// `vlac mem oom`: a different dtype, frozen modules, adapters and smaller inputs change what is
// learned; batch halving with accumulation keeps the effective batch (only throughput changes);
// recomputation and a bigger card are pure infrastructure.
bool lever_changes_policy(LeverId id) {
  switch (id) {
    case LeverId::HalveBatch:
    case LeverId::Checkpointing: return false;
    default: return true;
  }
}

// Applies a (non-batch) lever to a setup; returns false if it does not apply.
bool apply_lever(LeverId id, const PolicyArch& arch0, const TrainPlan& base, Setup* s, std::string* detail) {
  switch (id) {
    case LeverId::Dtype:
      if (s->opts.dtype != WeightDtype::Fp32 || s->opts.mixed != MixedPrecision::No) return false;
      s->opts.dtype = WeightDtype::Bf16;
      *detail = "--dtype bf16 (lerobot: --policy.dtype=bfloat16)";
      return true;
    case LeverId::Checkpointing:
      if (s->opts.gradient_checkpointing) return false;
      s->opts.gradient_checkpointing = true;
      *detail = "--gradient-checkpointing (lerobot: --policy.gradient_checkpointing=true)";
      return true;
    case LeverId::FreezeVision: {
      if (s->opts.freeze_vision) return false;
      bool any = false;
      for (const ModulePlan& m : base.modules) any = any || (m.role == std::string("vision") && m.trainable);
      if (!any) return false;
      s->opts.freeze_vision = true;
      s->opts.tune_vision = false;
      *detail = arch0.kind == PolicyKind::GrootN17 ? "--freeze-vision (Isaac-GR00T: drop --tune-visual)"
                                                   : "--freeze-vision (lerobot: --policy.freeze_vision_encoder=true)";
      return true;
    }
    case LeverId::ExpertOnly: {
      if (s->opts.train_expert_only) return false;
      bool any = false, has_expert = false;
      for (const ModuleSpec& m : arch0.modules) has_expert = has_expert || m.role == ModuleRole::Expert;
      for (const ModulePlan& m : base.modules)
        any = any || ((m.role == std::string("language") || m.role == std::string("projector")) && m.trainable);
      if (!any || !has_expert) return false;
      s->opts.train_expert_only = true;
      s->opts.tune_llm = false;
      *detail = arch0.kind == PolicyKind::GrootN17
                    ? "--train-expert-only (Isaac-GR00T defaults: no --tune-llm, no --tune-visual)"
                    : "--train-expert-only (lerobot: --policy.train_expert_only=true)";
      return true;
    }
    case LeverId::Lora:
      if (s->opts.lora_r > 0) return false;
      s->opts.lora_r = 16;  // lerobot PeftConfig default r=16; openpi gemma_2b_lora rank 16
      *detail = arch0.kind == PolicyKind::GrootN17
                    ? "--lora-r 16 (Isaac-GR00T N1.5's --lora-rank; N1.7's FinetuneConfig has no LoRA fields)"
                    : "--lora-r 16 (lerobot: --peft.method_type=LORA --peft.r=16)";
      return true;
    case LeverId::Shrink: {
      // Fewer cameras first (activations scale with image tokens), then a shorter chunk.
      PolicyInputs& in = s->inputs;
      if (in.cams > 1) {
        *detail = "--cams " + std::to_string(in.cams) + " -> 1";
        in.cams = 1;
        if (in.chunk > 16) {
          *detail += ", --chunk " + std::to_string(in.chunk) + " -> " + std::to_string(in.chunk / 2);
          in.chunk /= 2;
        }
        return true;
      }
      if (in.chunk > 16) {
        *detail = "--chunk " + std::to_string(in.chunk) + " -> " + std::to_string(in.chunk / 2);
        in.chunk /= 2;
        return true;
      }
      return false;
    }
    case LeverId::HalveBatch: return false;  // handled by the search
  }
  return false;
}

}  // namespace

Result<TrainPlan> plan_for_gpu(PolicyKind kind, const PolicyInputs& requested, const nlohmann::json* config,
                               const std::string& config_path, const TrainOptions& opts, const GpuSpec& gpu) {
  Planner planner{kind, config, config_path};
  VLAC_ASSIGN_OR_RETURN(PolicyArch arch0, build_policy_arch(kind, requested, config, config_path));
  VLAC_ASSIGN_OR_RETURN(TrainPlan plan, plan_training(arch0, opts));
  plan.gpu = gpu;
  plan.fits = plan.total_bytes <= gpu.bytes;
  for (const GpuSpec& g : known_gpus())
    if (plan.total_bytes <= g.bytes) {
      plan.smallest_gpu_as_is = g;
      break;
    }
  if (plan.fits) return plan;

  const Setup original{arch0.inputs, opts};
  int max_halvings = 0;
  for (int64_t b = opts.batch; b > 1; b = (b + 1) / 2) ++max_halvings;
  struct Step {
    LeverId id;
    std::string detail;
  };
  // Pulls `ids` (kept in the guide's order) on the original setup; the batch is halved
  // `halvings` times with accumulation doubled each time (same effective batch).
  auto realize = [&](const std::vector<LeverId>& ids, int halvings, std::vector<Step>* steps,
                     TrainPlan* out) -> Status {
    Setup s = original;
    TrainPlan cur = plan;
    if (steps) steps->clear();
    for (LeverId id : ids) {
      std::string detail;
      if (id == LeverId::HalveBatch) {
        if (halvings == 0) continue;
        const int64_t b0 = s.opts.batch, a0 = s.opts.grad_accum;
        for (int i = 0; i < halvings && s.opts.batch > 1; ++i) {
          s.opts.batch = (s.opts.batch + 1) / 2;
          s.opts.grad_accum *= 2;
        }
        detail = "--batch " + std::to_string(b0) + " -> " + std::to_string(s.opts.batch) + " with --grad-accum " +
                 std::to_string(a0) + " -> " + std::to_string(s.opts.grad_accum) + " (same effective batch)";
      } else if (!apply_lever(id, arch0, cur, &s, &detail)) {
        continue;
      }
      VLAC_ASSIGN_OR_RETURN(cur, planner.run(s));
      if (steps) steps->push_back({id, detail});
    }
    *out = std::move(cur);
    return Status::ok();
  };
  // Fewest halvings that fit with `ids`; max_halvings if none does. Sets *fit.
  auto best = [&](const std::vector<LeverId>& ids, int* halvings, bool* fit) -> Status {
    const bool batch = std::find(ids.begin(), ids.end(), LeverId::HalveBatch) != ids.end();
    TrainPlan p;
    for (int h = 0; h <= (batch ? max_halvings : 0); ++h) {
      VLAC_RETURN_IF_ERROR(realize(ids, h, nullptr, &p));
      *halvings = h;
      *fit = p.total_bytes <= gpu.bytes;
      if (*fit) return Status::ok();
    }
    return Status::ok();
  };

  std::vector<LeverId> chosen;
  bool fit = false;
  int halvings = 0;
  for (LeverId id : kOrder) {
    chosen.push_back(id);
    VLAC_RETURN_IF_ERROR(best(chosen, &halvings, &fit));
    if (fit) break;
  }
  if (fit) {
    // Prune: drop any earlier lever the fit does not need (latest first; the last one stays).
    for (size_t i = chosen.size() - 1; i-- > 0;) {
      std::vector<LeverId> trial = chosen;
      trial.erase(trial.begin() + static_cast<std::ptrdiff_t>(i));
      bool ok = false;
      int h = 0;
      VLAC_RETURN_IF_ERROR(best(trial, &h, &ok));
      if (ok) chosen = std::move(trial);  // a move: GCC 12 on aarch64 warns falsely on the copy
    }
    VLAC_RETURN_IF_ERROR(best(chosen, &halvings, &fit));
    std::vector<Step> steps;
    TrainPlan final_plan;
    VLAC_RETURN_IF_ERROR(realize(chosen, halvings, &steps, &final_plan));
    // Totals after each step, cumulatively in the guide's order.
    std::vector<LeverId> prefix;
    for (const Step& st : steps) {
      prefix.push_back(st.id);
      TrainPlan p;
      VLAC_RETURN_IF_ERROR(realize(prefix, halvings, nullptr, &p));
      plan.levers.push_back({lever_name(st.id), st.detail, lever_changes_policy(st.id), p.total_bytes});
    }
    plan.levers_fit = true;
    return plan;
  }
  // Nothing on this card: the guide's last lever, a bigger card for the unchanged recipe, or
  // sharding across cards of this size.
  plan.levers_fit = false;
  if (plan.smallest_gpu_as_is) {
    plan.levers.push_back({"bigger_card", "--gpu " + plan.smallest_gpu_as_is->name + " (fits the recipe unchanged)",
                           false, plan.total_bytes});
  } else {
    for (int64_t n = 2; n <= 64; n *= 2) {
      Setup s = original;
      s.opts.gpus = n;
      s.opts.shard = ShardKind::Fsdp;
      VLAC_ASSIGN_OR_RETURN(TrainPlan p, planner.run(s));
      if (p.total_bytes <= gpu.bytes) {
        plan.levers.push_back({"shard", "--gpus " + std::to_string(n) + " --shard fsdp (per-GPU total)", false, p.total_bytes});
        break;
      }
    }
  }
  return plan;
}

// ---- output ------------------------------------------------------------------------------

nlohmann::json plan_to_json(const TrainPlan& p) {
  using nlohmann::json;
  const TrainOptions& o = p.options;
  json j;
  j["policy"] = policy_kind_name(p.kind);
  j["description"] = p.description;
  j["inputs"] = {{"cams", p.inputs.cams}, {"image_h", p.inputs.image_h}, {"image_w", p.inputs.image_w},
                 {"prompt_tokens", p.inputs.prompt_tokens}, {"chunk", p.inputs.chunk},
                 {"image_tokens_per_cam", p.image_tokens_per_cam}, {"prefix_tokens", p.prefix_tokens}};
  j["options"] = {{"dtype", to_string(o.dtype)}, {"mixed_precision", to_string(o.mixed)},
                  {"optimizer", to_string(o.optimizer)}, {"batch", o.batch}, {"grad_accum", o.grad_accum},
                  {"gradient_checkpointing", o.gradient_checkpointing}, {"freeze_vision", o.freeze_vision},
                  {"train_expert_only", o.train_expert_only}, {"tune_vision", o.tune_vision},
                  {"tune_llm", o.tune_llm}, {"lora_r", o.lora_r}, {"ema", o.ema}, {"vlm_bf16", o.vlm_bf16}, {"openpi", o.openpi}, {"gpus", o.gpus},
                  {"shard", to_string(o.shard)}};
  json mods = json::array();
  for (const ModulePlan& m : p.modules)
    mods.push_back({{"name", m.name}, {"role", m.role}, {"params", m.params},
                    {"trainable_params", m.trainable_params}, {"lora_params", m.lora_params},
                    {"weight_bytes", m.weight_bytes}, {"grad_bytes", m.grad_bytes},
                    {"optimizer_bytes", m.optimizer_bytes}, {"activation_bytes", m.activation_bytes},
                    {"trainable", m.trainable}, {"in_grad_path", m.in_grad_path}});
  j["modules"] = mods;
  j["params"] = p.params;
  j["trainable_params"] = p.trainable_params;
  j["weight_bytes"] = p.weight_bytes;
  j["grad_bytes"] = p.grad_bytes;
  j["optimizer_bytes"] = p.optimizer_bytes;
  j["activation_bytes"] = p.activation_bytes;
  j["working_bytes"] = p.working_bytes;
  j["input_bytes"] = p.input_bytes;
  j["ddp_bucket_bytes"] = p.ddp_bucket_bytes;
  j["gather_bytes"] = p.gather_bytes;
  j["autocast_copy_bytes"] = p.autocast_copy_bytes;
  j["optimizer_temp_bytes"] = p.optimizer_temp_bytes;
  j["persistent_bytes"] = p.persistent_bytes;
  j["forward_peak_bytes"] = p.forward_peak_bytes;
  j["optimizer_peak_bytes"] = p.optimizer_peak_bytes;
  j["peak_allocated_bytes"] = p.peak_allocated_bytes;
  j["peak_reserved_bytes"] = p.peak_reserved_bytes;
  j["cuda_context_bytes"] = p.cuda_context_bytes;
  j["workspace_bytes"] = p.workspace_bytes;
  j["allocator_bytes"] = p.allocator_bytes;
  j["backward_peak_bytes"] = p.backward_peak_bytes;
  j["sim_peak_allocated_bytes"] = p.sim_peak_allocated_bytes;
  j["sim_peak_reserved_bytes"] = p.sim_peak_reserved_bytes;
  j["total_bytes"] = p.total_bytes;
  if (p.gpu) {
    j["gpu"] = {{"name", p.gpu->name}, {"bytes", p.gpu->bytes}};
    j["fits"] = p.fits;
    j["headroom_bytes"] = static_cast<int64_t>(p.gpu->bytes) - static_cast<int64_t>(p.total_bytes);
  }
  j["smallest_gpu_as_is"] = p.smallest_gpu_as_is ? json(p.smallest_gpu_as_is->name) : json(nullptr);
  json lev = json::array();
  for (const Lever& l : p.levers)
    lev.push_back({{"name", l.name}, {"detail", l.detail}, {"changes_policy", l.changes_policy},
                   {"total_bytes_after", l.total_after}});
  j["levers"] = lev;
  j["levers_fit"] = p.levers_fit;
  return j;
}

namespace {

std::string fmt_count(uint64_t n) {
  char buf[32];
  if (n >= 1000000000ull) std::snprintf(buf, sizeof buf, "%.2fB", static_cast<double>(n) / 1e9);
  else if (n >= 1000000ull) std::snprintf(buf, sizeof buf, "%.1fM", static_cast<double>(n) / 1e6);
  else if (n >= 1000ull) std::snprintf(buf, sizeof buf, "%.1fK", static_cast<double>(n) / 1e3);
  else std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(n));
  return buf;
}

std::string pad(const std::string& s, size_t w, bool right = true) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

}  // namespace

std::string plan_to_text(const TrainPlan& p) {
  const TrainOptions& o = p.options;
  std::string out;
  out += std::string("policy ") + policy_kind_name(p.kind) + ": " + p.description + "\n";
  out += "inputs: " + std::to_string(p.inputs.cams) + " cam(s) " + std::to_string(p.inputs.image_h) + "x" +
         std::to_string(p.inputs.image_w) + " (" + std::to_string(p.image_tokens_per_cam) + " tokens each), prompt " +
         std::to_string(p.inputs.prompt_tokens) + ", chunk " + std::to_string(p.inputs.chunk) + ", prefix " +
         std::to_string(p.prefix_tokens) + " tokens\n";
  out += std::string("setup: ") + (o.openpi ? "openpi JAX, " : "") + "dtype " + to_string(o.dtype) + ", mixed precision " + to_string(o.mixed) + ", " +
         to_string(o.optimizer) + (o.ema ? " + EMA" : "") + ", batch " + std::to_string(o.batch) + " x accum " +
         std::to_string(o.grad_accum) + (o.gradient_checkpointing ? ", gradient checkpointing" : "") +
         (o.lora_r > 0 ? ", LoRA r=" + std::to_string(o.lora_r) : std::string()) +
         (o.gpus > 1 ? ", " + std::to_string(o.gpus) + " GPUs shard " + to_string(o.shard) : std::string()) + "\n\n";
  const size_t W = 11;
  out += pad("module", 11, false) + pad("params", 9) + pad("trainable", 10) + pad("weights", W) + pad("grads", W) +
         pad("optimizer", W) + pad("activations", 12) + "\n";
  for (const ModulePlan& m : p.modules) {
    std::string name = m.name + (m.in_grad_path ? "" : "*");
    out += pad(name, 11, false) + pad(fmt_count(m.params + m.lora_params), 9) + pad(fmt_count(m.trainable_params), 10) +
           pad(format_bytes(m.weight_bytes), W) + pad(format_bytes(m.grad_bytes), W) +
           pad(format_bytes(m.optimizer_bytes), W) + pad(format_bytes(m.activation_bytes), 12) + "\n";
  }
  out += pad("total", 11, false) + pad(fmt_count(p.params), 9) + pad(fmt_count(p.trainable_params), 10) +
         pad(format_bytes(p.weight_bytes), W) + pad(format_bytes(p.grad_bytes), W) +
         pad(format_bytes(p.optimizer_bytes), W) + pad(format_bytes(p.activation_bytes), 12) + "\n";
  out += "(* = outside the gradient path: no activations kept)\n\n";
  auto line = [&](const std::string& what, uint64_t b) {
    if (b > 0) out += "  " + pad(what, 46, false) + pad(format_bytes(b), 12) + "\n";
  };
  line("weights (+ buffers)", p.weight_bytes);
  line("optimizer state", p.optimizer_bytes);
  line("DDP gradient buckets", p.ddp_bucket_bytes);
  line("ZeRO-3/FSDP gathered unit", p.gather_bytes);
  line("the batch on the GPU", p.input_bytes);
  line("cuBLAS workspace", p.workspace_bytes);
  out += "  forward/backward adds:\n";
  line("  activations kept for backward", p.activation_bytes);
  line("  one layer's forward temporaries", p.working_bytes);
  line("  autocast copies of trainable weights", p.autocast_copy_bytes);
  out += "  optimizer step adds:\n";
  line("  gradients", p.grad_bytes);
  line("  AdamW foreach temporary", p.optimizer_temp_bytes);
  line("peak in forward", p.forward_peak_bytes);
  line("peak in backward", p.backward_peak_bytes);
  line("peak in the optimizer step", p.optimizer_peak_bytes);
  line("peak allocated (torch.cuda.max_memory_allocated)", p.peak_allocated_bytes);
  line("caching allocator (rounding, free blocks)", p.allocator_bytes);
  line("CUDA context", p.cuda_context_bytes);
  out += "  " + pad("total", 46, false) + pad(format_bytes(p.total_bytes), 12) + "\n";
  if (p.gpu) {
    out += "\n" + p.gpu->name + " (" + format_bytes(p.gpu->bytes) + "): " +
           (p.fits ? "fits, " + format_bytes(p.gpu->bytes - p.total_bytes) + " free"
                   : "does NOT fit, " + format_bytes(p.total_bytes - p.gpu->bytes) + " over") + "\n";
    if (!p.fits) {
      if (p.levers_fit) out += "cheapest levers that make it fit (guide order):\n";
      else out += "no lever short of more memory makes it fit on this card:\n";
      int i = 1;
      for (const Lever& l : p.levers)
        out += "  " + std::to_string(i++) + ". " + l.name + ": " + l.detail + " -> " + format_bytes(l.total_after) +
               (l.changes_policy ? "  [changes the policy]" : "  [same policy]") + "\n";
      if (p.levers.empty()) out += "  none found (not even sharding over 64 such cards)\n";
    }
    if (p.smallest_gpu_as_is) out += "smallest card for this setup unchanged: " + p.smallest_gpu_as_is->name + "\n";
    else out += "no single card of the table holds this setup unchanged\n";
  }
  return out;
}

}  // namespace vlac::diag
