// One pi0.5 observation read from a safetensors file and brought to what the network takes
// (lerobot's preprocessor + the model's image preparation), and the chunk brought back to robot
// units (lerobot's postprocessor). Independent of the weights: usable by folder and package runs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "pi05_spec/pi05_spec.h"
#include "policy/pi05_processor.h"

namespace vlac {

/// One observation, checked against the policy. Images are float32 CHW in [0, 1] at the
/// configured resolution; only present cameras (config order) and valid prompt tokens remain.
struct Pi05Observation {
  std::vector<std::string> cameras;        // present camera keys, config order
  std::vector<std::vector<float>> images;  // [C, R, R] per present camera, values in [0, 1]
  std::vector<int64_t> tokens;             // tokens whose attention mask is true, in order
  // What the preprocessor saw and made (empty where it did not run):
  std::vector<float> state_raw;            // [S] observation.state as read (relative actions need it)
  std::vector<float> state_normalized;     // [S] after the normalizer (what the prompt discretizes)
  std::string prompt;                      // the prompt vlac built (empty when pre-tokenized)
  std::vector<int64_t> lang_tokens;        // [L] tokenizer output incl. padding (when tokenized here)
  std::vector<uint8_t> lang_mask;          // [L]
};

/// One tensor of an observation held in memory (a safetensors entry, or an array a caller owns:
/// the Python binding points into numpy buffers). Row-major, C-contiguous, not owned; `bytes`
/// must hold numel × dtype_size(dtype) bytes.
struct ObsTensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* bytes = nullptr;
  uint64_t nbytes() const;
};

/// An observation's tensors and string metadata by key, whatever held them. `origin` names the
/// observation in every message (the file path for `vlac run`).
struct ObsSource {
  std::string origin;
  std::map<std::string, ObsTensor> tensors;
  std::map<std::string, std::string> metadata;  // e.g. "task" (a safetensors __metadata__ entry)
  const ObsTensor* find(const std::string& key) const;
};

/// Reads lerobot's observation keys from a safetensors file (tensors with or without a leading
/// batch dim of 1; keys renamed by the preprocessor's rename_map first):
///  - `observation.images.<cam>`: float32 CHW in [0, 1] or uint8 HWC (or CHW) frames of any
///    size; uint8 becomes x/255; resized with pad to `cfg.image_resolution` unless already that
///    size (lerobot's _preprocess_images). A configured camera absent from the file is masked.
///  - `observation.language.tokens` (int64/int32 [L]) + `.attention_mask` (bool/int [L]): a
///    pre-tokenized prompt; it takes precedence over building one.
///  - otherwise the prompt is built as lerobot's preprocessor does: `observation.state`
///    (float32 [S]) normalized with the processor's stats, discretized into 256 bins, with the task
///    (`task_override` if not empty, else OBS `__metadata__` key "task"), tokenized with
///    `proc->tokenizer` (BOS, truncation, padding to max_length).
/// `proc` may be null or empty (no processor files): then only pre-tokenized prompts work.
/// Errors name the file and the key; bad input is a 1xx code (CLI exit 2).
/// `vocab` > 0 checks every valid token id against the embedding table's rows.
Result<Pi05Observation> read_pi05_observation(const std::string& obs_path, const Pi05Config& cfg, int64_t channels,
                                              const Pi05Processor* proc, const std::string& task_override,
                                              int64_t vocab = 0);
/// The same over tensors already in memory (same checks, same messages, with src.origin where
/// the file path stands): the path `vlac run` takes once the file is mapped.
Result<Pi05Observation> read_pi05_observation(const ObsSource& src, const Pi05Config& cfg, int64_t channels,
                                              const Pi05Processor* proc, const std::string& task_override,
                                              int64_t vocab = 0);

/// lerobot's postprocessor on `action_normalized` [H, A]: crop to the real action dim
/// (`cfg.action_dim`, else the unnormalizer's action feature, else A), un-normalize, then add
/// the raw state on the relative dims when absolute_actions_processor is enabled. Returns
/// `action` [H, action_dim]; *action_dim receives the width. `proc` must not be null.
Result<std::vector<float>> postprocess_pi05_action(const float* action_normalized, int64_t H, int64_t A,
                                                   const Pi05Config& cfg, const Pi05Processor& proc,
                                                   const Pi05Observation& obs, int64_t* action_dim);

/// What `vlac run` writes to OUT (atomically): `action_normalized` [H, A] and, when `proc` has a
/// postprocessor, `action` [H, action_dim] from postprocess_pi05_action; metadata producer, dtype
/// and the prompt built. *action_dim receives the width of `action` (0 when not written).
Status write_pi05_run_output(const std::string& out, const float* action_normalized, int64_t H, int64_t A,
                             const Pi05Config& cfg, const Pi05Processor& proc, const Pi05Observation& obs,
                             bool bf16, int64_t* action_dim);

}  // namespace vlac
