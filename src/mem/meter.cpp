// Memory meter implementation: /proc readers, the sampler thread, JSON.
#include "mem/meter.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "core/atomic_file.h"
#include "core/bytes.h"

namespace vlac {

namespace {

// Reads a small /proc file into buf without allocating; returns bytes read.
size_t read_proc(const char* path, char* buf, size_t cap) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  size_t n = 0;
  while (n + 1 < cap) {
    ssize_t r = ::read(fd, buf + n, cap - 1 - n);
    if (r <= 0) break;
    n += static_cast<size_t>(r);
  }
  ::close(fd);
  buf[n] = '\0';
  return n;
}

// Finds "key:   123 kB" in buf and returns the value in bytes.
uint64_t find_kb(const char* buf, const char* key) {
  const char* p = std::strstr(buf, key);
  if (p == nullptr) return 0;
  p += std::strlen(key);
  while (*p == ' ' || *p == '\t' || *p == ':') ++p;
  return std::strtoull(p, nullptr, 10) * 1024ull;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace

uint64_t system_used_bytes() {
  char buf[4096];
  if (read_proc("/proc/meminfo", buf, sizeof buf) == 0) return 0;
  uint64_t total = find_kb(buf, "MemTotal");
  uint64_t avail = find_kb(buf, "MemAvailable");
  return total > avail ? total - avail : 0;
}

uint64_t process_peak_rss_bytes() {
  char buf[4096];
  if (read_proc("/proc/self/status", buf, sizeof buf) == 0) return 0;
  return find_kb(buf, "VmHWM");
}

uint64_t process_rss_bytes() {
  char buf[4096];
  if (read_proc("/proc/self/status", buf, sizeof buf) == 0) return 0;
  return find_kb(buf, "VmRSS");
}

bool reset_peak_rss() {
  int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, "5", 1) == 1;
  ::close(fd);
  return ok;
}

MemMeter::MemMeter(std::string command, std::chrono::microseconds interval)
    : command_(std::move(command)), interval_(interval) {
  t0_ = std::chrono::steady_clock::now();
  idle_used_ = system_used_bytes();
  report_.command = command_;
  report_.system_idle_used_bytes = idle_used_;
  sampler_ = std::thread([this] { sample_loop(); });
}

MemMeter::~MemMeter() {
  stop_ = true;
  if (sampler_.joinable()) sampler_.join();
}

void MemMeter::set_gpu_probe(GpuUsedProbe probe, std::string source) {
  std::lock_guard<std::mutex> lock(mu_);
  gpu_probe_ = std::move(probe);
  gpu_idle_.reset();
  if (!gpu_probe_) {
    report_.gpu_probe = "none: an empty GPU probe was installed";
    return;
  }
  gpu_idle_ = gpu_probe_();
  report_.gpu_probe = gpu_idle_ ? std::move(source)
                                : "none: the GPU probe (" + source + ") gave no reading at start, so there is no idle level";
}

void MemMeter::note_no_gpu_probe(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!gpu_idle_) report_.gpu_probe = "none: " + why;
}

std::optional<int64_t> MemMeter::gpu_above_idle_now() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!gpu_probe_ || !gpu_idle_) return std::nullopt;
  auto used = gpu_probe_();
  if (!used) return std::nullopt;
  return static_cast<int64_t>(*used) - static_cast<int64_t>(*gpu_idle_);
}

void MemMeter::sample_once() {
  const uint64_t rss = process_rss_bytes();
  uint64_t pr = phase_peak_rss_.load();
  while (rss > pr && !phase_peak_rss_.compare_exchange_weak(pr, rss)) {}
  int64_t sys = static_cast<int64_t>(system_used_bytes()) - static_cast<int64_t>(idle_used_);
  int64_t prev = phase_peak_sys_.load();
  while (sys > prev && !phase_peak_sys_.compare_exchange_weak(prev, sys)) {}
  if (gpu_probe_ && gpu_idle_) {
    if (auto used = gpu_probe_()) {
      int64_t g = static_cast<int64_t>(*used) - static_cast<int64_t>(*gpu_idle_);
      int64_t pg = phase_peak_gpu_.load();
      while (g > pg && !phase_peak_gpu_.compare_exchange_weak(pg, g)) {}
    }
  }
}

void MemMeter::sample_loop() {
  while (!stop_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      sample_once();
    }
    std::this_thread::sleep_for(interval_);
  }
}

void MemMeter::begin_phase(const std::string& name) {
  end_phase();
  std::lock_guard<std::mutex> lock(mu_);
  phase_hwm0_ = process_peak_rss_bytes();
  phase_peak_rss_ = 0;
  phase_peak_sys_ = 0;
  phase_peak_gpu_ = 0;
  sample_once();
  current_ = PhaseReport{};
  current_->name = name;
  phase_t0_ = std::chrono::steady_clock::now();
}

void MemMeter::end_phase() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!current_) return;
  sample_once();
  current_->wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - phase_t0_).count();
  const uint64_t hwm = process_peak_rss_bytes();
  current_->peak_rss_bytes = hwm > phase_hwm0_ ? hwm : phase_peak_rss_.load();
  current_->peak_system_above_idle_bytes = phase_peak_sys_.load();
  if (gpu_probe_ && gpu_idle_) current_->peak_gpu_above_idle_bytes = phase_peak_gpu_.load();
  report_.phases.push_back(std::move(*current_));
  current_.reset();
}

void MemMeter::add_extra(const std::string& key, const std::string& json_value) {
  std::lock_guard<std::mutex> lock(mu_);
  report_.extra_json.emplace_back(key, json_value);
}

MemReport MemMeter::finish() {
  end_phase();
  stop_ = true;
  if (sampler_.joinable()) sampler_.join();
  std::lock_guard<std::mutex> lock(mu_);
  sample_once();
  report_.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  // Peaks over the whole command: the maximum over phases, and the time outside phases (RSS: the
  // never-reset high-water mark covers both).
  uint64_t rss = process_peak_rss_bytes();
  int64_t sys = phase_peak_sys_.load();
  std::optional<int64_t> gpu;
  if (gpu_probe_ && gpu_idle_) gpu = phase_peak_gpu_.load();
  for (const auto& p : report_.phases) {
    rss = std::max(rss, p.peak_rss_bytes);
    sys = std::max(sys, p.peak_system_above_idle_bytes);
    if (p.peak_gpu_above_idle_bytes) gpu = std::max(gpu.value_or(0), *p.peak_gpu_above_idle_bytes);
  }
  report_.peak_rss_bytes = rss;
  report_.peak_system_above_idle_bytes = sys;
  report_.peak_gpu_above_idle_bytes = gpu;
  return report_;
}

std::string MemReport::to_json() const {
  auto opt = [](const std::optional<int64_t>& v) { return v ? std::to_string(*v) : std::string("null"); };
  std::string s = "{\n";
  s += "  \"command\": \"" + json_escape(command) + "\",\n";
  char wall[64];
  std::snprintf(wall, sizeof wall, "%.6f", wall_seconds);
  s += "  \"wall_seconds\": " + std::string(wall) + ",\n";
  s += "  \"peak_rss_bytes\": " + std::to_string(peak_rss_bytes) + ",\n";
  s += "  \"system_idle_used_bytes\": " + std::to_string(system_idle_used_bytes) + ",\n";
  s += "  \"peak_system_above_idle_bytes\": " + std::to_string(peak_system_above_idle_bytes) + ",\n";
  s += "  \"peak_gpu_above_idle_bytes\": " + opt(peak_gpu_above_idle_bytes) + ",\n";
  s += "  \"gpu_probe\": \"" + json_escape(gpu_probe) + "\",\n";
  s += "  \"phases\": [";
  for (size_t i = 0; i < phases.size(); ++i) {
    const auto& p = phases[i];
    std::snprintf(wall, sizeof wall, "%.6f", p.wall_seconds);
    s += i ? ",\n    " : "\n    ";
    s += "{\"name\": \"" + json_escape(p.name) + "\", \"wall_seconds\": " + wall +
         ", \"peak_rss_bytes\": " + std::to_string(p.peak_rss_bytes) +
         ", \"peak_system_above_idle_bytes\": " + std::to_string(p.peak_system_above_idle_bytes) +
         ", \"peak_gpu_above_idle_bytes\": " + opt(p.peak_gpu_above_idle_bytes) + "}";
  }
  s += phases.empty() ? "]" : "\n  ]";
  for (const auto& [k, v] : extra_json) s += ",\n  \"" + json_escape(k) + "\": " + v;
  s += "\n}\n";
  return s;
}

std::string MemReport::summary_line() const {
  std::string s = "peak: rss " + format_bytes(peak_rss_bytes) + ", system " +
                  format_bytes_signed(peak_system_above_idle_bytes);
  if (peak_gpu_above_idle_bytes) s += ", gpu " + format_bytes_signed(*peak_gpu_above_idle_bytes);
  s += " (" + format_duration(wall_seconds) + ")";
  return s;
}

Status write_report_json(const MemReport& report, const std::string& path) {
  VLAC_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  std::string json = report.to_json();
  VLAC_RETURN_IF_ERROR(f.write(json.data(), json.size()));
  return f.commit();
}

}  // namespace vlac
