// GR00T N1.7's architecture as a table (NVIDIA Isaac-GR00T, Gr00tN1d7): Cosmos-Reason2-2B
// (Qwen3-VL) backbone truncated to `select_layer` LLM layers + flow-matching action head
// (AlternateVLDiT, per-embodiment state/action MLPs). Sizes checked tensor by tensor against the
// model code's own named_parameters() (lerobot 0.6.1's port, measured: see the .cpp).
#pragma once

#include <cstdint>

#include "models/policy_arch.h"

namespace vlac {

struct GrootDims {
  // Qwen3-VL vision tower (Qwen3-VL-2B vision_config)
  int64_t patch_size = 16, temporal_patch = 2, merge = 2, vision_width = 1024, vision_depth = 24,
          vision_mlp = 4096, vision_heads = 16, vision_pos = 2304, vision_out = 2048, deepstack = 3;
  // Qwen3 LLM (text_config), first `select_layer` layers kept. The released N1.7 checkpoint's
  // config (mirrored by lerobot's GR00T_N1_7_DEFAULTS) keeps 16; the Gr00tN1d7Config dataclass
  // default is 12, but fine-tuning loads the checkpoint's config.
  int64_t lm_width = 2048, lm_layers_total = 28, select_layer = 16, lm_heads = 16, lm_kv_heads = 8,
          head_dim = 128, lm_mlp = 6144, vocab = 151936;
  // Action head (checkpoint config: 32 DiT blocks; the dataclass default says 16)
  int64_t dit_layers = 32, dit_heads = 32, dit_head_dim = 48, dit_out = 1024;
  // vl_self_attention: 4 self-attention blocks over the backbone features (checkpoint config's
  // vl_self_attention_cfg; absent from the dataclass), 32 heads x 64, FFN 4x, trained with tune_vlln.
  int64_t vl_sa_layers = 4, vl_sa_heads = 32, vl_sa_head_dim = 64;
  int64_t hidden_size = 1024, input_embedding_dim = 1536, max_state_dim = 132, max_action_dim = 132,
          max_num_embodiments = 32, max_seq_len = 1024, backbone_embedding_dim = 2048;
};

/// The planner's description of GR00T N1.7 for `inputs` (images resized to image_h x image_w).
Result<PolicyArch> groot_policy_arch(const GrootDims& dims, const PolicyInputs& inputs);

}  // namespace vlac
