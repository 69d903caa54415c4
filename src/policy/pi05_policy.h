// pi0.5 as a runnable policy: observation file in, normalized action chunk out. Glues the model
// builder (graphs on meta) to a backend's executables (through the seam, ir/backend.h; the CPU
// by default): prefix once per observation, then the Euler loop over the step graph with no
// allocation inside the loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "ir/backend.h"
#include "models/pi05_builder.h"
#include "policy/pi05_observation.h"

namespace vlac {

/// Weight precision at run time. Bf16 mirrors lerobot's dtype=bfloat16 split: the Gemma
/// projections and the embedding run in bf16 (fp32 accumulation); SigLIP, the projector, norm
/// weights, adaRMS denses and the flow-matching heads stay fp32. Activations stay fp32.
enum class Pi05Precision { FromConfig, Fp32, Bf16 };

struct Pi05PolicyOptions {
  Pi05Precision precision = Pi05Precision::FromConfig;
  int threads = 2;
  bool record_intermediates = false;  // keep every intermediate for --dump-intermediates
  bool pack_weights = false;  // ExecOptions::pack_weights (a packed copy of the weights)
  /// ExecOptions::linear_observer: every Linear's fp32 input rows (compile's --calibrate run).
  std::function<void(const std::string& weight, const float* x, int64_t rows, int64_t k)> linear_observer;
  std::string backend = "cpu";  // registry name (backends/registry.h)
  /// SigLIP in a bf16-mode run (ignored in fp32). Lerobot keeps it fp32 (the default, which
  /// matches lerobot's bf16 fixtures); the others are explicit opt-ins that leave lerobot's
  /// rounding points in the vision tower for speed: Tf32 = its fp32 GEMMs on TF32 tensor cores
  /// and its attention in the bf16 kernel (ExecOptions::fast_vision); Bf16 = also its matrices
  /// stored and multiplied in bf16 (0.8 GiB less device memory at full size).
  enum class Vision { Fp32, Tf32, Bf16 };
  Vision vision = Vision::Fp32;
};

/// The observation of `path` for this model (see policy/pi05_observation.h), without a
/// processor: pre-tokenized prompts only; token ids checked against the vocabulary.
Result<Pi05Observation> read_pi05_observation(const std::string& path, const Pi05Model& model);

/// Reads `noise` [chunk_size, max_action_dim] (or [1, H, A]) float32 from a safetensors file.
Result<std::vector<float>> read_pi05_noise(const std::string& path, const Pi05Model& model);
/// The same for a chunk of [chunk_size, max_action_dim] (packages: no Pi05Model).
Result<std::vector<float>> read_pi05_noise(const std::string& path, int64_t chunk_size, int64_t max_action_dim);

/// Standard normal noise from a seed: splitmix64 stream -> two uniforms u1 in (0,1], u2 in
/// [0,1) (53-bit) -> Box-Muller pair sqrt(-2 ln u1)·(cos 2πu2, sin 2πu2), computed in double,
/// rounded to float32. Deterministic on every platform.
std::vector<float> pi05_gaussian_noise(uint64_t seed, int64_t n);

/// Named tensors recorded during a run (names as the lerobot fixtures' expected.safetensors).
struct Pi05Intermediates {
  struct Tensor {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Tensor> tensors;
  void add_f32(const std::string& name, std::vector<int64_t> shape, const float* data);
  /// Writes every tensor to one safetensors file (atomically).
  Status write(const std::string& path) const;
};

class Pi05Policy {
 public:
  /// Loads the policy folder: builds and checks the graphs, binds (and, for bf16, converts)
  /// the weights. Nothing is planned for activations until the first observation.
  static Result<Pi05Policy> load(const std::string& policy_dir, Pi05PolicyOptions options = {});

  Pi05Policy(Pi05Policy&&) noexcept = default;
  Pi05Policy& operator=(Pi05Policy&&) noexcept = default;

  const Pi05Model& model() const { return *model_; }
  bool bf16() const { return bf16_; }
  const BoundWeights& weights() const { return *weights_; }

  /// Runs the prefix (vision, projector, Gemma K/V cache) for one observation. Plans new
  /// executors only when the prefix shape (present cameras, valid tokens) changes.
  Status run_prefix(const Pi05Observation& obs);
  /// The flow-matching loop from `noise` [H·A] to `action_normalized` [H·A] over the cached
  /// prefix. No heap allocation (unless recording intermediates).
  Status denoise(const float* noise, float* action_normalized);
  /// run_prefix + denoise as one chunk recorded once per prefix shape and replayed after that
  /// (RunSequence: CUDA graphs on a GPU; the CPU runs it directly, with the same results). The
  /// only host synchronization is the download of the actions. Not with record_intermediates.
  Status run_chunk(const Pi05Observation& obs, const float* noise, float* action_normalized);
  /// Chunks replayed from a recording (run_chunk).
  uint64_t chunk_replays() const { return seq_ ? seq_->replays() : 0; }

  /// Bytes of activation arenas + input buffers of the current executors.
  uint64_t activation_bytes() const;
  const Pi05Intermediates& intermediates() const { return dump_; }

 private:
  Pi05Policy() = default;
  Status plan_for(const Pi05PrefixShape& shape);
  // Host-side staging of an observation (images in SigLIP's range, tokens) into Host buffers.
  Status stage_observation(const Pi05Observation& obs);
  // The device work of a prefix / of the Euler loop from the staged noise (no host sync).
  Status enqueue_prefix();
  Status enqueue_denoise();
  Status download(void* dst, const void* src, uint64_t bytes);
  Status dump_value(const Executable& e, const std::string& name, std::vector<int64_t> shape, ir::ValueId v);

  Pi05PolicyOptions options_;
  bool bf16_ = false;
  std::unique_ptr<Pi05Model> model_;
  Backend* backend_ = nullptr;  // from the registry (process lifetime)
  std::unique_ptr<BoundWeights> weights_;
  std::optional<Pi05PrefixShape> planned_;
  std::unique_ptr<Executable> prefix_;
  std::unique_ptr<Executable> step_;
  std::vector<std::pair<std::string, ir::ValueId>> prefix_outputs_;  // of the planned graphs
  std::vector<std::pair<std::string, ir::ValueId>> step_outputs_;
  std::vector<int> step_prefix_inputs_;  // step input index of prefix.k.0, prefix.v.0, k.1, ...
  int step_x_ = -1, step_t_ = -1;
  ir::ValueId step_x_next_ = ir::kNone, step_velocity_ = ir::kNone;
  // Host staging buffers of this backend (page-locked on a GPU): per present camera, tokens,
  // noise, and the Euler times (one float per step, written once per plan).
  std::vector<std::unique_ptr<BackendBuffer>> image_stage_;
  std::unique_ptr<BackendBuffer> tokens_stage_, noise_stage_, times_;
  std::vector<int> image_inputs_;
  int prefix_tokens_ = -1;
  int64_t staged_tokens_ = 0;
  std::unique_ptr<RunSequence> seq_;
  Pi05Intermediates dump_;
};

}  // namespace vlac
