// Shared plumbing for vlac subcommands: common flags (--report-json), the memory meter around
// every command, one-line errors and the exit-code convention (0 ok, 2 bad input, 1 other).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "core/status.h"
#include "ir/backend.h"
#include "mem/meter.h"

namespace vlac::cli {

struct CommonOptions {
  std::string report_json;  // --report-json FILE
  bool quiet = false;       // --quiet: no summary line
};

/// Adds --report-json and --quiet to a subcommand.
void add_common_options(CLI::App* sub, CommonOptions* opts);

/// Runs `body` with a meter named `name`: prints "vlac NAME: error: ..." on failure, the
/// summary line on stderr, writes the report if asked, and records the exit code.
void run_command(const std::string& name, const CommonOptions& opts,
                 const std::function<Status(MemMeter&)>& body);

/// The CPU device from the backend registry (cpu_path.cpp): its error (a bad VLAC_MAX_CPU_ISA)
/// is the command's error; its report fields (cpu_isa, cpu_isa_native, cpu_isa_cap, onednn_isa,
/// bf16_matmul, bf16_path) go into the report.
Result<DeviceInfo> cpu_device(MemMeter& meter);
/// The `cpu:` line: the path and how weights of the run's dtype are multiplied.
std::string cpu_line(const DeviceInfo& d, bool bf16_weights);

/// `vlac run --device` resolved: the registry backend that runs ("" for a package: the ones its
/// manifest names), the summary line ("cpu: ..." or "device: cuda ..."), whether it is a GPU.
/// Records the device in the report and, for a GPU, installs the meter's GPU probe.
struct DevicePath {
  std::string backend;
  std::string line;  // the GPU's line ("device: cuda ..."); for the CPU see summary()
  bool gpu = false;
  DeviceInfo cpu;    // the CPU device (when the CPU runs)
  /// The summary line: the GPU's, or `cpu: ` + cpu_line for the weights' dtype.
  std::string summary(bool bf16_weights) const { return gpu ? line : "cpu: " + cpu_line(cpu, bf16_weights); }
};
/// `device`: cpu, cuda, auto (cuda when a GPU is present) or "" (then `fallback`).
Result<DevicePath> device_path(const std::string& device, const std::string& fallback, MemMeter& meter);

/// The exit code main() returns (set by run_command).
int& exit_code();

// One registration function per subcommand file (explicit, no static initializers).
void register_inspect(CLI::App& app);
void register_convert(CLI::App& app);
void register_demo(CLI::App& app);
void register_mem(CLI::App& app);
void register_mem_oom(CLI::App& mem);
void register_mem_plan(CLI::App& mem);
void register_mem_snapshot(CLI::App& mem);
void register_run(CLI::App& app);
void register_compile(CLI::App& app);
void register_serve(CLI::App& app);

/// `vlac run PACKAGE.vlac ...` (cmd_run_package.cpp); cmd_run dispatches to it on the magic.
struct PackageRunArgs {
  std::string package, obs, out, noise, dtype, dump_dir, task, tokenizer, mem_budget;
  uint64_t seed = 0;
  int threads = 2;
  int repeat = 1;      // run the observation this many times (reopening a replaced package between)
  bool pack_weights = false;
  bool quiet = false;
  std::string device;  // --device: cpu, cuda, auto; "" = the manifest's backends
};
Status run_package(const PackageRunArgs& args, MemMeter& meter);

}  // namespace vlac::cli
