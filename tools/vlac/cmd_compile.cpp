// `vlac compile POLICY_DIR -o OUT.vlac`: a lerobot pi0.5 folder (fp32 or bf16 checkpoint) to one
// .vlac package of CPU engines under a byte cap. The work is in src/compile/; this file parses
// flags, prints progress and the summary, and reports memory per phase.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/registry.h"
#include "command.h"
#include "compile/pi05_compile.h"
#include "core/bytes.h"

namespace vlac::cli {

namespace {

struct CompileFlags {
  CommonOptions common;
  std::string policy;
  std::string out;
  std::string dtype = "bf16";
  std::string activations;  // "" / bf16: W8A16; e4m3 (with --dtype fp8): W8A8
  std::string engine_cap = "512MiB";
  std::string engine_dir;
  std::string backend = "cpu";
  bool keep_engines = false;
  bool show_plan = false;
  std::vector<std::string> calibrate;
  int64_t calibrate_block = 128;
  int calibrate_chunks = 8;
  double calibrate_damp = 0;  // not given: the dtype's default (ir::default_gptq_damp)
  bool calibrate_damp_given = false;
  std::string calibrate_order = "act";
  bool calibrate_block_given = false, calibrate_chunks_given = false;
  std::string calibrate_save, calibrate_stats;
  int threads = 2;
  std::string tokenizer;
};

Status compile_policy(const CompileFlags& f, MemMeter& meter) {
  Pi05CompileOptions o;
  o.out = f.out;
  if (f.dtype != "bf16" && f.dtype != "fp32" && f.dtype != "bf16-all" && f.dtype != "int8" && f.dtype != "fp8")
    return invalid_argument("--dtype must be bf16, bf16-all, int8, fp8 or fp32, got '" + f.dtype + "'");
  o.bf16 = f.dtype != "fp32";
  o.bf16_all_matrices = f.dtype == "bf16-all" || f.dtype == "int8" || f.dtype == "fp8";
  o.weight_quant = f.dtype == "int8" ? DType::I8 : f.dtype == "fp8" ? DType::F8_E4M3 : DType::F32;
  if (!f.activations.empty() && f.activations != "bf16" && f.activations != "e4m3")
    return invalid_argument("--activations must be bf16 or e4m3, got '" + f.activations + "'");
  o.fp8_activations = f.activations == "e4m3";
  if (o.fp8_activations && o.weight_quant != DType::F8_E4M3)
    return invalid_argument("--activations e4m3 goes with --dtype fp8 (W8A8: FP8 weights and activations)");
  if (!f.calibrate.empty() && o.weight_quant == DType::F32)
    return invalid_argument("--calibrate goes with --dtype int8 or fp8 (it chooses their 8-bit codes)");
  if (!f.calibrate_stats.empty() && o.weight_quant == DType::F32)
    return invalid_argument("--calibrate-stats goes with --dtype int8 or fp8 (it chooses their 8-bit codes)");
  if (!f.calibrate_stats.empty() && !f.calibrate.empty())
    return invalid_argument("--calibrate-stats replaces the --calibrate run: give one or the other");
  if (!f.calibrate_stats.empty() && (f.calibrate_block_given || f.calibrate_chunks_given || !f.tokenizer.empty()))
    return invalid_argument("--calibrate-block, --calibrate-chunks and --tokenizer shape a --calibrate run; "
                            "--calibrate-stats takes the statistics as they were saved");
  if (!f.calibrate_save.empty() && f.calibrate.empty())
    return invalid_argument("--calibrate-save goes with --calibrate (it writes that run's statistics)");
  if (f.calibrate_block < 1) return invalid_argument("--calibrate-block must be at least 1");
  if (f.threads < 1) return invalid_argument("--threads must be at least 1");
  o.calibrate = f.calibrate;
  o.calibrate_block = f.calibrate_block;
  if (f.calibrate_chunks < 1) return invalid_argument("--calibrate-chunks must be at least 1");
  if (f.calibrate_damp_given && !(f.calibrate_damp > 0.0)) return invalid_argument("--calibrate-damp must be above 0");
  o.calibrate_chunks = f.calibrate_chunks;
  o.calibrate_damp = f.calibrate_damp_given ? f.calibrate_damp : 0.0;  // 0: ir::default_gptq_damp
  if (f.calibrate_order != "act" && f.calibrate_order != "index")
    return invalid_argument("--calibrate-order must be act or index, got '" + f.calibrate_order + "'");
  o.calibrate_act_order = f.calibrate_order == "act";
  o.calibrate_save = f.calibrate_save;
  o.calibrate_stats = f.calibrate_stats;
  o.threads = f.threads;
  if (!f.tokenizer.empty() && f.calibrate.empty()) return invalid_argument("--tokenizer goes with --calibrate");
  o.tokenizer = f.tokenizer;
  {
    auto cap = parse_size(f.engine_cap);
    if (!cap.is_ok()) return cap.status().with_context("--engine-cap");
    o.engine_cap = *cap;
  }
  // Any backend built into this vlac (backends/registry.h); the error lists the available ones.
  VLAC_ASSIGN_OR_RETURN(Backend * engine_backend, backend_registry().get(f.backend, "--backend " + f.backend));
  if (!engine_backend->compiler())
    return unsupported("--backend " + f.backend + ": this vlac runs '" + f.backend +
                       "' engines but has no engine builder for it");
  o.backend = f.backend;
  o.engine_dir = f.engine_dir;
  o.keep_engine_files = f.keep_engines && !f.engine_dir.empty();
  const bool quiet = f.common.quiet;
  o.log = [quiet](const std::string& line) {
    if (!quiet) std::fprintf(stderr, "%s\n", line.c_str());
  };
  o.on_stage = [&meter](const std::string& stage) {
    if (stage == "package" || stage == "calibrate") meter.begin_phase(stage);
    else if (stage.rfind("engine:", 0) == 0 && stage.find(".0") == stage.size() - 2)
      meter.begin_phase("build:" + stage.substr(7, stage.size() - 9));  // one phase per stage
  };
  const auto t0 = std::chrono::steady_clock::now();
  meter.begin_phase("plan");
  if (!quiet) std::fprintf(stderr, "vlac compile: %s -> %s (%s%s, engine cap %s)\n", f.policy.c_str(), f.out.c_str(),
                           f.dtype.c_str(), o.fp8_activations ? ", e4m3 activations" : "",
                           format_bytes(o.engine_cap).c_str());
  VLAC_ASSIGN_OR_RETURN(Pi05CompileSummary s, compile_pi05(f.policy, o));
  meter.end_phase();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int over = 0;
  uint64_t largest = 0;
  nlohmann::json engines = nlohmann::json::array();
  for (const auto& e : s.engines) {
    over += e.over_cap ? 1 : 0;
    largest = std::max(largest, e.weight_bytes);
    engines.push_back({{"name", e.name}, {"stage", e.stage}, {"weight_bytes", e.weight_bytes},
                       {"file_bytes", e.file_bytes}, {"weights_stored", e.weights_stored},
                       {"over_cap", e.over_cap}, {"crossing_in_bytes", e.crossing_in_bytes}});
  }
  meter.add_extra("engines", engines.dump());
  meter.add_extra("package_bytes", std::to_string(s.package_bytes));
  meter.add_extra("packed_weight_bytes", std::to_string(s.packed_weight_bytes));
  meter.add_extra("source_weight_bytes", std::to_string(s.source_weight_bytes));
  meter.add_extra("crossing_bytes", std::to_string(s.crossing_bytes));
  meter.add_extra("engine_cap", std::to_string(o.engine_cap));
  meter.add_extra("compile_seconds", std::to_string(secs));
  if (f.show_plan) std::printf("%s", s.plan_text.c_str());
  std::printf("vlac compile: %s -> %s: %zu engines (%s weights, largest %s, cap %s%s), package %s, %.1f s\n",
              f.policy.c_str(), f.out.c_str(), s.engines.size(), format_bytes(s.packed_weight_bytes).c_str(),
              format_bytes(largest).c_str(), format_bytes(o.engine_cap).c_str(),
              over ? (", " + std::to_string(over) + " over the cap: a single tensor is larger").c_str() : "",
              format_bytes(s.package_bytes).c_str(), secs);
  return Status::ok();
}

}  // namespace

void register_compile(CLI::App& app) {
  auto f = std::make_shared<CompileFlags>();
  auto* sub = app.add_subcommand("compile", "compile a pi0.5 policy folder into one .vlac package (CPU engines)");
  sub->add_option("policy", f->policy, "policy folder (config.json + model.safetensors, fp32 or bf16)")->required();
  sub->add_option("-o,--out", f->out, "output package OUT.vlac (written atomically)")->required();
  sub->add_option("--dtype", f->dtype, "engine precision: bf16 (lerobot's bf16 split, default), bf16-all (every weight matrix bf16, also SigLIP, projector and adaRMS denses: for GPUs), int8 / fp8 (those matrices as 8-bit codes with one scale per output row, activations bf16: half the weight bytes) or fp32");
  sub->add_option("--activations", f->activations,
                  "activations of the 8-bit matrices' linears: bf16 (default: W8A16) or e4m3 (with --dtype fp8: "
                  "W8A8, each linear's input rounded per row to FP8 at run time, so Hopper-class GPUs run the "
                  "GEMM on FP8 tensor cores; the CPU rounds the same way)");
  sub->add_option("--engine-cap", f->engine_cap, "weight bytes per engine, e.g. 512MiB (default), 64KiB");
  sub->add_option("--engine-dir", f->engine_dir, "folder for engine files (default: a temporary one beside OUT)");
  sub->add_flag("--keep-engines", f->keep_engines, "keep the engine files in --engine-dir");
  sub->add_option("--backend", f->backend, "engine backend, a name from the backend registry: cpu (default)");
  sub->add_option("--calibrate", f->calibrate,
                  "with --dtype int8 / fp8: an observation (safetensors, as vlac run reads it) run once through the "
                  "folder's fp32 CPU path; the 8-bit codes are then chosen by GPTQ from every linear's inputs instead "
                  "of rounded to nearest (same scales and bytes). Repeat for several observations");
  sub->add_option("--calibrate-block", f->calibrate_block,
                  "inputs per diagonal block of the calibration statistics (default 128; k x block floats per weight)")
      ->each([f](const std::string&) { f->calibrate_block_given = true; });
  sub->add_option("--calibrate-chunks", f->calibrate_chunks,
                  "denoising loops per calibration observation, each from its own seeded noise (default 8): the action "
                  "expert sees chunk_size rows a step")
      ->each([f](const std::string&) { f->calibrate_chunks_given = true; });
  sub->add_option("--calibrate-save", f->calibrate_save,
                  "with --calibrate: also write the run's statistics to FILE (safetensors), for --calibrate-stats");
  sub->add_option("--calibrate-stats", f->calibrate_stats,
                  "with --dtype int8 / fp8: GPTQ from the statistics a --calibrate-save run wrote, instead of running "
                  "observations again (they depend on neither the dtype nor the damping)");
  sub->add_option("--calibrate-damp", f->calibrate_damp,
                  "GPTQ damping: lambda = damp x mean(diag H) added to H's diagonal (default 1 for int8, 0.01 for fp8)")
      ->each([f](const std::string&) { f->calibrate_damp_given = true; });
  sub->add_option("--calibrate-order", f->calibrate_order,
                  "GPTQ's rounding order within a block: act (default: the inputs with the largest mean square "
                  "first) or index");
  sub->add_option("--tokenizer", f->tokenizer,
                  "SentencePiece model (file or folder) for --calibrate observations with a raw task, when the folder has none");
  sub->add_option("--threads", f->threads, "CPU threads of the calibration run, its statistics and the GPTQ rounding (default 2)");
  sub->add_flag("--plan", f->show_plan, "print the partition plan (engines, inputs, outputs, crossing bytes)");
  add_common_options(sub, &f->common);
  sub->callback([f] { run_command("compile", f->common, [&](MemMeter& m) { return compile_policy(*f, m); }); });
}

}  // namespace vlac::cli
