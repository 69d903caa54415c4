// MemMeter: the memory meter every vlac command uses. The command's peak RSS is the kernel's
// high-water mark (VmHWM), never reset, so `/usr/bin/time -v` reports it or more (a reset through
// /proc/self/clear_refs also resets what getrusage reads at exit: docs/benchmarks.md). Per phase: the
// peak RSS is exact (VmHWM at its end) when the phase raised the process's high-water mark, else
// the largest VmRSS sampled during it; peak system used memory above the level at start
// (MemTotal - MemAvailable) and, where a GPU probe is installed, peak GPU memory above idle are
// sampled by a background thread. It never allocates in the sampling loop.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace vlac {

struct PhaseReport {
  std::string name;
  double wall_seconds = 0;
  uint64_t peak_rss_bytes = 0;             // VmHWM if the phase raised it, else the sampled VmRSS peak
  int64_t peak_system_above_idle_bytes = 0;
  std::optional<int64_t> peak_gpu_above_idle_bytes;
};

struct MemReport {
  std::string command;
  double wall_seconds = 0;
  uint64_t peak_rss_bytes = 0;
  uint64_t system_idle_used_bytes = 0;     // MemTotal - MemAvailable when the meter started
  int64_t peak_system_above_idle_bytes = 0;
  std::optional<int64_t> peak_gpu_above_idle_bytes;
  /// Where the GPU figures come from ("nvml", "cudaMemGetInfo"...) or, when they are null,
  /// "none: <why>" (no GPU probe installed, or its first reading failed).
  std::string gpu_probe = "none: no GPU probe installed (this command runs no GPU backend)";
  std::vector<PhaseReport> phases;
  /// Extra figures a command adds (bytes in/out, tensors, throughput...), as JSON text values.
  std::vector<std::pair<std::string, std::string>> extra_json;

  /// The exact report (bytes as integers).
  std::string to_json() const;
  /// "peak: rss 41.2 MiB, system +38.0 MiB[, gpu +1.0 GiB]"
  std::string summary_line() const;
};

/// Reads used GPU bytes (device-wide); installed by a GPU backend. Returns nullopt if unknown.
using GpuUsedProbe = std::function<std::optional<uint64_t>()>;

class MemMeter {
 public:
  /// Starts sampling every `interval` (default 5 ms).
  explicit MemMeter(std::string command, std::chrono::microseconds interval = std::chrono::microseconds(5000));
  ~MemMeter();
  MemMeter(const MemMeter&) = delete;
  MemMeter& operator=(const MemMeter&) = delete;

  /// Installs the GPU probe; its first reading is the idle level. `source` says where the
  /// readings come from (the report's gpu_probe). A probe whose first reading fails leaves the
  /// GPU figures null and the report says so.
  void set_gpu_probe(GpuUsedProbe probe, std::string source = "a GPU probe");
  /// Says why there is no GPU probe (the report's gpu_probe becomes "none: <why>").
  void note_no_gpu_probe(const std::string& why);
  /// GPU memory above the idle level now (one probe reading), or nullopt without a probe.
  std::optional<int64_t> gpu_above_idle_now();
  /// Ends the current phase (if any) and starts a new one.
  void begin_phase(const std::string& name);
  void end_phase();
  /// Adds a figure to the report's extra section (value is raw JSON text, e.g. "123" or "\"x\"").
  void add_extra(const std::string& key, const std::string& json_value);
  /// Stops sampling and returns the report. Call once.
  MemReport finish();

 private:
  void sample_loop();
  void sample_once();

  std::string command_;
  std::chrono::microseconds interval_;
  std::chrono::steady_clock::time_point t0_, phase_t0_;
  uint64_t idle_used_ = 0;
  std::optional<uint64_t> gpu_idle_;
  GpuUsedProbe gpu_probe_;
  std::string gpu_source_;
  std::atomic<int64_t> phase_peak_sys_{0};
  std::atomic<uint64_t> phase_peak_rss_{0};  // largest VmRSS sampled in the phase
  uint64_t phase_hwm0_ = 0;                  // VmHWM when the phase began
  std::atomic<int64_t> phase_peak_gpu_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::optional<PhaseReport> current_;
  MemReport report_;
  std::thread sampler_;
};

/// System used memory now: MemTotal - MemAvailable from /proc/meminfo, in bytes.
uint64_t system_used_bytes();
/// This process's peak RSS (VmHWM) and current RSS (VmRSS), in bytes.
uint64_t process_peak_rss_bytes();
uint64_t process_rss_bytes();
/// Resets VmHWM to the current RSS (writes 5 to /proc/self/clear_refs); false if not allowed.
bool reset_peak_rss();
/// Writes the report to `path` atomically (temporary name + rename).
Status write_report_json(const MemReport& report, const std::string& path);

}  // namespace vlac
