// The CPU path a run takes, as the backend registry's DeviceInfo reports it (the CLI names no
// backend's headers): the report fields and the `cpu:` line for the weights' dtype.
#include "backends/registry.h"
#include "command.h"

namespace vlac::cli {

Result<DeviceInfo> cpu_device(MemMeter& meter) {
  VLAC_ASSIGN_OR_RETURN(Backend * cpu, backend_registry().get(kDefaultBackend, "vlac"));
  DeviceInfo d = cpu->device();
  if (!d.error.empty()) return invalid_argument(d.error);
  for (const auto& [name, json] : d.report) meter.add_extra(name, json);
  return d;
}

std::string cpu_line(const DeviceInfo& d, bool bf16_weights) {
  return d.detail + (bf16_weights ? ", bf16 weights via " + d.bf16_path : ", fp32 weights via " + d.f32_path);
}

}  // namespace vlac::cli
