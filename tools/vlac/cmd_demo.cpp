// `vlac demo OUT_DIR`: the main job on the built-in default: writes a small random pi0.5 policy
// folder (lerobot layout), compiles it to a .vlac package under an engine cap, runs the package
// on a sample observation and prints the actions with the memory and latency of each phase.
// Hidden: `--synthetic-bytes SIZE OUT.safetensors` writes a plain fp32 file (benchmarks).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <thread>

#include "command.h"
#include "core/bytes.h"
#include "compile/pi05_compile.h"
#include "io/convert.h"
#include "io/safetensors_writer.h"
#include "policy/pi05_policy.h"
#include "runtime/pi05_package_policy.h"
#include "io/safetensors.h"
#include "models/pi05_arch.h"
#include "models/pi05_demo.h"

namespace vlac::cli {

namespace {

struct DemoFlags {
  CommonOptions common;
  std::string out;
  uint64_t seed = 0;
  bool full = false;
  std::string engine_cap = "256KiB";
  std::string synthetic_bytes;
};

// Per-phase figures for the printed table: the meter keeps its own (for --report-json) but
// does not expose them before the command ends, so this samples alongside it.
class PhaseWatch {
 public:
  struct Row { std::string name; double seconds; uint64_t peak_rss; int64_t peak_sys; };

  PhaseWatch() : idle_(static_cast<int64_t>(system_used_bytes())) {
    sampler_ = std::thread([this] {
      while (!stop_) {
        int64_t s = static_cast<int64_t>(system_used_bytes()) - idle_;
        int64_t p = peak_.load();
        while (s > p && !peak_.compare_exchange_weak(p, s)) {}
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }
  ~PhaseWatch() {
    stop_ = true;
    sampler_.join();
  }
  /// Call right after MemMeter::begin_phase (which resets the peak RSS).
  void begin(const std::string& name) {
    name_ = name;
    peak_ = 0;
    t0_ = std::chrono::steady_clock::now();
  }
  void end() {
    int64_t s = static_cast<int64_t>(system_used_bytes()) - idle_;
    int64_t p = std::max(peak_.load(), s);
    rows_.push_back({name_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(),
                     process_peak_rss_bytes(), p});
  }
  const std::vector<Row>& rows() const { return rows_; }

 private:
  int64_t idle_;
  std::atomic<int64_t> peak_{0};
  std::atomic<bool> stop_{false};
  std::thread sampler_;
  std::string name_;
  std::chrono::steady_clock::time_point t0_;
  std::vector<Row> rows_;
};

Status run_demo(const DemoFlags& f, MemMeter& meter) {
  VLAC_ASSIGN_OR_RETURN(const DeviceInfo cpu, cpu_device(meter));
  if (!f.synthetic_bytes.empty()) {
    auto size = parse_size(f.synthetic_bytes);
    if (!size.is_ok()) return size.status().with_context("--synthetic-bytes");
    meter.begin_phase("write-synthetic");
    VLAC_RETURN_IF_ERROR(write_synthetic_checkpoint(f.out, size.value(), f.seed));
    meter.end_phase();
    std::printf("wrote synthetic fp32 checkpoint %s (%s of tensors)\n", f.out.c_str(),
                format_bytes(size.value() / 4 * 4).c_str());
    return Status::ok();
  }
  const Pi05Dims dims = f.full ? Pi05Dims::full() : Pi05Dims::demo();
  const std::string policy = f.out + "/policy";
  const std::string package = f.out + "/policy.vlac";
  const std::string obs_path = f.out + "/observation.safetensors";
  const std::string actions_path = f.out + "/actions.safetensors";
  PhaseWatch watch;

  meter.begin_phase("write-demo");
  watch.begin("write-demo");
  VLAC_RETURN_IF_ERROR(write_random_pi05_folder(policy, dims, Pi05Layout::FineTune, f.seed));
  VLAC_RETURN_IF_ERROR(write_pi05_sample_observation(policy, obs_path, 12, f.seed));
  watch.end();
  std::printf("1. wrote a %s pi0.5 policy folder %s (lerobot layout: config.json + model.safetensors, fp32 random "
              "weights, seed %llu) and a sample observation %s\n",
              f.full ? "full-size" : "demo-size", policy.c_str(), static_cast<unsigned long long>(f.seed), obs_path.c_str());

  meter.begin_phase("compile");
  watch.begin("compile");
  Pi05CompileOptions co;
  co.out = package;
  co.bf16 = true;
  VLAC_ASSIGN_OR_RETURN(co.engine_cap, parse_size(f.engine_cap));
  VLAC_ASSIGN_OR_RETURN(Pi05CompileSummary cs, compile_pi05(policy, co));
  watch.end();
  uint64_t largest = 0;
  std::string over;
  for (const auto& e : cs.engines) {
    largest = std::max(largest, e.weight_bytes);
    if (e.over_cap) over += (over.empty() ? "" : ", ") + e.name + " holds '" + e.over_cap_node + "' alone";
  }
  std::printf("2. compiled it to %s: %zu bf16 CPU engines under a %s cap (largest %s%s), %s of weights read, "
              "package %s\n",
              package.c_str(), cs.engines.size(), format_bytes(co.engine_cap).c_str(), format_bytes(largest).c_str(),
              over.empty() ? "" : ("; over the cap: " + over).c_str(), format_bytes(cs.source_weight_bytes).c_str(),
              format_bytes(cs.package_bytes).c_str());

  meter.begin_phase("load");
  watch.begin("load");
  VLAC_ASSIGN_OR_RETURN(Pi05PackagePolicy pol, Pi05PackagePolicy::open(package));
  VLAC_ASSIGN_OR_RETURN(Pi05Observation obs, read_pi05_observation(obs_path, pol.config(), pol.channels(), nullptr, "",
                                                                   dims.vocab));
  watch.end();
  meter.begin_phase("prefix");
  watch.begin("prefix");
  VLAC_RETURN_IF_ERROR(pol.run_prefix(obs));
  watch.end();
  meter.begin_phase("denoise");
  watch.begin("denoise");
  const int64_t H = pol.chunk_size(), A = pol.max_action_dim();
  std::vector<float> noise = pi05_gaussian_noise(f.seed, H * A), action(size_t(H * A));
  VLAC_RETURN_IF_ERROR(pol.denoise(noise.data(), action.data()));
  watch.end();
  {
    VLAC_ASSIGN_OR_RETURN(SafetensorsWriter w, SafetensorsWriter::create(actions_path, {{"action_normalized", DType::F32, {H, A}}},
                                                                         {{"producer", "vlac demo"}}));
    VLAC_RETURN_IF_ERROR(w.write(action.data(), action.size() * 4));
    VLAC_RETURN_IF_ERROR(w.finish());
  }
  meter.end_phase();
  std::printf("3. ran the package on the observation (%zu cameras, %zu prompt tokens, %lld denoising steps): "
              "action_normalized [%lld, %lld] -> %s\n",
              obs.cameras.size(), obs.tokens.size(), (long long)pol.steps(), (long long)H, (long long)A, actions_path.c_str());
  std::printf("   cpu: %s\n", cpu_line(cpu, true).c_str());
  const int64_t show_dims = std::min<int64_t>(A, 6);
  for (int64_t h = 0; h < std::min<int64_t>(H, 3); ++h) {
    std::printf("   t=%lld:", (long long)h);
    for (int64_t a = 0; a < show_dims; ++a) std::printf(" %+.4f", action[size_t(h * A + a)]);
    std::printf(" ...\n");
  }
  std::printf("memory and latency per phase:\n");
  for (const auto& r : watch.rows())
    std::printf("  %-11s %9s  peak rss %10s  system %11s\n", r.name.c_str(), format_duration(r.seconds).c_str(),
                format_bytes(r.peak_rss).c_str(), format_bytes_signed(r.peak_sys).c_str());
  meter.add_extra("package_bytes", std::to_string(cs.package_bytes));
  meter.add_extra("engines", std::to_string(cs.engines.size()));
  meter.add_extra("engine_cap", std::to_string(co.engine_cap));
  std::fflush(stdout);  // before the meter's summary line on stderr
  return Status::ok();
}

}  // namespace

void register_demo(CLI::App& app) {
  auto flags = std::make_shared<DemoFlags>();
  auto* sub = app.add_subcommand(
      "demo", "the whole flow on a small random pi0.5: write the policy folder, compile it, run it, memory per phase");
  sub->add_option("OUT_DIR", flags->out, "folder for the demo policy (created if missing)")->required();
  sub->add_option("--seed", flags->seed, "seed of the random weights (default 0)");
  sub->add_flag("--full", flags->full, "full-size pi0.5 (about 16.5 GB of fp32) instead of the small demo");
  sub->add_option("--engine-cap", flags->engine_cap, "engine cap of the compile step (default 256KiB, so the demo shows several engines)");
  sub->add_option("--synthetic-bytes", flags->synthetic_bytes,
                  "(benchmarks) write one fp32 .safetensors of SIZE tensor bytes to OUT_DIR, nothing else")
      ->group("");
  add_common_options(sub, &flags->common);
  sub->callback([flags] {
    run_command("demo", flags->common, [&](MemMeter& meter) { return run_demo(*flags, meter); });
  });
}

}  // namespace vlac::cli
