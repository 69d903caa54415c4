// `vlac mem plan`: training-memory plan for a policy on a GPU (per module, human or JSON) and the
// cheapest levers that make it fit. All arithmetic lives in src/diag/train_plan; this file only
// parses flags (every bad value is one line, exit 2) and prints.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "command.h"
#include "diag/train_plan.h"
#include "io/json_reader.h"

namespace vlac::cli {

namespace {

struct PlanFlags {
  CommonOptions common;
  std::string policy, config, gpu, dtype, mixed, optimizer, shard;
  std::string batch, grad_accum, seq, cams, image_size, chunk, lora_r, lora_targets, gpus;
  bool gradient_checkpointing = false, freeze_vision = false, train_expert_only = false;
  bool tune_vision = false, tune_llm = false, ema = false, openpi = false, json = false, vlm_bf16 = false;
};

Result<int64_t> parse_count(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  if (text.empty() || text.size() > 12) return invalid_argument(flag + " '" + text + "' is not a whole number");
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return invalid_argument(flag + " '" + text + "' is not a whole number");
    v = v * 10 + (c - '0');
  }
  if (v < lo || v > hi)
    return invalid_argument(flag + " " + text + " is out of range (" + std::to_string(lo) + ".." + std::to_string(hi) + ")");
  return v;
}

Status run_plan(const PlanFlags& f) {
  if (f.policy.empty()) return invalid_argument("--policy is required (pi05, pi0, smolvla, act, groot-n1.7)");
  if (f.gpu.empty()) return invalid_argument("--gpu is required (a card such as RTX4090, A100-80, H100, or a size like 24GiB)");
  VLAC_ASSIGN_OR_RETURN(PolicyKind kind, parse_policy_kind(f.policy));
  VLAC_ASSIGN_OR_RETURN(diag::GpuSpec gpu, diag::parse_gpu(f.gpu));

  diag::TrainOptions opts = f.openpi ? diag::openpi_train_options(!f.lora_r.empty()) : diag::default_train_options(kind);
  if (f.openpi && kind != PolicyKind::Pi0 && kind != PolicyKind::Pi05)
    return unsupported("--openpi: openpi trains pi0 and pi05 only");
  std::optional<nlohmann::json> config;
  if (!f.config.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(f.config, ec))
      return not_found(f.config + ": no such file (--config wants a lerobot config.json)");
    VLAC_ASSIGN_OR_RETURN(nlohmann::json c, read_json_file(f.config));
    if (kind != PolicyKind::Pi05 && kind != PolicyKind::Pi0 && kind != PolicyKind::SmolVla && kind != PolicyKind::Act)
      return unsupported("--config: only lerobot policies (pi05, pi0, smolvla, act) read a config.json");
    if (auto t = c.find("type"); c.is_object() && t != c.end() && t->is_string() && t->get<std::string>() != f.policy &&
                                 !(kind == PolicyKind::Pi05 && t->get<std::string>() == "pi05"))
      return invalid_argument(f.config + ": 'type' is '" + t->get<std::string>() + "' but --policy is " + f.policy);
    VLAC_RETURN_IF_ERROR(diag::apply_lerobot_train_config(c, f.config, &opts));
    config = std::move(c);
  }
  if (!f.dtype.empty()) { VLAC_ASSIGN_OR_RETURN(opts.dtype, diag::parse_weight_dtype(f.dtype)); }
  if (!f.mixed.empty()) { VLAC_ASSIGN_OR_RETURN(opts.mixed, diag::parse_mixed_precision(f.mixed)); }
  if (!f.optimizer.empty()) { VLAC_ASSIGN_OR_RETURN(opts.optimizer, diag::parse_optimizer(f.optimizer)); }
  if (!f.shard.empty()) { VLAC_ASSIGN_OR_RETURN(opts.shard, diag::parse_shard(f.shard)); }
  if (!f.batch.empty()) { VLAC_ASSIGN_OR_RETURN(opts.batch, parse_count("--batch", f.batch, 1, 4096)); }
  if (!f.grad_accum.empty()) { VLAC_ASSIGN_OR_RETURN(opts.grad_accum, parse_count("--grad-accum", f.grad_accum, 1, 65536)); }
  if (!f.gpus.empty()) { VLAC_ASSIGN_OR_RETURN(opts.gpus, parse_count("--gpus", f.gpus, 1, 4096)); }
  if (!f.lora_r.empty()) { VLAC_ASSIGN_OR_RETURN(opts.lora_r, parse_count("--lora-r", f.lora_r, 1, 65536)); }
  if (!f.lora_targets.empty()) {
    if (opts.lora_r == 0) return invalid_argument("--lora-targets needs --lora-r");
    std::stringstream ss(f.lora_targets);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty()) return invalid_argument("--lora-targets '" + f.lora_targets + "' has an empty entry");
      opts.lora_targets.push_back(item);
    }
  }
  opts.gradient_checkpointing = opts.gradient_checkpointing || f.gradient_checkpointing;
  opts.freeze_vision = opts.freeze_vision || f.freeze_vision;
  opts.train_expert_only = opts.train_expert_only || f.train_expert_only;
  opts.tune_vision = f.tune_vision;
  opts.tune_llm = f.tune_llm;
  opts.ema = opts.ema || f.ema;
  opts.vlm_bf16 = opts.vlm_bf16 || f.vlm_bf16;

  PolicyInputs in;
  if (!f.seq.empty()) { VLAC_ASSIGN_OR_RETURN(in.prompt_tokens, parse_count("--seq", f.seq, 1, 8192)); }
  if (!f.cams.empty()) { VLAC_ASSIGN_OR_RETURN(in.cams, parse_count("--cams", f.cams, 1, 16)); }
  if (!f.chunk.empty()) { VLAC_ASSIGN_OR_RETURN(in.chunk, parse_count("--chunk", f.chunk, 1, 4096)); }
  if (!f.image_size.empty()) {
    VLAC_ASSIGN_OR_RETURN(in.image_h, parse_count("--image-size", f.image_size, 32, 2048));
    in.image_w = in.image_h;
  }

  VLAC_ASSIGN_OR_RETURN(diag::TrainPlan plan, diag::plan_for_gpu(kind, in, config ? &*config : nullptr, f.config, opts, gpu));
  if (f.json) std::printf("%s\n", diag::plan_to_json(plan).dump(2).c_str());
  else std::fputs(diag::plan_to_text(plan).c_str(), stdout);
  return Status::ok();
}

}  // namespace

void register_mem_plan(CLI::App& mem) {
  auto f = std::make_shared<PlanFlags>();
  auto* sub = mem.add_subcommand("plan", "plan the GPU memory of fine-tuning a policy and the levers that make it fit");
  sub->add_option("--policy", f->policy, "pi05, pi0, smolvla, act or groot-n1.7");
  sub->add_option("--config", f->config, "a lerobot config.json (pi05/pi0 dims, chunk_size, cameras, tokenizer_max_length, dtype, freeze flags)");
  sub->add_option("--gpu", f->gpu, "RTX4090, RTX3090, A100-40, A100-80, H100, H200, L40S, A6000, T4, L4, Jetson-Orin-Nano-8GB, ... or a size (24GiB)");
  sub->add_option("--dtype", f->dtype, "parameter dtype: fp32 or bf16 (default: the policy's)");
  sub->add_option("--mixed-precision", f->mixed, "no, bf16 or fp16 (autocast with fp32 master weights)");
  sub->add_option("--optimizer", f->optimizer, "adamw (default), adamw8bit, sgd, sgd-momentum");
  sub->add_option("--batch", f->batch, "per-GPU micro-batch (default 8; GR00T 32)");
  sub->add_option("--grad-accum", f->grad_accum, "gradient accumulation steps");
  sub->add_option("--seq", f->seq, "prompt tokens in the prefix (pi05 200, pi0/smolvla 48)");
  sub->add_option("--cams", f->cams, "cameras per sample");
  sub->add_option("--image-size", f->image_size, "square image side in pixels");
  sub->add_option("--chunk", f->chunk, "action chunk length");
  sub->add_flag("--gradient-checkpointing", f->gradient_checkpointing, "recompute every transformer layer in backward");
  sub->add_flag("--freeze-vision", f->freeze_vision, "freeze the vision tower");
  sub->add_flag("--train-expert-only", f->train_expert_only, "freeze vision, projector and language model");
  sub->add_flag("--tune-vision", f->tune_vision, "train a vision tower the policy freezes by default (GR00T --tune-visual)");
  sub->add_flag("--tune-llm", f->tune_llm, "train a language model the policy freezes by default (GR00T --tune-llm)");
  sub->add_option("--lora-r", f->lora_r, "LoRA rank (base of the targeted modules frozen)");
  sub->add_option("--lora-targets", f->lora_targets, "comma list of [module.]linear (e.g. language.q_proj,expert.*)");
  sub->add_flag("--ema", f->ema, "keep an EMA copy of the trainable weights");
  sub->add_flag("--vlm-bf16", f->vlm_bf16, "SmolVLA: backbone loaded in bf16 (lerobot load_vlm_weights=true)");
  sub->add_option("--gpus", f->gpus, "data-parallel GPUs");
  sub->add_option("--shard", f->shard, "none (DDP), zero1, zero2, zero3 or fsdp");
  sub->add_flag("--openpi", f->openpi, "plan openpi's JAX trainer (pi0/pi05): fp32 params + bf16 compute, remat, batch 32, EMA unless LoRA, frozen params bf16");
  sub->add_flag("--json", f->json, "print the plan as JSON (exact bytes)");
  add_common_options(sub, &f->common);
  sub->callback([f] { run_command("mem plan", f->common, [f](MemMeter&) { return run_plan(*f); }); });
}

}  // namespace vlac::cli
