// pi0.5 from a .vlac package: maps the package, loads engines lazily (program from the manifest,
// weights used in place from the map, each engine on the backend its manifest names, found in
// the backend registry), runs the stages (vision per present camera, text
// embedding, Gemma prefix once per observation, the denoising step N times). Links no model
// builder or partitioner: everything it needs is in the package.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "ir/graph.h"
#include "pi05_spec/pi05_spec.h"
#include "package/package.h"
#include "policy/pi05_observation.h"
#include "policy/pi05_processor.h"
#include "runtime/package_engines.h"

namespace vlac {

struct Pi05PackageOptions {
  int threads = 2;
  /// 0: every engine stays mapped once touched. Otherwise engines are mapped, run and their pages
  /// dropped in turn so that mapped weights + activations stay under this many bytes (weight
  /// streaming: slower, the report says how much was re-read).
  uint64_t mem_budget = 0;
  /// Reorder each engine's Linear weights once into the backend's blocked layout (CPU: oneDNN's;
  /// a copy owned by its executable, Pi05PackageStats::packed_weight_bytes): faster matmuls,
  /// more memory. Not with mem_budget (the copies are not evictable).
  bool pack_weights = false;
  /// Runs every engine on this registry backend ("cuda", "cpu") instead of the manifest's.
  std::string backend;
  /// SigLIP's rounding points (ExecOptions::fast_vision: its attention in the bf16 kernel, fp32
  /// matrices on TF32). Unset: fast for a bf16-all package (its vision matrices are bf16 already,
  /// so lerobot's fp32 vision is not what it runs), exact otherwise.
  std::optional<bool> fast_vision;
  /// The first denoising step of a chunk on a second lane (a GPU's second stream), each expert
  /// layer starting as soon as the prefix LM's engine that makes its K/V is done, beside the
  /// rest of the LM; the other steps after it, as before. Same results. Only where the runtime
  /// has two lanes (the CUDA backend): on by default there (an H100: -0.33 ms a chunk, session
  /// 34; int8 and fp8 -0.6 ms, session 38) except in W8A8 packages (pi05_precision::step_overlap_default:
  /// slower there), off on the CPU. Unset: VLAC_STEP_OVERLAP=0 turns it off, =1 on.
  std::optional<bool> step_overlap;
};

/// What the runtime did, for the report.
struct Pi05PackageStats : PackageRunStats {
  // Latency of the last observation by stage, milliseconds.
  std::vector<double> vision_ms;    // one per present camera
  double text_ms = 0, lm_ms = 0;
  std::vector<double> step_ms;      // one per denoising step
};

class Pi05PackagePolicy {
 public:
  /// Opens and validates the package (no segment byte read), parses the stored config and
  /// processor files. Engines are built on first use.
  static Result<Pi05PackagePolicy> open(const std::string& path, Pi05PackageOptions options = {});

  Pi05PackagePolicy(Pi05PackagePolicy&&) noexcept;
  Pi05PackagePolicy& operator=(Pi05PackagePolicy&&) noexcept;
  ~Pi05PackagePolicy();

  const Package& package() const { return *pkg_; }
  const Pi05Config& config() const { return config_; }
  const Pi05Processor& processor() const { return processor_; }
  bool bf16() const { return bf16_; }
  /// Whether SigLIP runs at the fast rounding points (Pi05PackageOptions::fast_vision, resolved).
  bool fast_vision() const { return fast_vision_; }
  /// Whether run_chunk runs step 0 beside the LM (Pi05PackageOptions::step_overlap, resolved).
  bool step_overlap() const { return step_overlap_; }
  int64_t chunk_size() const { return H_; }
  int64_t max_action_dim() const { return A_; }
  int64_t channels() const { return C_; }
  int64_t image_tokens() const { return n_img_; }
  int64_t steps() const { return steps_; }
  const Pi05PackageStats& stats() const { return stats_; }
  /// Packaged weight bytes (all engines).
  uint64_t weight_bytes() const;

  /// Vision per present camera, text embedding, Gemma prefix (K/V kept for denoise).
  Status run_prefix(const Pi05Observation& obs);
  /// The Euler loop from `noise` [H·A] to `action_normalized` [H·A].
  Status denoise(const float* noise, float* action_normalized);
  /// run_prefix + denoise as one chunk, recorded once per prefix shape and replayed after that
  /// (RunSequence: CUDA graphs on a GPU, run directly on the CPU). Stage times are not measured
  /// inside (stats keep the last eager run's); the only host synchronization is the actions' download.
  Status run_chunk(const Pi05Observation& obs, const float* noise, float* action_normalized);
  uint64_t chunk_replays() const { return seq_ ? seq_->replays() : 0; }
  /// The engines' backend runtime and its device line.
  BackendRuntime& runtime() const { return engines_->runtime(); }
  std::string device_description() const { return engines_->device_description(); }

  /// True when the package file was replaced on disk since open (this object keeps the old one).
  bool replaced_on_disk() const { return pkg_->replaced_on_disk(); }
  /// Opens what the path names now, with the same options; this object is unchanged.
  Result<Pi05PackagePolicy> reopen() const { return open(pkg_->path(), options_); }

 private:
  using Slot = PackageValue;
  Pi05PackagePolicy() = default;
  Status load_manifest();
  Status run_stage(const std::string& stage, std::map<std::string, Slot>* values, bool mark_outputs = false);
  Status stage_observation(const Pi05Observation& obs);  // host staging of images and tokens
  Status enqueue_prefix();                               // vision, text, lm (timed unless recording_)
  Status enqueue_denoise();                              // the Euler loop from the staged noise
  Status buffer(std::unique_ptr<BackendBuffer>* b, uint64_t bytes, MemoryKind kind, const char* what);
  double stage_done(std::chrono::steady_clock::time_point t0);  // ms, after the stage's work finished

  Pi05PackageOptions options_;
  std::unique_ptr<Package> pkg_;
  Pi05Config config_;
  Pi05Processor processor_;
  bool bf16_ = false;
  bool fast_vision_ = false;
  int64_t H_ = 0, A_ = 0, C_ = 3, R_ = 0, n_img_ = 0, W_ = 0, depth_ = 0, steps_ = 10;
  float dt_ = -0.1f;
  std::unique_ptr<PackageEngines> engines_;
  Pi05PackageStats stats_;
  // Buffers the runtime owns between stages, from the engines' backend: Host staging
  // (page-locked on a GPU) for what the host writes, the engines' memory for what they exchange.
  std::unique_ptr<BackendBuffer> images_;  // the present cameras' images [N, C, R, R], one after another
  bool vision_batched_ = false;            // the vision engine takes all N at once (image [N,C,R,R])
  std::unique_ptr<BackendBuffer> tokens_, prefix_pos_, suffix_pos_, times_, noise_;  // Host
  std::unique_ptr<BackendBuffer> embeddings_, x_;  // engines' memory
  // The positions and the Euler times in the engines' memory where that is not the host's: bound
  // in place, uploaded when the prefix length changes, so a recorded chunk holds no copy of them
  // (it held three small host-to-device copies per step). Null on the CPU.
  std::unique_ptr<BackendBuffer> prefix_pos_dev_, suffix_pos_dev_, times_dev_;
  int64_t staged_prefix_ = -1;  // the prefix length the positions and times were written for
  int64_t n_cams_ = 0, n_text_ = 0;
  std::map<std::string, Slot> prefix_kv_;  // prefix.k.<l>/prefix.v.<l>, in engines_' buffers
  int64_t prefix_len_ = 0;
  bool recording_ = false;  // inside run_chunk's body: no timing, no synchronization
  bool step_overlap_ = false;  // Pi05PackageOptions::step_overlap, resolved (run_chunk only)
  int lm_fork_mark_ = -1;      // lane 0's mark before the LM, where step 0's lane starts
  std::unique_ptr<RunSequence> seq_;
  uint64_t seq_key_ = 0;
};

}  // namespace vlac
