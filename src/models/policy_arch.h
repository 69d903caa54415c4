// A trainable policy as the training-memory planner sees it: every parameter tensor the
// training process holds (from the per-architecture tables), grouped into modules, plus a
// per-block description of the activations one sample produces. Holds no data, no policy math.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace vlac {

enum class PolicyKind : uint8_t { Pi05, Pi0, SmolVla, Act, GrootN17 };
const char* policy_kind_name(PolicyKind kind);  // "pi05", "pi0", "smolvla", "act", "groot-n1.7"
Result<PolicyKind> parse_policy_kind(const std::string& name);

/// What a module is, for the levers that act by role (freeze-vision, train-expert-only).
enum class ModuleRole : uint8_t { Vision, Projector, Language, Expert, Heads, Encoder, Unused };
const char* module_role_name(ModuleRole role);

/// How a module's weights are stored independently of the run's --dtype.
enum class DtypeRule : uint8_t {
  Follow,        // the run's weight dtype
  Fp32InBf16,    // lerobot pi0/pi0.5 keep vision tower + projector in f32 when dtype=bfloat16
  AlwaysBf16,    // lerobot SmolVLA's SmolVLM2 backbone: bf16 when loaded from the hub (load_vlm_weights)
};

struct ModuleSpec {
  std::string name;            // "vision", "language", "expert", "heads", ...
  ModuleRole role;
  bool trainable_default;      // the stack's own default (GR00T: backbone frozen; SmolVLA: VLM frozen)
  DtypeRule dtype_rule = DtypeRule::Follow;
  std::vector<int> upstream;   // modules whose outputs feed this one (gradient flows back into them)
  /// Modules sharing attention ops with this one (pi0/pi0.5/SmolVLA run prefix and chunk through
  /// one joint attention per layer): if either needs a backward graph, autograd records both,
  /// because every output row of a joint attention depends (in the graph) on every input.
  std::vector<int> coupled = {};
};

struct ParamTensor {
  std::string name;            // checkpoint-style key
  std::vector<int64_t> shape;  // PyTorch layout, Linear weights [out, in]
  int module;                  // index into PolicyArch::modules
  /// false: the loss never reaches it (lm_heads, parts of the last VLM layer): no gradient,
  /// no optimizer state even when it requires grad (AdamW skips params whose .grad is None).
  bool gets_grad = true;
  bool is_buffer = false;      // stored with the weights but not a parameter (frozen BatchNorm stats)
  uint64_t numel() const;
};

/// One kind of block repeated `count` times, described per training sample. Feeds the
/// Korthikanti et al. 2022 activation formula (see diag/train_plan.h).
struct ActBlock {
  std::string name;
  int module;
  int64_t count = 1;             // layers of this kind
  int64_t seqs = 1;              // independent sequences per sample (SigLIP runs once per camera)
  int64_t tokens_q = 0;          // tokens per sequence this block computes
  int64_t tokens_kv = 0;         // tokens its attention reads (prefix + chunk for the expert)
  int64_t width = 0;             // h: residual width
  int64_t q_width = 0;           // heads * head_dim (0: no attention in this block)
  int64_t kv_width = 0;          // kv_heads * head_dim (per K and per V)
  int64_t kv_in_width = 0;       // >0: cross-attention, K/V projected from tokens_kv inputs this wide
  int64_t heads = 0;
  int64_t ffn_width = 0;         // 0: no MLP
  int ffn_tensors = 2;           // f-wide tensors saved: 2 (GeLU MLP), 4 (gated SwiGLU/GeGLU)
  int norms = 2;
  bool dropout = false;          // 1-byte masks + dropped copies (Korthikanti's GPT block has them)
  bool flash = false;            // fused attention: the a*s^2 terms are never stored
  /// Eager attention that takes the softmax in fp32 and casts back (transformers'
  /// eager_attention_forward, SmolVLA's own attention): with 16-bit activations the scores are
  /// kept twice, fp32 softmax output + 16-bit copy (measured, docs/mem-plan.md).
  bool softmax_fp32 = false;
  bool qk_fp32 = false;          // ... and Q, K are upcast to fp32 before the scores (kept in fp32)
  /// lerobot's PiGemma RMSNorm (pi_gemma.py): computes in fp32 and keeps, per norm, the fp32
  /// normalised input and the scaled output (+ the fp32 upcast and a 16-bit cast in bf16 runs).
  bool fp32_norms = false;
  bool transformer = true;       // false: `raw_elements` per sample (convnets, linear heads)
  int64_t raw_elements = 0;      // activation elements saved per sample (non-transformer)
  int64_t raw_extra_bytes = 0;   // bytes saved per sample at fixed size (int64 max-pool indices)
  std::vector<int64_t> raw_tensor_elements;  // optional: raw_elements tensor by tensor (sums to it)
  /// When not empty: the tensors one layer saves for backward, bytes per sample, enumerated from
  /// the model code (and checked against a measured saved-tensor census) instead of the
  /// Korthikanti terms -- for blocks whose dtypes those terms cannot express (GR00T's diffusers
  /// blocks under autocast keep an fp32 residual stream and a bf16 copy per consuming Linear).
  std::vector<int64_t> saved_tensor_bytes;
  int64_t input_elements() const { return seqs * tokens_q * width; }  // block input, per sample
};

/// Sizes of one training sample's inputs.
struct PolicyInputs {
  int64_t cams = 0;
  int64_t image_h = 0, image_w = 0;
  int64_t prompt_tokens = 0;   // text tokens in the prefix
  int64_t chunk = 0;           // action chunk length (decoder queries / expert tokens)
  int64_t state_dim = 0, action_dim = 0;
};

struct PolicyArch {
  PolicyKind kind;
  std::string description;     // one line: what was built and from which sizes
  std::vector<ModuleSpec> modules;
  std::vector<ParamTensor> params;
  std::vector<ActBlock> blocks;
  PolicyInputs inputs;
  int64_t image_tokens_per_cam = 0;
  int64_t prefix_tokens = 0;   // VLM sequence (image tokens x cams + prompt [+ state])
  int module_index(const std::string& name) const;  // -1 if absent
};

/// Per-policy defaults for the training inputs (lerobot's / the vendor's defaults).
PolicyInputs default_policy_inputs(PolicyKind kind);

/// Optional, per-policy: a lerobot config.json for pi0.5 (dims, chunk, cameras, prompt length).
/// Builds the planner's description of `kind` for these inputs. Unset (0) inputs take the
/// policy default. `config` may be null.
Result<PolicyArch> build_policy_arch(PolicyKind kind, const PolicyInputs& inputs,
                                     const nlohmann::json* config = nullptr,
                                     const std::string& config_path = "");

/// Adds the training-side blocks shared by the PaliGemma family (pi0, pi0.5): SigLIP per camera,
/// projector, Gemma prefix over the prefix, expert over the chunk attending prefix+chunk.
struct PaliGemmaBlockSizes {
  int64_t image_size, patch_size, vision_width, vision_depth, vision_mlp, vision_heads;
  int64_t lm_width, lm_depth, lm_mlp, lm_heads, kv_heads, head_dim;
  int64_t expert_width, expert_mlp, suffix_extra_tokens;  // pi0: +1 state token in the suffix
};
void add_paligemma_blocks(const PaliGemmaBlockSizes& s, PolicyArch* arch);

}  // namespace vlac
