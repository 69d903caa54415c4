// `vlac demo OUT_DIR`: the main job on the built-in default: writes a small random pi0.5 policy
// folder, converts it to bf16, inspects the result and prints the memory of each phase.
// Hidden: `--synthetic-bytes SIZE OUT.safetensors` writes a plain fp32 file (benchmarks).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <thread>

#include "command.h"
#include "core/bytes.h"
#include "io/convert.h"
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

Status print_inspect_summary(const std::string& path, const Pi05Dims& dims) {
  VLAC_ASSIGN_OR_RETURN(TensorSet set, TensorSet::open(path));
  std::map<std::string, Pi05Part> part_of;
  for (const auto& w : pi05_weights(dims, Pi05Layout::FineTune)) part_of.emplace(w.name, w.part);
  std::map<std::string, uint64_t> by_part, by_dtype;
  std::map<std::string, uint64_t> n_by_part;
  uint64_t total = 0;
  for (const auto& e : set.tensors()) {
    auto it = part_of.find(e.info->name);
    std::string part = it == part_of.end() ? "other" : pi05_part_name(it->second);
    by_part[part] += e.info->nbytes();
    n_by_part[part] += 1;
    by_dtype[dtype_name(e.info->dtype)] += e.info->nbytes();
    total += e.info->nbytes();
  }
  std::printf("inspect %s: %zu tensors, %s\n", path.c_str(), set.tensors().size(), format_bytes(total).c_str());
  for (const auto& [part, bytes] : by_part)
    std::printf("  %-10s %5llu tensors  %10s\n", part.c_str(), static_cast<unsigned long long>(n_by_part[part]),
                format_bytes(bytes).c_str());
  for (const auto& [dt, bytes] : by_dtype) std::printf("  dtype %-5s %21s\n", dt.c_str(), format_bytes(bytes).c_str());
  return Status::ok();
}

Status run_demo(const DemoFlags& f, MemMeter& meter) {
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
  const std::string model = f.out + "/model.safetensors";
  const std::string bf16 = f.out + "/model.bf16.safetensors";
  PhaseWatch watch;

  meter.begin_phase("write-demo");
  watch.begin("write-demo");
  VLAC_RETURN_IF_ERROR(write_random_pi05_folder(f.out, dims, Pi05Layout::FineTune, f.seed));
  watch.end();
  std::printf("wrote pi0.5 %s policy %s (config.json + model.safetensors, fp32 random weights, seed %llu)\n",
              f.full ? "full-size" : "demo", f.out.c_str(), static_cast<unsigned long long>(f.seed));

  meter.begin_phase("convert");
  watch.begin("convert");
  ConvertOptions opt;
  opt.input = model;
  opt.output = bf16;
  opt.target = DType::BF16;
  ConvertStats stats;
  VLAC_RETURN_IF_ERROR(convert_checkpoint(opt, &stats));
  watch.end();
  std::printf("converted to bf16: %llu tensors, %s -> %s in %s: %s\n",
              static_cast<unsigned long long>(stats.n_tensors), format_bytes(stats.input_bytes).c_str(),
              format_bytes(stats.output_bytes).c_str(), format_duration(stats.seconds).c_str(), bf16.c_str());

  meter.begin_phase("inspect");
  watch.begin("inspect");
  VLAC_RETURN_IF_ERROR(print_inspect_summary(bf16, dims));
  watch.end();
  meter.end_phase();

  std::printf("memory per phase:\n");
  for (const auto& r : watch.rows())
    std::printf("  %-11s %9s  peak rss %10s  system %11s\n", r.name.c_str(), format_duration(r.seconds).c_str(),
                format_bytes(r.peak_rss).c_str(), format_bytes_signed(r.peak_sys).c_str());
  meter.add_extra("model_fp32_bytes", std::to_string(stats.input_bytes));
  meter.add_extra("model_bf16_bytes", std::to_string(stats.output_bytes));
  meter.add_extra("tensors", std::to_string(stats.n_tensors));
  std::fflush(stdout);  // before the meter's summary line on stderr
  return Status::ok();
}

}  // namespace

void register_demo(CLI::App& app) {
  auto flags = std::make_shared<DemoFlags>();
  auto* sub = app.add_subcommand(
      "demo", "write a small random pi0.5 policy, convert it to bf16, inspect it, report memory per phase");
  sub->add_option("OUT_DIR", flags->out, "folder for the demo policy (created if missing)")->required();
  sub->add_option("--seed", flags->seed, "seed of the random weights (default 0)");
  sub->add_flag("--full", flags->full, "full-size pi0.5 (about 16.5 GB of fp32) instead of the small demo");
  sub->add_option("--synthetic-bytes", flags->synthetic_bytes,
                  "(benchmarks) write one fp32 .safetensors of SIZE tensor bytes to OUT_DIR, nothing else")
      ->group("");
  add_common_options(sub, &flags->common);
  sub->callback([flags] {
    run_command("demo", flags->common, [&](MemMeter& meter) { return run_demo(*flags, meter); });
  });
}

}  // namespace vlac::cli
