// pi0.5 compile driver (see pi05_compile.h): builds the four stage graphs (vision per camera or batched,
// text embedding, Gemma prefix, one denoising step), partitions each under the cap, has the
// chosen backend build one engine file at a time and streams them into the package.
#include "compile/pi05_compile.h"

#include <algorithm>
#include <map>

#include "backends/registry.h"
#include "compile/calibration_file.h"
#include "compile/engine_build.h"
#include "core/atomic_file.h"
#include "core/bytes.h"
#include "core/mapped_file.h"
#include "core/quant.h"
#include "ir/backend.h"
#include "ir/quant_calib.h"
#include "ir/serialize.h"
#include "models/pi05_builder.h"
#include "package/package_writer.h"
#include "package/pi05_precision.h"
#include "policy/pi05_observation.h"
#include "policy/pi05_policy.h"
#include "policy/pi05_processor.h"
#include "policy/tokenizer.h"

namespace vlac {

namespace {

using nlohmann::json;

struct StageGraph {
  std::string name;
  Pi05Graph graph;
};

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// --calibrate: each observation through the folder's fp32 CPU path (its prefix, then
// calibrate_chunks denoising loops from seeded noise), every Linear's input rows added to `calib`.
// The policy and its weights are gone before the first engine is built.
Status run_calibration(const std::string& policy_dir, const Pi05CompileOptions& opt, ir::QuantCalibration& calib) {
  auto log = [&](const std::string& s) {
    if (opt.log) opt.log(s);
  };
  Pi05PolicyOptions po;
  po.precision = Pi05Precision::Fp32;
  po.threads = std::max(1, opt.threads);
  po.linear_observer = [&calib](const std::string& w, const float* x, int64_t rows, int64_t k) {
    calib.observe(w, x, rows, k);
  };
  VLAC_ASSIGN_OR_RETURN(Pi05Policy policy, Pi05Policy::load(policy_dir, po));
  VLAC_ASSIGN_OR_RETURN(Pi05Processor proc, load_pi05_processor(policy_dir));
  if (!opt.tokenizer.empty()) {
    VLAC_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_path(opt.tokenizer));
    proc.set_tokenizer(std::move(tok));
  }
  const Pi05Model& m = policy.model();
  const int64_t H = m.config().chunk_size, A = m.dims().max_action_dim;
  std::vector<float> action(size_t(H * A));
  for (const std::string& path : opt.calibrate) {
    auto obs = read_pi05_observation(path, m.config(), m.dims().channels, &proc, "", m.dims().vocab);
    if (!obs.is_ok()) return obs.status().with_context("--calibrate");
    log("  calibrating on " + path + " (fp32, CPU)");
    VLAC_RETURN_IF_ERROR(policy.run_prefix(*obs).with_context("--calibrate " + path));
    // The expert sees chunk_size rows a step: several noise draws give its statistics rank.
    for (int c = 0; c < std::max(1, opt.calibrate_chunks); ++c) {
      const std::vector<float> noise = pi05_gaussian_noise(opt.calibrate_seed + uint64_t(c), H * A);
      VLAC_RETURN_IF_ERROR(policy.denoise(noise.data(), action.data()).with_context("--calibrate " + path));
    }
  }
  log("  calibration: " + std::to_string(calib.size()) + " linear weights observed, " + format_bytes(calib.bytes()) +
      " of statistics (blocks of " + std::to_string(calib.block()) + " inputs)");
  return Status::ok();
}

// Statistics read from a file must be this policy's: every weight in it a matrix of the folder
// whose input width is the statistics' k (GPTQ would otherwise round those weights to nearest
// without a word).
Status check_calibration_weights(const ir::QuantCalibration& calib, const TensorSet& tensors, const std::string& path) {
  for (const auto& [name, st] : calib.all()) {
    const TensorSet::Entry* e = tensors.find(name);
    if (!e || e->info->shape.size() != 2)
      return invalid_argument(path + ": statistics of '" + name + "', which is not a matrix of this policy (" +
                              tensors.source() + ")");
    if (e->info->shape[1] != st.k)
      return invalid_argument(path + ": statistics of '" + name + "' over " + std::to_string(st.k) +
                              " inputs, but this policy's matrix has " + std::to_string(e->info->shape[1]));
  }
  return Status::ok();
}

}  // namespace

std::vector<std::string> pi05_side_files(const std::string& policy_dir) {
  std::vector<std::string> out = pi05_processor_file_names(policy_dir);
  std::sort(out.begin(), out.end());
  return out;
}

Result<Pi05CompileSummary> compile_pi05(const std::string& policy_dir, const Pi05CompileOptions& opt) {
  auto log = [&](const std::string& s) {
    if (opt.log) opt.log(s);
  };
  auto stage_hook = [&](const std::string& s) {
    if (opt.on_stage) opt.on_stage(s);
  };
  if (opt.out.empty()) return invalid_argument("compile: -o OUT.vlac is required");
  if (opt.engine_cap < 4096) return invalid_argument("--engine-cap must be at least 4 KiB");
  VLAC_ASSIGN_OR_RETURN(Backend* backend, backend_registry().get(opt.backend, "compile"));
  BackendCompiler* compiler = backend->compiler();
  if (!compiler) return unsupported("compile: backend '" + opt.backend + "' runs packages but does not build engines");
  VLAC_ASSIGN_OR_RETURN(Pi05Model model, Pi05Model::load(policy_dir));
  // The processor files go into the package verbatim: refuse now what the runtime would refuse.
  VLAC_RETURN_IF_ERROR(load_pi05_processor(policy_dir).status());
  if (!is_dir(parent_dir(opt.out)))
    return not_found(opt.out + ": the output folder " + parent_dir(opt.out) + " does not exist");
  const Pi05Config& cfg = model.config();
  const Pi05Dims& d = model.dims();
  const int64_t L = cfg.tokenizer_max_length;
  const int64_t P = int64_t(cfg.cameras.size()) * model.image_tokens() + L;

  std::vector<StageGraph> stages;
  {
    // A backend that prefers it (a GPU) gets all configured cameras in one batched run (the
    // runtime respecializes it to those present); others one image per run.
    const int64_t images = compiler->prefers_batched_images() ? std::max<int64_t>(1, int64_t(cfg.cameras.size())) : 0;
    VLAC_ASSIGN_OR_RETURN(Pi05Graph g, model.build_vision(images));
    stages.push_back({"vision", std::move(g)});
  }
  {
    VLAC_ASSIGN_OR_RETURN(Pi05Graph g, model.build_text_embed(L));
    stages.push_back({"text", std::move(g)});
  }
  {
    VLAC_ASSIGN_OR_RETURN(Pi05Graph g, model.build_lm(P));
    stages.push_back({"lm", std::move(g)});
  }
  {
    VLAC_ASSIGN_OR_RETURN(Pi05Graph g, model.build_step(P));
    stages.push_back({"step", std::move(g)});
  }

  const bool bf16 = opt.bf16;
  VLAC_ASSIGN_OR_RETURN(std::unique_ptr<EngineFolder> folder, EngineFolder::open(opt.out, opt.engine_dir, opt.log));

  std::vector<WeightFileView> files;
  for (const auto& f : model.tensors().files()) files.push_back({f->map().data(), f->map().size(), f->path(), &f->map()});
  FileWeightSource source(std::move(files));

  Pi05CompileSummary sum;
  PackageManifest manifest;
  PackageWriterOptions wopt;
  PackageWriter writer(opt.out, wopt);
  EngineBuildOptions bo;
  bo.engine_cap = opt.engine_cap;
  const bool all = bf16 && opt.bf16_all_matrices;
  const DType quant = opt.weight_quant;
  if (quant != DType::F32 && (!all || !is_quant_dtype(quant)))
    return invalid_argument("compile: 8-bit weights (I8, F8_E4M3) go with bf16 on every matrix (--dtype int8 / fp8)");
  if (opt.fp8_activations && quant != DType::F8_E4M3)
    return invalid_argument("compile: e4m3 activations go with FP8 weights (--dtype fp8 --activations e4m3)");
  bo.run_dtype = [bf16, all, quant](const ir::WeightRef& r) {
    const bool matrix = r.shape.size() == 2 && r.name.find("paligemma_with_expert") != std::string::npos &&
                        r.name.find("position_embedding") == std::string::npos;
    if (all && matrix) return quant != DType::F32 ? quant : DType::BF16;  // embed_tokens too
    return Pi05Model::run_dtype(r, bf16);
  };
  std::unique_ptr<ir::QuantCalibration> calib;
  std::map<std::string, std::string> calib_info;  // which observations and noise draws (the file's, or this run's)
  if (!opt.calibrate_save.empty() && opt.calibrate.empty())
    return invalid_argument("compile: saving calibration statistics needs a calibration run (--calibrate OBS)");
  if (!opt.calibrate.empty() && !opt.calibrate_stats.empty())
    return invalid_argument("compile: calibrate on observations or from saved statistics, not both");
  if (!opt.calibrate.empty() || !opt.calibrate_stats.empty()) {
    if (quant == DType::F32) return invalid_argument("compile: --calibrate goes with 8-bit weights (--dtype int8 / fp8)");
    if (opt.calibrate_block < 1) return invalid_argument("compile: the calibration block must be at least 1 input");
    if (!(opt.calibrate_damp >= 0.0))
      return invalid_argument("compile: the calibration damping must not be negative (0: the dtype's default)");
    const double damp = opt.calibrate_damp > 0.0 ? opt.calibrate_damp : ir::default_gptq_damp(quant);
    stage_hook("calibrate");
    if (!opt.calibrate_stats.empty()) {
      VLAC_ASSIGN_OR_RETURN(CalibrationFile file, read_calibration(opt.calibrate_stats, damp, opt.calibrate_act_order,
                                                                  std::max(1, opt.threads)));
      calib = std::move(file.calib);
      calib_info = std::move(file.info);
      VLAC_RETURN_IF_ERROR(check_calibration_weights(*calib, model.tensors(), opt.calibrate_stats));
      log("  calibration: " + std::to_string(calib->size()) + " linear weights' statistics from " + opt.calibrate_stats +
          " (" + format_bytes(calib->bytes()) + ", blocks of " + std::to_string(calib->block()) + " inputs)");
    } else {
      calib = std::make_unique<ir::QuantCalibration>(opt.calibrate_block, damp, opt.calibrate_act_order,
                                                     std::max(1, opt.threads));
      VLAC_RETURN_IF_ERROR(run_calibration(policy_dir, opt, *calib));
      json names = json::array();
      for (const std::string& f : opt.calibrate) names.push_back(base_name(f));
      calib_info["observations"] = names.dump();
      calib_info["chunks_per_observation"] = std::to_string(std::max(1, opt.calibrate_chunks));
      if (!opt.calibrate_save.empty()) {
        VLAC_RETURN_IF_ERROR(save_calibration(*calib, opt.calibrate_save, calib_info));
        log("  calibration statistics saved to " + opt.calibrate_save);
      }
    }
    compiler->release_memory();
  }
  bo.calibration = calib.get();
  bo.log = opt.log;
  bo.on_stage = opt.on_stage;
  EngineBuilder builder(*compiler, source, *folder, writer, manifest, sum, bo);
  json stage_engines = json::object();
  for (StageGraph& st : stages) {
    std::map<ir::ValueId, std::string> named;
    for (const auto& [n, v] : st.graph.outputs) named[v] = n;
    VLAC_ASSIGN_OR_RETURN(std::vector<std::string> names, builder.add_stage(st.graph.graph, st.name, named));
    stage_engines[st.name] = std::move(names);
  }

  // Side files (processor configs, stats, tokenizer) and config.json, verbatim.
  json side = json::array();
  std::vector<std::string> side_files = pi05_side_files(policy_dir);
  side_files.insert(side_files.begin(), "config.json");
  for (const std::string& f : side_files) {
    package::SegmentKind kind = package::SegmentKind::Config;
    if (f.rfind("tokenizer/", 0) == 0) kind = package::SegmentKind::Tokenizer;
    else if (f.size() > 12 && f.substr(f.size() - 12) == ".safetensors") kind = package::SegmentKind::Stats;
    VLAC_RETURN_IF_ERROR(writer.add_file("policy/" + f, kind, policy_dir + "/" + f));
    side.push_back(f);
    if (kind == package::SegmentKind::Stats && !manifest.normalization_segment) manifest.normalization_segment = "policy/" + f;
    if (f == "tokenizer/tokenizer.model") manifest.tokenizer_segment = "policy/" + f;
  }
  if (manifest.normalization_segment) manifest.normalization = json::object({{"segment", *manifest.normalization_segment}});
  if (manifest.tokenizer_segment) manifest.tokenizer = json::object({{"segment", *manifest.tokenizer_segment}});

  json cams = cfg.cameras;
  manifest.policy = json::object({
      {"type", "pi05"},
      {"dtype", bf16 ? "bf16" : "fp32"},
      {"precision", std::string(!bf16                   ? pi05_precision::kFp32
                                : quant == DType::I8      ? pi05_precision::kInt8Weights
                                : quant == DType::F8_E4M3 ? (opt.fp8_activations ? pi05_precision::kFp8W8a8
                                                                                 : pi05_precision::kFp8Weights)
                                : all                     ? pi05_precision::kBf16All
                                                          : pi05_precision::kBf16Lerobot)},
      {"files", std::move(side)},
      {"stages", std::move(stage_engines)},
      {"cameras", std::move(cams)},
      {"chunk_size", cfg.chunk_size},
      {"max_action_dim", d.max_action_dim},
      {"num_inference_steps", cfg.num_inference_steps},
      {"tokenizer_max_length", L},
      {"image_tokens", model.image_tokens()},
      {"image_size", d.image_size},
      {"channels", d.channels},
      {"lm_width", d.lm_width},
      {"lm_depth", d.lm_depth},
      {"head_dim", d.head_dim},
      {"vocab", d.vocab},
      {"engine_cap", opt.engine_cap},
  });
  manifest.metadata = json::object({{"producer", "vlac compile"}});
  if (calib) {
    // The observations and noise draws as the run recorded them (a statistics file carries them).
    json obs_names = json::array();
    int64_t chunks = 0;
    if (auto it = calib_info.find("observations"); it != calib_info.end()) {
      json o = json::parse(it->second, nullptr, false);
      if (o.is_array()) obs_names = std::move(o);
    }
    if (auto it = calib_info.find("chunks_per_observation"); it != calib_info.end())
      chunks = std::strtoll(it->second.c_str(), nullptr, 10);
    manifest.metadata["calibration"] = json::object({{"method", "gptq"},
                                                     {"observations", std::move(obs_names)},
                                                     {"block", calib->block()},
                                                     {"damp", calib->damp()},
                                                     {"act_order", calib->act_order()},
                                                     {"chunks_per_observation", chunks},
                                                     {"tensors", calib->applied()}});
    log("  GPTQ chose the codes of " + std::to_string(calib->applied()) +
        " weight tensors (8-bit tensors no Linear reads, such as embed_tokens, round to nearest)");
  }
  writer.set_manifest(std::move(manifest));
  stage_hook("package");
  log("  packaging " + std::to_string(writer.segment_count()) + " segments into " + opt.out);
  VLAC_ASSIGN_OR_RETURN(PackageWriteSummary ws, writer.finish());
  sum.package_bytes = ws.file_size;
  if (!opt.keep_engine_files || folder->own()) folder->cleanup();
  else folder->keep();
  compiler->release_memory();
  return sum;
}

}  // namespace vlac
