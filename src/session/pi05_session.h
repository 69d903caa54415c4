// One pi0.5 policy, opened from a lerobot policy folder or a .vlac package, behind one call:
// an observation (tensors in memory) in, the action chunk in robot units out, through exactly
// the code `vlac run` uses (read_pi05_observation, run_prefix, denoise, postprocess_pi05_action),
// so the actions are bit-identical to `vlac run` on the same inputs. What the Python binding
// (python/src/module.cpp: vlac.Policy) and `vlac serve` call. Thread-safe: one call at a time
// per session (a mutex); different sessions run in parallel.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "pi05_spec/pi05_spec.h"
#include "policy/pi05_observation.h"
#include "policy/pi05_processor.h"

namespace vlac {

struct Pi05SessionOptions {
  /// vlac run --device's policy (runtime/device_choice.h, the same code): "cpu", "cuda" (an
  /// error without a CUDA build or a GPU), "auto" (cuda when it sees a GPU, else the CPU), or ""
  /// (vlac run's default: a folder on the CPU, a package on its manifest's backends). A named
  /// device re-binds a package's engines to it, whatever backend it was compiled for.
  std::string device = "auto";
  /// "" (the config's / the package's), "fp32"/"float32", "bf16"/"bfloat16".
  std::string dtype;
  int threads = 2;
  std::string tokenizer;      // a tokenizer.model (or folder) replacing the policy's, "" = its own
  bool pack_weights = false;  // as vlac run --pack-weights
  uint64_t seed = 0;          // noise of call k (when none is given): pi05_gaussian_noise(seed + k)
};

/// What a caller needs to know about the policy (for lerobot's config fields and the server's
/// checks of a client's setup).
struct Pi05SessionInfo {
  std::string path;
  std::string kind;    // "folder" or "package"
  std::string device;  // backend it runs on ("cpu", ...)
  std::string dtype;   // "fp32" or "bf16"
  int64_t chunk_size = 0, n_action_steps = 0, max_action_dim = 0, max_state_dim = 0;
  int64_t action_dim = 0;  // width of the robot-unit action (postprocessor, else config, else max)
  int64_t state_dim = 0;   // the processor's observation.state feature (0 when unknown)
  int64_t image_resolution = 0, channels = 3, num_inference_steps = 0;
  std::vector<std::string> cameras;  // policy camera keys (config order, empty_camera_* left out)
  std::vector<std::vector<int64_t>> camera_shapes;  // their VISUAL feature shapes ([] if unknown)
  bool has_preprocessor = false, has_postprocessor = false;
  std::string task_key = "task";
};

struct Pi05SessionOutput {
  std::vector<float> action;             // [chunk_size, action_dim], robot units
  std::vector<float> action_normalized;  // [chunk_size, max_action_dim]
  int64_t action_dim = 0;
  std::string prompt;                    // the prompt built (empty when pre-tokenized)
  uint64_t seed = 0;                     // the seed of the noise used (when none was given)
  bool seeded = false;
  double preprocess_ms = 0, prefix_ms = 0, denoise_ms = 0, postprocess_ms = 0;
};

class Pi05Session {
 public:
  /// Opens a policy folder or a .vlac package (by magic, as vlac run decides).
  static Result<std::unique_ptr<Pi05Session>> open(const std::string& path, const Pi05SessionOptions& options);
  ~Pi05Session();

  const Pi05SessionInfo& info() const { return info_; }

  /// One observation -> one chunk. `task` overrides the observation's "task" metadata when not
  /// empty (as vlac run --task). `noise` is [chunk_size · max_action_dim] floats or null (then
  /// the seeded stream: call k of this session uses seed + k). Bad input is a Status with exit
  /// code 2 and vlac run's message (src.origin where the file path stands).
  Status predict(const ObsSource& src, const std::string& task, const float* noise, Pi05SessionOutput* out);

  /// Calls that drew seeded noise so far.
  uint64_t noise_calls() const { return noise_calls_; }

 private:
  struct Impl;
  Pi05Session() = default;
  std::unique_ptr<Impl> impl_;
  Pi05SessionInfo info_;
  Pi05SessionOptions options_;
  uint64_t noise_calls_ = 0;
  std::mutex mu_;
};

}  // namespace vlac
