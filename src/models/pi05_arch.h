// pi0.5's architecture as a table: every checkpoint tensor (lerobot's name, shape, part of the
// model, whether inference reads it) derived from a handful of dimensions. The model builder,
// the demo/full-size checkpoint writers and the training-memory planner all read this one
// table (llama.cpp's per-architecture name table). Holds no data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace vlac {

enum class Pi05Part : uint8_t { Vision, Projector, Language, Expert, Heads, LmHead };
const char* pi05_part_name(Pi05Part part);

/// How a checkpoint names and stores the embedding: lerobot's save_pretrained of a fine-tune
/// ("model." prefix; embed_tokens and both lm_heads present) or the converted base
/// (lerobot/pi05_base: no prefix; paligemma.lm_head doubles as the embedding; expert lm_head).
enum class Pi05Layout : uint8_t { FineTune, Base };

struct Pi05Dims {
  // SigLIP vision tower
  int64_t image_size = 224;
  int64_t patch_size = 14;
  int64_t channels = 3;
  int64_t vision_width = 1152;
  int64_t vision_depth = 27;
  int64_t vision_mlp = 4304;
  int64_t vision_heads = 16;  // not visible in shapes: config key vision_num_attention_heads
  // Gemma VLM (PaliGemma language model)
  int64_t lm_width = 2048;
  int64_t lm_depth = 18;
  int64_t lm_mlp = 16384;
  int64_t head_dim = 256;
  int64_t lm_heads = 8;
  int64_t kv_heads = 1;
  int64_t vocab = 257152;
  // Action expert (same depth and attention geometry as the VLM)
  int64_t expert_width = 1024;
  int64_t expert_mlp = 4096;
  int64_t expert_heads = 8;
  // Flow-matching heads
  int64_t max_action_dim = 32;

  int64_t patches_per_image() const { return (image_size / patch_size) * (image_size / patch_size); }
  /// The released sizes (PaliGemma-3B + gemma_300m expert).
  static Pi05Dims full();
  /// Small sizes with the real structure, for the demo policy and tests.
  static Pi05Dims demo();
  /// Checks the relations the architecture needs (positive sizes, patch divides image, ...).
  Status validate() const;
};

struct WeightSpec {
  std::string name;            // full checkpoint key (with "model." for FineTune)
  std::vector<int64_t> shape;  // PyTorch layout, Linear weights [out, in]
  Pi05Part part;
  bool read_at_inference;      // false: lm_heads, final VLM norm, last VLM layer's q/o/MLP/post-norm
  uint64_t numel() const;
};

/// Every tensor a lerobot pi0.5 checkpoint of this layout holds, in a stable order.
std::vector<WeightSpec> pi05_weights(const Pi05Dims& dims, Pi05Layout layout);

/// Sizes lerobot fixes by variant name ("gemma_2b", "gemma_300m"; "_lora" suffixes accepted).
Status apply_pi05_variants(const std::string& paligemma_variant, const std::string& expert_variant,
                           Pi05Dims* dims);

/// Dimensions a lerobot config.json implies (variants, image_resolution, max_action_dim,
/// optional vision_num_attention_heads). Tensor shapes, where a checkpoint exists, win.
Result<Pi05Dims> pi05_dims_from_config(const nlohmann::json& config, const std::string& path);

/// A config.json in lerobot's format for a pi0.5 policy with these sizes (used by writers of
/// demo and test policies). Camera names are "cam0".., images `image_size` square.
nlohmann::json pi05_config_json(const Pi05Dims& dims, int n_cameras, int state_dim, int action_dim,
                                int chunk_size = 50, int num_inference_steps = 10);

}  // namespace vlac
