// Training-memory planner: per module of a policy (from the same tables the compiler uses), the
// bytes of weights, gradients, optimizer state and activations for a training setup, plus CUDA
// context/workspace/allocator overhead, against a GPU; and the cheapest levers, in the guide's
// order, that make it fit. Pure arithmetic; reads nothing but an optional config JSON object.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "models/policy_arch.h"

namespace vlac::diag {

enum class WeightDtype : uint8_t { Fp32, Bf16 };
enum class MixedPrecision : uint8_t { No, Bf16, Fp16 };
enum class OptimizerKind : uint8_t { AdamW, AdamW8bit, Sgd, SgdMomentum };
enum class ShardKind : uint8_t { None, Zero1, Zero2, Zero3, Fsdp };

const char* to_string(WeightDtype v);
const char* to_string(MixedPrecision v);
const char* to_string(OptimizerKind v);
const char* to_string(ShardKind v);
Result<WeightDtype> parse_weight_dtype(const std::string& s);        // fp32|float32|bf16|bfloat16
Result<MixedPrecision> parse_mixed_precision(const std::string& s);  // no|bf16|fp16
Result<OptimizerKind> parse_optimizer(const std::string& s);         // adamw|adamw8bit|sgd|sgd-momentum
Result<ShardKind> parse_shard(const std::string& s);                 // none|zero1|zero2|zero3|fsdp

struct TrainOptions {
  WeightDtype dtype = WeightDtype::Fp32;      // parameter storage (lerobot pi0/pi05 default float32)
  MixedPrecision mixed = MixedPrecision::No;  // autocast / master-weight mixed precision
  OptimizerKind optimizer = OptimizerKind::AdamW;
  int64_t batch = 8;                          // per-GPU micro-batch (lerobot default batch_size 8)
  int64_t grad_accum = 1;
  bool gradient_checkpointing = false;        // full recomputation of every transformer layer
  bool freeze_vision = false;
  bool train_expert_only = false;             // freeze vision + projector + language model
  bool tune_vision = false;                   // un-freeze a vision tower the policy freezes by default
  bool tune_llm = false;                      // same for the language model (GR00T tune_llm, SmolVLA)
  int64_t lora_r = 0;                         // >0: LoRA adapters; the targeted modules' base is frozen
  std::vector<std::string> lora_targets;      // "[module.]linear" ("*" = every Linear); empty = policy default
  bool ema = false;                           // one more copy of the trainable weights (openpi default 0.99)
  /// SmolVLA: lerobot's load_vlm_weights=True (AutoModelForImageTextToText.from_pretrained with
  /// torch_dtype=bfloat16) leaves the SmolVLM2 backbone in bf16; the default (False) builds it
  /// from its config in fp32 (measured: 1.70 GiB of weights, tests/fixtures/train_memory).
  bool vlm_bf16 = false;
  /// Under mixed precision, whether a 16-bit working copy of the trainable weights stays alive
  /// (PyTorch autocast's cast cache; Hugging Face's 6 bytes/param). JAX casts per op inside
  /// rematerialised layers and keeps none.
  bool half_copy = true;
  std::optional<WeightDtype> frozen_dtype;    // openpi casts frozen parameters to bfloat16
  /// openpi's JAX trainer: the model has no lm_heads, jax.grad returns a (zero) gradient for every
  /// trainable parameter, and bf16 casts happen per op inside rematerialised layers (no copy).
  bool openpi = false;
  int64_t gpus = 1;
  ShardKind shard = ShardKind::None;
  // Overheads (see train_plan.cpp for the sources).
  uint64_t cuda_context_bytes = 640ull << 20;
  uint64_t workspace_bytes = 32ull << 20;
};

/// The stack's own defaults for a policy (lerobot's for pi0/pi05/smolvla/act; Isaac-GR00T
/// launch_finetune for GR00T: fp32 parameters under bf16 autocast, batch 32).
TrainOptions default_train_options(PolicyKind kind);

/// openpi's TrainConfig defaults (src/openpi/training/config.py, train.py): fp32 parameters with
/// bf16 compute, every layer rematerialised (nn.remat, nothing_saveable), batch 32, EMA 0.99 for
/// full fine-tunes (LoRA configs turn it off), frozen parameters cast to bf16, LoRA rank 16.
TrainOptions openpi_train_options(bool lora);

/// Reads lerobot's training flags from a policy config.json object into `opts`: dtype,
/// gradient_checkpointing, freeze_vision_encoder, train_expert_only, load_vlm_weights.
/// Wrong types -> InvalidFormat.
Status apply_lerobot_train_config(const nlohmann::json& config, const std::string& path, TrainOptions* opts);

struct GpuSpec {
  std::string name;
  uint64_t bytes = 0;   // memory.total as nvidia-smi reports it (MiB-exact), or the size given
  std::string note;
};
/// The built-in card table, smallest first.
const std::vector<GpuSpec>& known_gpus();
/// "RTX4090", "a100-80", "H100", "jetson-orin-nano-8gb", ... or a size ("24GiB", "80G").
Result<GpuSpec> parse_gpu(const std::string& text);

struct ModulePlan {
  std::string name;
  std::string role;
  uint64_t params = 0;            // parameters (buffers excluded)
  uint64_t trainable_params = 0;  // requires_grad (incl. LoRA adapters)
  uint64_t lora_params = 0;
  uint64_t weight_bytes = 0;      // stored weights (+ fp32 master under mixed precision, buffers)
  uint64_t grad_bytes = 0;
  uint64_t optimizer_bytes = 0;   // optimizer state (+ EMA copy)
  uint64_t activation_bytes = 0;  // saved for backward, whole micro-batch
  bool trainable = false;
  bool in_grad_path = false;      // its activations are kept for backward
};

struct Lever {
  std::string name;      // dtype, halve_batch, gradient_checkpointing, freeze_vision, train_expert_only,
                         // lora, shrink_inputs, bigger_card, shard
  std::string detail;    // the setting, e.g. "--dtype bf16" or "batch 8 -> 2, grad-accum 1 -> 4"
  bool changes_policy = false;
  uint64_t total_after = 0;  // plan total once this lever (and the ones before it) are pulled
};

struct TrainPlan {
  PolicyKind kind;
  std::string description;
  PolicyInputs inputs;
  int64_t image_tokens_per_cam = 0, prefix_tokens = 0;
  TrainOptions options;
  std::vector<ModulePlan> modules;
  uint64_t params = 0, trainable_params = 0;
  uint64_t weight_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, activation_bytes = 0;
  uint64_t working_bytes = 0;        // one layer's forward temporaries (input, output, widest intermediates)
  uint64_t input_bytes = 0;          // the micro-batch itself on the GPU (fp32 images, targets)
  /// Under autocast: the 16-bit copies of the trainable fp32 Linear/conv weights and biases (the
  /// autocast cast cache, kept by backward). Alive in forward/backward only, not at the optimizer step.
  uint64_t autocast_copy_bytes = 0;
  /// torch.optim.AdamW's foreach step (the CUDA default): torch._foreach_sqrt(exp_avg_sq) makes
  /// one temporary as large as the parameters it updates, alive with the gradients.
  uint64_t optimizer_temp_bytes = 0;
  // The step's three phase peaks, as torch.cuda.max_memory_allocated sees them (tested against
  // measurements: tests/fixtures/train_memory): forward = weights + optimizer state + batch +
  // activations + one layer's temporaries (+ autocast copies); backward: see below; optimizer
  // step = weights + optimizer state + batch + gradients + AdamW's temporary. Activations are
  // freed before the step and gradients set to None after it (zero_grad), so they never add up.
  uint64_t persistent_bytes = 0;     // weights + optimizer state (+ DDP buckets, gathered unit)
  uint64_t forward_peak_bytes = 0;
  uint64_t optimizer_peak_bytes = 0;
  /// The backward phase (layer by layer from the last: saved tensors still held + gradients made
  /// so far + one layer's gradients in flight, or its recomputed tensors when checkpointed).
  uint64_t backward_peak_bytes = 0;
  uint64_t peak_allocated_bytes = 0;  // max of the three
  uint64_t ddp_bucket_bytes = 0;     // DDP gradient buckets (gradient_as_bucket_view=False)
  uint64_t gather_bytes = 0;         // ZeRO-3/FSDP: one gathered unit's params + grads
  uint64_t cuda_context_bytes = 0, workspace_bytes = 0, allocator_bytes = 0;
  /// The caching-allocator model's replay of the run (diag/alloc_sim.h): its own peak allocated
  /// and reserved; allocator_bytes = their difference, what the allocator holds beyond live bytes.
  uint64_t sim_peak_allocated_bytes = 0, sim_peak_reserved_bytes = 0;
  uint64_t peak_reserved_bytes = 0;  // peak allocated + allocator_bytes
  uint64_t total_bytes = 0;          // peak reserved + CUDA context: what the card must hold
  // Against a GPU (set by plan_for_gpu).
  std::optional<GpuSpec> gpu;
  bool fits = false;
  std::vector<Lever> levers;         // cheapest set that fits, in the guide's order
  bool levers_fit = false;           // false: even every lever is not enough on this card
  std::optional<GpuSpec> smallest_gpu_as_is;  // first card of the table the setup fits unchanged
};

/// Everything except the GPU comparison.
Result<TrainPlan> plan_training(const PolicyArch& arch, const TrainOptions& opts);

/// Builds the policy (pi0/pi0.5 dims from `config` when given), plans it, compares with `gpu`
/// and searches the levers. `inputs` zero fields take config/policy defaults.
Result<TrainPlan> plan_for_gpu(PolicyKind kind, const PolicyInputs& inputs, const nlohmann::json* config,
                               const std::string& config_path, const TrainOptions& opts, const GpuSpec& gpu);

/// Korthikanti et al. 2022 generalised: bytes one sample's block saves for backward (no recompute).
/// `frozen`: the block's weights need no gradient but its inputs do (a frozen module coupled into
/// the gradient path): the tensors autograd keeps only for weight gradients (Linear inputs) go.
uint64_t block_activation_bytes(const ActBlock& b, int element_bytes, bool frozen = false);
/// The same, tensor by tensor (bytes per sample; sums to block_activation_bytes).
std::vector<uint64_t> block_saved_tensors(const ActBlock& b, int element_bytes, bool frozen = false);
/// With full recomputation: only the block input (2sbh at 16 bits).
uint64_t block_checkpoint_bytes(const ActBlock& b, int element_bytes);

nlohmann::json plan_to_json(const TrainPlan& plan);
std::string plan_to_text(const TrainPlan& plan);

}  // namespace vlac::diag
