// SmolVLA's architecture as a table (lerobot `smolvla`, spec 7.2): SmolVLM2-500M truncated to its
// first 16 text layers (SigLIP-B/16 at 512 px, pixel-shuffle connector) + a 0.75x-wide Llama action
// expert that alternates joint self-attention and cross-attention. Holds no data.
#pragma once

#include <cstdint>

#include "models/policy_arch.h"

namespace vlac {

struct SmolVlaDims {
  // SigLIP-B/16 (SmolVLM2 vision tower)
  int64_t image_size = 512, patch_size = 16, vision_width = 768, vision_depth = 12, vision_mlp = 3072,
          vision_heads = 12;
  int64_t shuffle_factor = 4;  // pixel shuffle: (512/16)^2 = 1024 patches -> 64 tokens x 12288
  // SmolLM2 text model, first `text_layers` of 32 kept
  int64_t text_width = 960, text_layers = 16, text_heads = 15, text_kv_heads = 5, head_dim = 64,
          text_mlp = 2560, vocab = 49280;
  // Action expert: width 0.75 x 960, FFN from lerobot's get_intermediate_size(720) = 2048
  int64_t expert_width = 720, expert_mlp = 2048, expert_layers = 16;
  int64_t self_attn_every_n_layers = 2;  // even layers: joint self-attention; odd: cross-attention
  int64_t max_state_dim = 32, max_action_dim = 32;

  int64_t patches_per_image() const { return (image_size / patch_size) * (image_size / patch_size); }
  int64_t tokens_per_image() const { return patches_per_image() / (shuffle_factor * shuffle_factor); }
  Status validate() const;
};

/// The planner's description of SmolVLA for `inputs` (images are resized-with-pad to
/// dims.image_size whatever the camera size; inputs.image_h overrides the resize target).
Result<PolicyArch> smolvla_policy_arch(SmolVlaDims dims, const PolicyInputs& inputs);

}  // namespace vlac
