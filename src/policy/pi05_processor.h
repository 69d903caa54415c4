// lerobot's saved pi0.5 processor pipelines (policy_preprocessor.json / policy_postprocessor.json,
// their stats files, tokenizer/tokenizer.model) parsed into one spec, plus the pure steps it
// drives: (un)normalization, the discretized-state prompt, the relative-action mask.
// Reads bytes by file name (folders and .vlac packages alike); never touches model weights.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "policy/tokenizer.h"

namespace vlac {

/// lerobot's NormalizationMode.
enum class NormMode { Identity, MeanStd, MinMax, Quantiles, Quantile10 };
const char* norm_mode_name(NormMode m);

/// One normalizer / unnormalizer step (lerobot's _NormalizationMixin): float32 arithmetic in
/// lerobot's operation order; a zero range (q99 == q01, max == min) becomes eps; MEAN_STD
/// divides by std + eps. A key without stats, or a mode IDENTITY, passes unchanged.
struct Pi05Normalizer {
  struct Feature {
    std::string type;            // "STATE", "ACTION", "VISUAL", ...
    std::vector<int64_t> shape;
  };
  float eps = 1e-8f;
  std::map<std::string, Feature> features;                            // by feature key
  std::map<std::string, NormMode> norm_map;                           // by feature type
  std::optional<std::vector<std::string>> normalize_observation_keys;  // lerobot option
  std::map<std::string, std::map<std::string, std::vector<float>>> stats;  // key -> stat -> values
  std::string origin;  // "<dir>/policy_preprocessor.json (normalizer_processor)" for messages

  /// The mode applied to `key` of feature type `type` (Identity when no stats exist for it).
  NormMode mode_for(const std::string& key, const std::string& type) const;
  /// (Un)normalizes `values` in place. The n values are laid out [..., axis_len, inner]: value i
  /// takes stat index (i / inner) % axis_len; the stats must hold axis_len values or one
  /// (broadcast). inner = H·W applies per-channel image stats. Errors name the key, the stat
  /// and the file.
  Status apply(const std::string& key, const std::string& type, float* values, size_t n, bool inverse,
               size_t axis_len, size_t inner = 1) const;
};

/// The tokenizer step's settings (lerobot TokenizerProcessorStep).
struct Pi05TokenizerStep {
  std::string task_key = "task";
  std::string tokenizer_name;
  TokenizeOptions options;
};

/// Everything vlac needs from the processor files of one pi0.5 policy. Owns its data (stats
/// copied, tokenizer parsed); copyable (the tokenizer is shared, read-only).
struct Pi05Processor {
  std::string origin;  // folder or package the files came from

  // Preprocessor (present when policy_preprocessor.json was there).
  bool has_preprocessor = false;
  std::map<std::string, std::string> rename_map;  // robot key -> policy key
  bool relative_step = false;                      // relative_actions_processor present
  bool relative_enabled = false;
  std::vector<std::string> exclude_joints;
  std::optional<std::vector<std::string>> action_names;
  std::optional<Pi05Normalizer> normalizer;
  bool state_prompt = false;                       // pi05_prepare_state_tokenizer_processor_step
  std::string state_prompt_task_key = "task";
  std::optional<Pi05TokenizerStep> tokenizer_step;
  std::shared_ptr<const Tokenizer> tokenizer;      // tokenizer/tokenizer.model, or set_tokenizer

  // Postprocessor (present when policy_postprocessor.json was there).
  bool has_postprocessor = false;
  std::optional<Pi05Normalizer> unnormalizer;
  bool absolute_enabled = false;

  bool empty() const { return !has_preprocessor && !has_postprocessor; }
  /// Replaces the tokenizer (vlac run --tokenizer PATH).
  void set_tokenizer(Tokenizer t) { tokenizer = std::make_shared<const Tokenizer>(std::move(t)); }
  /// lerobot's RelativeActionsProcessorStep._build_mask: false for an action whose name equals
  /// or contains (case-insensitive) an excluded joint; all true without names or exclusions.
  std::vector<bool> relative_mask(int64_t action_dim) const;
};

/// The processor files of a policy, by relative name ("policy_preprocessor.json",
/// "tokenizer/tokenizer.model", ...). Spans only need to live during parse_pi05_processor.
struct ProcessorFiles {
  std::map<std::string, std::span<const uint8_t>> files;
  std::string origin;  // folder or package path, for messages
};

inline constexpr const char* kPi05PreprocessorJson = "policy_preprocessor.json";
inline constexpr const char* kPi05PostprocessorJson = "policy_postprocessor.json";
inline constexpr const char* kPi05TokenizerModel = "tokenizer/tokenizer.model";

/// Parses the processor spec. No preprocessor/postprocessor JSON → an empty processor (no
/// processing). A step vlac cannot honour is Unsupported; a JSON or stats file that breaks
/// lerobot's rules is InvalidFormat; a stats file the JSON names but `files` lacks is NotFound.
Result<Pi05Processor> parse_pi05_processor(const ProcessorFiles& in);

/// Relative names of the files of `policy_dir` that belong to the processor and that vlac
/// reads: the two pipeline JSONs, each stats file they name (`state_file`), and
/// tokenizer/tokenizer.model; only those that exist. What a packager copies.
std::vector<std::string> pi05_processor_file_names(const std::string& policy_dir);

/// Reads those files of `policy_dir` and parses them (an empty processor if there are none).
Result<Pi05Processor> load_pi05_processor(const std::string& policy_dir);

// --- pi05_prepare_state_tokenizer_processor_step, piece by piece -----------------------------

/// lerobot's task cleaning: Python str.strip() (Unicode whitespace), then "_" -> " " and
/// "\n" -> " ". No lower-casing.
std::string pi05_clean_task(std::string_view task);
/// np.digitize(s, linspace(-1, 1, 257)[:-1]) - 1 per element, in double: -1 below -1, 255 at
/// or above 1 - 1/128 (and for NaN, as numpy).
std::vector<int> pi05_discretize_state(const float* normalized, size_t n);
/// "Task: <cleaned task>, State: <b0> <b1> ...;\nAction: ".
std::string pi05_prompt(std::string_view task, const std::vector<int>& bins);

}  // namespace vlac
