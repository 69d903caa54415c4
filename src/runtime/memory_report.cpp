// GPU probe and memory breakdown (memory_report.h).
#include "runtime/memory_report.h"

#include <stdlib.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "backends/registry.h"
#include "mem/host_memory.h"

namespace vlac {

void install_gpu_probe(MemMeter& meter, const std::string& name) {
  Backend* b = backend_registry().find(name);
  if (!b) {
    meter.note_no_gpu_probe("backend '" + name + "' is not in this build");
    return;
  }
  const DeviceInfo d = b->device();
  if (d.memory == MemoryKind::Host) {
    meter.note_no_gpu_probe("backend '" + name + "' runs on the host");
    return;
  }
  if (d.compute_major == 0) {
    meter.note_no_gpu_probe(d.description.empty() ? "backend '" + name + "' sees no GPU" : d.description);
    return;
  }
  if (d.total_memory == 0) {
    meter.note_no_gpu_probe("backend '" + name + "' reads no device memory figures (neither NVML nor cudaMemGetInfo)");
    return;
  }
  // Device-wide used memory; the first reading is the idle level (before this process's context
  // where the backend reads it without one: DeviceInfo::memory_source says).
  meter.set_gpu_probe(
      [b]() -> std::optional<uint64_t> {
        const DeviceInfo i = b->device();
        if (i.total_memory == 0) return std::nullopt;
        return i.total_memory - i.free_memory;
      },
      name + ": " + (d.memory_source.empty() ? std::string("DeviceInfo total - free") : d.memory_source));
}

std::string memory_breakdown_json(const BackendRuntime* runtime, const std::string& package_path, MemMeter* meter) {
  using nlohmann::json;
  json gpu = json::object();
  // A plain value and a flag, not the optional itself: GCC 12 warned it "may be used
  // uninitialized" through the ternaries below (-Wmaybe-uninitialized, a false positive).
  const std::optional<int64_t> above_now = meter ? meter->gpu_above_idle_now() : std::nullopt;
  const bool has_above = above_now.has_value();
  const int64_t above = above_now.value_or(0);
  gpu["above_idle_bytes"] = has_above ? json(above) : json(nullptr);
  if (runtime) {
    const auto items = runtime->memory_breakdown();
    int64_t attributed = 0;
    bool any = false;
    auto get = [&](const std::string& k) -> int64_t {
      for (const auto& [n, v] : items)
        if (n == k) return v;
      return -1;
    };
    for (const auto& [k, v] : items) {
      gpu[k] = v;
      if (k.rfind("device.", 0) == 0) attributed += v, any = true;
    }
    // The context as created minus what the smaller stack limit gave back, the cuBLASLt handle
    // and the graphs (NVML deltas), then every live device allocation (device.*).
    const int64_t ctx = get("context_bytes"), saved = get("stack_limit_saved_bytes"), handle = get("cublaslt_handle_bytes"),
                  graphs = get("graph_bytes");
    if (ctx >= 0) attributed += ctx - std::max<int64_t>(saved, 0);
    if (handle > 0) attributed += handle;
    if (graphs > 0) attributed += graphs;
    if (any) {
      gpu["attributed_bytes"] = attributed;
      gpu["unattributed_bytes"] = has_above ? json(above - attributed) : json(nullptr);
    }
  }
  std::string canonical = package_path;
  if (!package_path.empty())
    if (char* r = ::realpath(package_path.c_str(), nullptr)) {
      canonical = r;
      ::free(r);
    }
  const HostMemory h = read_host_memory(12, canonical.empty() ? std::vector<std::string>{}
                                                              : std::vector<std::string>{canonical});
  json host = json::parse(host_memory_json(h));
  if (!canonical.empty())
    for (const HostMapping& m : h.by_mapping)
      if (m.name == canonical) host["package_resident_bytes"] = m.rss_bytes;
  return json::object({{"gpu", gpu}, {"host", host}}).dump();
}

}  // namespace vlac
