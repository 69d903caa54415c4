// What a pi0.5 policy is, independent of how its graphs are built: lerobot's config.json
// (Pi05Config), the prefix shape of one observation, the Euler loop's times, and the names of
// the stage graphs' inputs and outputs. The runtime and the observation/processor code need only
// this; the model builder (models/pi05_builder) builds on it. Depends on core and io only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace vlac {

/// What config.json says (lerobot's PI05Config; missing keys take lerobot's defaults).
struct Pi05Config {
  int64_t chunk_size = 50;
  int64_t n_action_steps = 50;
  int64_t num_inference_steps = 10;
  int64_t max_state_dim = 32;
  int64_t max_action_dim = 32;
  int64_t tokenizer_max_length = 200;
  int64_t empty_cameras = 0;
  int64_t image_resolution = 224;
  int64_t action_dim = 0;          // output_features.action.shape[0]; 0 when absent
  int64_t vision_heads = 16;       // optional key vision_num_attention_heads (So400m: 16)
  double min_period = 4e-3;
  double max_period = 4.0;
  std::string dtype = "float32";   // "float32" or "bfloat16"
  /// Camera observation keys ("observation.images.<cam>"): the VISUAL input features in
  /// config order, then lerobot's "observation.images.empty_camera_<i>" (always absent).
  std::vector<std::string> cameras;
};

/// Parses config.json (`path` names it in errors). Unknown keys are ignored; features vlac
/// cannot honour (use_visual_memory, use_proprioceptive_memory, rtc_config) are Unsupported.
Result<Pi05Config> parse_pi05_config(const std::string& path);
/// The same from the file's text (e.g. a copy stored in a .vlac package); `path` names it.
Result<Pi05Config> parse_pi05_config_text(std::string_view text, const std::string& path);

/// The shape of one observation's compact prefix: the cameras present (config order) and the
/// number of valid (unpadded) prompt tokens. Masked cameras and padding are dropped.
struct Pi05PrefixShape {
  std::vector<std::string> cameras;  // observation keys, a subset of config().cameras in order
  int64_t n_text = 0;
};

/// The Euler flow-matching loop around the step graph: x ← x + dt·v for k = 0..steps-1 with
/// t_k = float32(1 + k·dt_double) and dt = float32(-1/steps) (lerobot, bit for bit).
struct Pi05EulerSpec {
  int64_t steps = 10;
  float dt = -0.1f;
  /// t of step k.
  float time(int64_t k) const;
};

/// Graph input names.
inline constexpr const char* kPi05InTokens = "tokens";                 // i64[n_text]
inline constexpr const char* kPi05InPrefixPos = "prefix.positions";    // i64[P]
inline constexpr const char* kPi05InX = "x";                           // f32[H, A]
inline constexpr const char* kPi05InTime = "t";                        // f32[1]
/// The denoise step's time condition (a node name; a partitioned engine reads it as "%N:cond").
/// With kPi05InTime, what the step's time-only part depends on: ExecutorOptions::memo_inputs.
inline constexpr const char* kPi05Cond = "cond";
inline constexpr const char* kPi05InSuffixPos = "suffix.positions";    // i64[H]
/// Stage graphs (what `vlac compile` partitions into engines): one camera's vision tower +
/// projector, the text embedding, the Gemma prefix layers over ready embeddings.
inline constexpr const char* kPi05InImage = "image";                       // f32[C, R, R] in [-1, 1]
inline constexpr const char* kPi05OutImageTokens = "image_tokens";         // f32[n_img, W]
inline constexpr const char* kPi05OutTextEmbeddings = "text_embeddings";   // f32[n_text, W]
inline constexpr const char* kPi05InPrefixEmbeddings = "prefix.embeddings";  // f32[P, W]
/// "image.<observation key>": f32[C, R, R] in [-1, 1].
std::string pi05_image_input(const std::string& camera_key);

}  // namespace vlac
