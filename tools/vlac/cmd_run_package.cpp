// `vlac run OUT.vlac ...`: the same command as for a policy folder, on a compiled package. Maps
// the package, loads engines lazily, optionally streams them under --mem-budget. Phases metered:
// load, prefix, denoise, write. No model logic here: see src/runtime/.
#include <chrono>
#include <cstring>
#include <cstdio>
#include <map>

#include "command.h"
#include "core/bytes.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "package/pi05_precision.h"
#include "policy/pi05_policy.h"
#include "runtime/memory_report.h"
#include "runtime/pi05_package_policy.h"

namespace vlac::cli {


Status run_package(const PackageRunArgs& f, MemMeter& meter) {
  VLAC_ASSIGN_OR_RETURN(DevicePath dev, device_path(f.device, "", meter));
  if (!f.dtype.empty() && f.dtype != "fp32" && f.dtype != "bf16")
    return invalid_argument("--dtype must be fp32 or bf16, got '" + f.dtype + "'");
  if (!f.dump_dir.empty()) return unsupported("--dump-intermediates works on policy folders only (a package keeps engine boundaries only)");
  if (f.threads < 1) return invalid_argument("--threads must be at least 1");
  if (f.repeat < 1) return invalid_argument("--repeat must be at least 1");
  Pi05PackageOptions opts;
  opts.threads = f.threads;
  opts.pack_weights = f.pack_weights;
  opts.backend = dev.backend;
  if (dev.gpu && f.pack_weights) return invalid_argument("--pack-weights applies to the CPU (--device cpu)");
  if (!f.mem_budget.empty()) {
    VLAC_ASSIGN_OR_RETURN(opts.mem_budget, parse_size(f.mem_budget));
    if (opts.mem_budget == 0) return invalid_argument("--mem-budget must be positive");
  }
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  const Clock::time_point t0 = Clock::now();
  meter.begin_phase("load");
  VLAC_ASSIGN_OR_RETURN(Pi05PackagePolicy policy, Pi05PackagePolicy::open(f.package, opts));
  if (f.device.empty() && policy.runtime().memory_kind() != MemoryKind::Host) {
    // The manifest names a GPU backend: report that device (and meter it) instead of the CPU.
    VLAC_ASSIGN_OR_RETURN(dev, device_path("cuda", "", meter));
  }
  if (!f.dtype.empty() && (f.dtype == "bf16") != policy.bf16())
    return invalid_argument(f.package + ": the package was compiled for " + std::string(policy.bf16() ? "bf16" : "fp32") +
                            "; --dtype " + f.dtype + " needs a package compiled with that dtype");
  Pi05Processor proc = policy.processor();
  if (!f.tokenizer.empty()) {
    VLAC_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_path(f.tokenizer));
    proc.set_tokenizer(std::move(tok));
  }
  const int64_t vocab = policy.package().manifest().policy.value("vocab", int64_t{0});
  VLAC_ASSIGN_OR_RETURN(Pi05Observation obs,
                        read_pi05_observation(f.obs, policy.config(), policy.channels(), &proc, f.task, vocab));
  const int64_t H = policy.chunk_size(), A = policy.max_action_dim();
  std::vector<float> noise;
  if (!f.noise.empty()) {
    VLAC_ASSIGN_OR_RETURN(noise, read_pi05_noise(f.noise, H, A));
  } else {
    noise = pi05_gaussian_noise(f.seed, H * A);
  }
  std::vector<float> action(size_t(H * A));
  Clock::time_point t1 = Clock::now(), t2 = t1, t3 = t1;
  const double load_ms = ms(t0, t1);
  std::string repeats;  // per-iteration latency, for --repeat
  int reopened = 0;
  for (int it = 0; it < f.repeat; ++it) {
    if (it > 0 && policy.replaced_on_disk()) {
      // The running map stays valid; the new package is picked up between observations.
      VLAC_ASSIGN_OR_RETURN(Pi05PackagePolicy fresh, policy.reopen());
      policy = std::move(fresh);
      ++reopened;
      if (!f.quiet) std::fprintf(stderr, "vlac run: %s was replaced on disk: reopened it\n", f.package.c_str());
    }
    t1 = Clock::now();
    if (it > 0 && dev.gpu) {
      // On the GPU the repeats run whole chunks: recorded once (CUDA graphs), replayed after.
      meter.begin_phase("chunk.repeat");
      VLAC_RETURN_IF_ERROR(policy.run_chunk(obs, noise.data(), action.data()));
      t2 = t3 = Clock::now();
      repeats += std::string(repeats.empty() ? "" : ", ") + "{\"chunk\": " + std::to_string(ms(t1, t3)) + "}";
      continue;
    }
    meter.begin_phase(it == 0 ? "prefix" : "prefix.repeat");
    VLAC_RETURN_IF_ERROR(policy.run_prefix(obs));
    t2 = Clock::now();
    meter.begin_phase(it == 0 ? "denoise" : "denoise.repeat");
    VLAC_RETURN_IF_ERROR(policy.denoise(noise.data(), action.data()));
    t3 = Clock::now();
    repeats += std::string(repeats.empty() ? "" : ", ") + "{\"prefix\": " + std::to_string(ms(t1, t2)) +
               ", \"denoise\": " + std::to_string(ms(t2, t3)) + "}";
  }
  // Where the memory is after the run (the GPU's context, weights, activations...; the host's
  // RSS by mapping): read once here, not per chunk (runtime/memory_report.h).
  meter.add_extra("memory_breakdown", memory_breakdown_json(&policy.runtime(), f.package, &meter));
  meter.begin_phase("write");
  int64_t D = 0;  // width of `action` (0: no postprocessor in the package)
  VLAC_RETURN_IF_ERROR(
      write_pi05_run_output(f.out, action.data(), H, A, policy.config(), proc, obs, policy.bf16(), &D));
  meter.end_phase();
  const Pi05PackageStats& st = policy.stats();
  const int64_t P = int64_t(obs.cameras.size()) * policy.image_tokens() + int64_t(obs.tokens.size());
  meter.add_extra("dtype", policy.bf16() ? "\"bf16\"" : "\"fp32\"");
  meter.add_extra("prefix_tokens", std::to_string(P));
  meter.add_extra("cameras_present", std::to_string(obs.cameras.size()));
  meter.add_extra("package_weight_bytes", std::to_string(policy.weight_bytes()));
  meter.add_extra("mem_budget", std::to_string(opts.mem_budget));
  meter.add_extra("engines_loaded", std::to_string(st.engines_loaded));
  meter.add_extra("evictions", std::to_string(st.evictions));
  meter.add_extra("evicted_bytes", std::to_string(st.evicted_bytes));
  meter.add_extra("peak_resident_weight_bytes", std::to_string(st.peak_resident_weight_bytes));
  meter.add_extra("activation_bytes", std::to_string(st.activation_bytes));
  meter.add_extra("packed_weight_bytes", std::to_string(st.packed_weight_bytes));
  meter.add_extra("iterations_ms", "[" + repeats + "]");
  {
    auto list = [](const std::vector<double>& v) {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
      return out + "]";
    };
    meter.add_extra("stage_ms", "{\"vision_per_camera\": " + list(st.vision_ms) + ", \"text\": " +
                                    std::to_string(st.text_ms) + ", \"prefix_lm\": " + std::to_string(st.lm_ms) +
                                    ", \"denoise_steps\": " + list(st.step_ms) + "}");
  }
  meter.add_extra("reopened", std::to_string(reopened));
  meter.add_extra("latency_ms", "{\"load\": " + std::to_string(load_ms) + ", \"prefix\": " + std::to_string(ms(t1, t2)) +
                                    ", \"denoise\": " + std::to_string(ms(t2, t3)) + "}");
  std::printf("vlac run: %s -> %s: action_normalized [%lld, %lld]%s (%s package, %zu of %zu cameras, prefix %lld tokens)\n",
              f.package.c_str(), f.out.c_str(), (long long)H, (long long)A,
              D == 0 ? "" : (" + action [" + std::to_string(H) + ", " + std::to_string(D) + "]").c_str(),
              pi05_precision::short_name(policy.package().manifest().policy.value("precision", std::string()), policy.bf16()).c_str(), obs.cameras.size(), policy.config().cameras.size(), (long long)P);
  if (st.packed_weight_bytes > 0)
    std::printf("  weights: %s in the package, packed copies %s (--pack-weights); activations %s; %d engines loaded\n",
                format_bytes(policy.weight_bytes()).c_str(), format_bytes(st.packed_weight_bytes).c_str(),
                format_bytes(st.activation_bytes).c_str(), st.engines_loaded);
  else
    std::printf("  weights: %s in the package, mapped in place; activations %s; %d engines loaded\n",
                format_bytes(policy.weight_bytes()).c_str(), format_bytes(st.activation_bytes).c_str(), st.engines_loaded);
  if (opts.mem_budget)
    std::printf("  budget %s: %llu evictions, %s re-read from the package (the cost of streaming)\n",
                format_bytes(opts.mem_budget).c_str(), (unsigned long long)st.evictions,
                format_bytes(st.evicted_bytes).c_str());
  std::printf("  %s\n", dev.summary(policy.bf16()).c_str());
  if (dev.gpu && f.repeat > 1)
    std::printf("  chunks: %d repeats as whole chunks, %llu replayed from a CUDA graph\n", f.repeat - 1,
                (unsigned long long)policy.chunk_replays());
  if (dev.gpu && f.repeat > 1)
    std::printf("  latency (last of the repeats): load %.1f ms, chunk %.2f ms (prefix + %lld steps + the actions' "
                "download)\n",
                load_ms, ms(t1, t3), (long long)policy.steps());
  else
    std::printf("  latency%s: load %.1f ms, prefix %.1f ms, denoise %.1f ms (%lld steps, %.1f ms each)\n",
                f.repeat > 1 ? " (last of the repeats)" : "", load_ms, ms(t1, t2), ms(t2, t3),
                (long long)policy.steps(), ms(t2, t3) / double(policy.steps()));
  return Status::ok();
}

}  // namespace vlac::cli
