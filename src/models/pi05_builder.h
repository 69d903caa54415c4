// pi0.5 model builder: reads a lerobot policy folder (config.json + safetensors), binds the
// weights by lerobot's names, takes every size from the tensor shapes and builds the IR graphs
// (prefix pass, one denoising step) on meta. Never reads weight bytes; never runs anything.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "io/safetensors.h"
#include "ir/graph.h"
#include "models/pi05_arch.h"
#include "pi05_spec/pi05_spec.h"

namespace vlac {

/// A graph plus names for its outputs (prefix.k.<l>, velocity, ...).
struct Pi05Graph {
  ir::Graph graph;
  std::vector<std::pair<std::string, ir::ValueId>> outputs;  // graph outputs, by name
  ir::ValueId output(const std::string& name) const;         // ir::kNone if absent
};

class Pi05Model {
 public:
  /// Opens POLICY_DIR (config.json + model.safetensors[.index.json]), binds and checks every
  /// weight inference reads (builds both graphs once). Errors name the file and the tensor.
  static Result<Pi05Model> load(const std::string& policy_dir);

  Pi05Model(Pi05Model&&) noexcept = default;
  Pi05Model& operator=(Pi05Model&&) noexcept = default;

  const Pi05Config& config() const { return config_; }
  /// Sizes read from the tensors (image_size from the config; vision_heads from the config).
  const Pi05Dims& dims() const { return dims_; }
  int64_t image_tokens() const { return n_img_; }
  const TensorSet& tensors() const { return *tensors_; }
  const std::string& policy_dir() const { return dir_; }
  Pi05EulerSpec euler() const;

  /// Prefix pass: per camera SigLIP + projector, text embedding × sqrt(W), Gemma layers
  /// (the last one only norm + K + V). Outputs prefix.k.<l> / prefix.v.<l> [P, 1, head_dim]
  /// (post-RoPE). With `debug`, also vision_out.<cam>, image_tokens.<cam>, prefix.embeddings
  /// and prefix_hidden.<l> (all but the last layer).
  Result<Pi05Graph> build_prefix(const Pi05PrefixShape& shape, bool debug = false) const;
  /// One denoising step over a prefix of `prefix_len` tokens: inputs x, t, suffix.positions,
  /// prefix.k.<l>, prefix.v.<l>; outputs velocity [H, A] and x_next = x + dt·velocity. With
  /// `debug`, also cond, action_tokens and expert_hidden.<l>.
  Result<Pi05Graph> build_step(int64_t prefix_len, bool debug = false) const;
  /// Stage graphs: the same arithmetic as build_prefix, cut where the runtime assembles the
  /// prefix (images of the present cameras, then the valid tokens). build_lm's reshapes use -1,
  /// so ir::respecialize can give it any prefix length; build_text_embed likewise any count.
  /// Vision of one image [C,R,R] -> image_tokens [P, W] (images = 0), or of `images` camera
  /// images at once: input [N,C,R,R] (any N after respecialize), output [N·P, W], attention
  /// within each image (BackendCompiler::prefers_batched_images).
  Result<Pi05Graph> build_vision(int64_t images = 0) const;
  Result<Pi05Graph> build_text_embed(int64_t n_text) const;
  Result<Pi05Graph> build_lm(int64_t prefix_len) const;

  /// The prefix shape with every configured camera and all tokenizer_max_length tokens
  /// (what `vlac inspect --graph` shows).
  Pi05PrefixShape nominal_prefix() const;

  /// True when lerobot's dtype=bfloat16 mode holds this weight in bf16 (everything under
  /// paligemma_with_expert except the vision tower, the projector and the norm weights /
  /// adaRMS denses); the flow-matching heads stay fp32.
  static bool lerobot_bf16_weight(const std::string& name);
  /// The dtype the CPU backend runs weight `ref` in (F32 or BF16), folder and package alike:
  /// BF16 for lerobot's bf16 matrices and the embedding table when `bf16` (a BF16 table stays
  /// BF16), else F32. A folder run keeps an F32 table mapped and rounds gathered rows
  /// (gather_only_weight), a package stores it converted: the same bits either way.
  /// `vision_bf16` (Pi05PolicyOptions::Vision::Bf16, beyond lerobot) adds SigLIP's matrices.
  static DType run_dtype(const ir::WeightRef& ref, bool bf16, bool vision_bf16 = false);
  /// SigLIP's and the projector's Linear matrices (which lerobot's bf16 mode keeps fp32).
  static bool vision_weight(const std::string& name);
  /// The embedding table (only looked-up rows are ever read).
  static bool gather_only_weight(const std::string& name);

 private:
  Pi05Model() = default;
  class Binder;
  Status derive_dims();
  Result<ir::ValueId> add_vision(ir::Graph& g, Binder& w, ir::ValueId img, const std::string& tag,
                                 const std::string& proj_tag,
                                 std::vector<std::pair<std::string, ir::ValueId>>* debug_out,
                                 const std::string& cam) const;
  Result<ir::ValueId> add_text_embed(ir::Graph& g, Binder& w, ir::ValueId ids) const;
  Status add_lm(ir::Graph& g, Binder& w, ir::ValueId h, ir::ValueId pos,
                std::vector<std::pair<std::string, ir::ValueId>>* outs, bool debug) const;
  std::string config_path() const;

  std::string dir_;
  std::string weights_path_;
  Pi05Config config_;
  Pi05Dims dims_;
  int64_t n_img_ = 0;
  std::string vision_root_;  // "...vision_tower.vision_model." or "...vision_tower."
  std::string embed_name_;   // embed_tokens or paligemma.lm_head
  std::string root_;         // "model." or ""
  bool legacy_time_names_ = false;
  std::unique_ptr<TensorSet> tensors_;
};

}  // namespace vlac
