// `vlac run POLICY_DIR --obs OBS.safetensors --out OUT.safetensors`: runs a pi0.5 policy folder
// on the CPU for one observation and writes the normalized action chunk and, where the folder
// has lerobot's processor files, the post-processed `action` in robot units (atomically).
// Phases metered: load, prefix, denoise (and write). No model logic here: see src/policy/.
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>

#include "backends/registry.h"
#include "command.h"
#include "runtime/memory_report.h"
#include "core/bytes.h"
#include "io/safetensors_writer.h"
#include "policy/pi05_policy.h"
#include "package/package.h"
#include "policy/pi05_processor.h"

namespace vlac::cli {

namespace {

struct RunFlags {
  CommonOptions common;
  std::string policy;
  std::string obs;
  std::string out;
  std::string noise;
  uint64_t seed = 0;
  std::string dtype;  // "", "fp32", "bf16"
  std::string dump_dir;
  int threads = 2;
  std::string task;       // --task: overrides OBS __metadata__ "task"
  std::string tokenizer;  // --tokenizer: SentencePiece model (file or folder)
  std::string mem_budget;  // --mem-budget SIZE (packages)
  int repeat = 1;          // --repeat N (packages)
  bool pack_weights = false;  // --pack-weights
  std::string device;         // --device cpu|cuda|auto
};

Status run_policy(const RunFlags& f, MemMeter& meter) {
  // A compiled .vlac package (src/runtime/). A plain file is never a policy folder: the package
  // reader says what is wrong with it (bad magic, truncated) instead of "FILE/config.json".
  struct stat st;
  const bool plain_file = ::stat(f.policy.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  if (plain_file || has_package_magic(f.policy))
    return run_package(PackageRunArgs{f.policy, f.obs, f.out, f.noise, f.dtype, f.dump_dir, f.task, f.tokenizer,
                                      f.mem_budget, f.seed, f.threads, f.repeat, f.pack_weights, f.common.quiet,
                                      f.device},
                       meter);
  VLAC_ASSIGN_OR_RETURN(const DevicePath dev, device_path(f.device, "cpu", meter));
  if (!f.mem_budget.empty()) return invalid_argument("--mem-budget applies to .vlac packages (vlac compile makes one)");
  if (f.repeat != 1) return invalid_argument("--repeat applies to .vlac packages (vlac compile makes one)");
  Pi05PolicyOptions opts;
  if (f.dtype == "fp32") opts.precision = Pi05Precision::Fp32;
  else if (f.dtype == "bf16") opts.precision = Pi05Precision::Bf16;
  else if (!f.dtype.empty()) return invalid_argument("--dtype must be fp32 or bf16, got '" + f.dtype + "'");
  if (f.threads < 1) return invalid_argument("--threads must be at least 1");
  opts.threads = f.threads;
  opts.pack_weights = f.pack_weights;
  opts.record_intermediates = !f.dump_dir.empty();
  opts.backend = dev.backend;
  if (dev.gpu && f.pack_weights) return invalid_argument("--pack-weights applies to the CPU (--device cpu)");

  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  const Clock::time_point t0 = Clock::now();
  meter.begin_phase("load");
  VLAC_ASSIGN_OR_RETURN(Pi05Policy policy, Pi05Policy::load(f.policy, opts));
  const Pi05Model& model = policy.model();
  // lerobot's saved pre/post-processing (none when the folder has no processor files).
  VLAC_ASSIGN_OR_RETURN(Pi05Processor proc, load_pi05_processor(f.policy));
  if (!f.tokenizer.empty()) {
    VLAC_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_path(f.tokenizer));
    proc.set_tokenizer(std::move(tok));
  }
  VLAC_ASSIGN_OR_RETURN(Pi05Observation obs, read_pi05_observation(f.obs, model.config(), model.dims().channels, &proc,
                                                                   f.task, model.dims().vocab));
  const int64_t H = model.config().chunk_size, A = model.dims().max_action_dim;
  std::vector<float> noise;
  if (!f.noise.empty()) {
    VLAC_ASSIGN_OR_RETURN(noise, read_pi05_noise(f.noise, model));
  } else {
    noise = pi05_gaussian_noise(f.seed, H * A);
  }
  std::vector<float> action(size_t(H * A));

  const Clock::time_point t1 = Clock::now();
  meter.begin_phase("prefix");
  VLAC_RETURN_IF_ERROR(policy.run_prefix(obs));
  const Clock::time_point t2 = Clock::now();
  meter.begin_phase("denoise");
  VLAC_RETURN_IF_ERROR(policy.denoise(noise.data(), action.data()));
  const Clock::time_point t3 = Clock::now();
  // Where the memory is after the run (runtime/memory_report.h; the policy runs on the registry's
  // backend of that name, so its runtime's breakdown is this run's).
  if (Backend* b = backend_registry().find(dev.backend))
    meter.add_extra("memory_breakdown", memory_breakdown_json(&b->runtime(), "", &meter));
  meter.begin_phase("write");
  int64_t D = 0;  // width of `action` (0: no postprocessor in the folder)
  VLAC_RETURN_IF_ERROR(
      write_pi05_run_output(f.out, action.data(), H, A, model.config(), proc, obs, policy.bf16(), &D));
  if (!f.dump_dir.empty()) {
    if (::mkdir(f.dump_dir.c_str(), 0755) != 0 && errno != EEXIST) return errno_error("mkdir " + f.dump_dir, errno);
    VLAC_RETURN_IF_ERROR(policy.intermediates().write(f.dump_dir + "/intermediates.safetensors"));
  }
  meter.end_phase();

  const int64_t P = int64_t(obs.cameras.size()) * model.image_tokens() + int64_t(obs.tokens.size());
  meter.add_extra("dtype", policy.bf16() ? "\"bf16\"" : "\"fp32\"");
  meter.add_extra("prefix_tokens", std::to_string(P));
  meter.add_extra("cameras_present", std::to_string(obs.cameras.size()));
  meter.add_extra("prompt_tokenized", obs.prompt.empty() ? "false" : "true");
  meter.add_extra("weights_mapped_bytes", std::to_string(policy.weights().mapped_bytes()));
  meter.add_extra("weights_owned_bytes", std::to_string(policy.weights().owned_bytes()));
  meter.add_extra("activation_bytes", std::to_string(policy.activation_bytes()));
  std::printf("vlac run: %s -> %s: action_normalized [%lld, %lld] (%s, %zu of %zu cameras, prefix %lld tokens)\n",
              f.policy.c_str(), f.out.c_str(), (long long)H, (long long)A, policy.bf16() ? "bf16" : "fp32",
              obs.cameras.size(), model.config().cameras.size(), (long long)P);
  if (D > 0)
    std::printf("  action [%lld, %lld] in robot units (lerobot postprocessor%s)\n", (long long)H, (long long)D,
                proc.absolute_enabled ? ", relative actions made absolute" : "");
  if (!obs.prompt.empty()) std::printf("  prompt: %zu tokens\n", obs.tokens.size());
  if (dev.gpu)
    std::printf("  weights: %s uploaded to the GPU, %s kept mapped (gathered rows only); activations %s on the GPU\n",
                format_bytes(policy.weights().owned_bytes()).c_str(), format_bytes(policy.weights().mapped_bytes()).c_str(),
                format_bytes(policy.activation_bytes()).c_str());
  else
    std::printf("  weights: %s mapped in place, %s converted; activations %s\n",
                format_bytes(policy.weights().mapped_bytes()).c_str(), format_bytes(policy.weights().owned_bytes()).c_str(),
                format_bytes(policy.activation_bytes()).c_str());
  std::printf("  %s\n", dev.summary(policy.bf16()).c_str());
  std::printf("  latency: load %.1f ms, prefix %.1f ms, denoise %.1f ms (%lld steps, %.1f ms each)\n", ms(t0, t1),
              ms(t1, t2), ms(t2, t3), (long long)model.euler().steps, ms(t2, t3) / double(model.euler().steps));
  return Status::ok();
}

}  // namespace

void register_run(CLI::App& app) {
  auto flags = std::make_shared<RunFlags>();
  auto* sub = app.add_subcommand("run", "run a pi0.5 policy folder or package on one observation and write its action chunk");
  sub->add_option("policy", flags->policy, "policy folder (config.json + model.safetensors) or a .vlac package")->required();
  sub->add_option("--obs", flags->obs, "observation safetensors (lerobot keys)")->required();
  sub->add_option("--out", flags->out,
                  "output safetensors: action_normalized [chunk_size, max_action_dim] and, with lerobot's "
                  "processor files in the folder, action [chunk_size, action_dim] in robot units")
      ->required();
  sub->add_option("--noise", flags->noise, "safetensors with 'noise' [chunk_size, max_action_dim] float32");
  sub->add_option("--seed", flags->seed, "seed of the Gaussian noise when --noise is not given (default 0)");
  sub->add_option("--dtype", flags->dtype, "weight precision: fp32 or bf16 (default: the config's dtype)");
  sub->add_option("--dump-intermediates", flags->dump_dir,
                  "write DIR/intermediates.safetensors (names as lerobot's fixtures)");
  sub->add_option("--threads", flags->threads, "CPU threads for matmuls and kernels (default 2)");
  sub->add_option("--device", flags->device,
                  "cpu (default for folders), cuda (the GPU), or auto (cuda when a GPU is present); for a package "
                  "it overrides the backend its engines name (a CPU package's engines run on cuda too)");
  sub->add_flag("--pack-weights", flags->pack_weights,
                "reorder Linear weights once into oneDNN's blocked layout: faster matmuls (mostly the "
                "denoising steps), but a packed copy of the weights in memory instead of using them in place");
  sub->add_option("--mem-budget", flags->mem_budget,
                  "packages: keep mapped weights + activations under SIZE (e.g. 2GiB) by streaming engines");
  sub->add_option("--repeat", flags->repeat,
                  "packages: run the observation N times (steady-state latency); a package replaced on disk "
                  "(atomic rename) is reopened between runs");
  sub->add_option("--task", flags->task, "task sentence for the prompt (default: OBS __metadata__ 'task')");
  sub->add_option("--tokenizer", flags->tokenizer,
                  "SentencePiece tokenizer.model (or a folder holding it); default: POLICY/tokenizer/");
  add_common_options(sub, &flags->common);
  sub->callback([flags] { run_command("run", flags->common, [&](MemMeter& m) { return run_policy(*flags, m); }); });
}

}  // namespace vlac::cli
