// `vlac run --device`: which registry backend runs (cpu, cuda, auto), its line for the summary
// and the report's device fields, and the meter's GPU probe (runtime/memory_report: used memory
// through the backend's DeviceInfo; mem/ includes nothing of CUDA).
#include "command.h"
#include "core/bytes.h"
#include "runtime/device_choice.h"
#include "runtime/memory_report.h"

namespace vlac::cli {

Result<DevicePath> device_path(const std::string& device, const std::string& fallback, MemMeter& meter) {
  // The choice itself is the runtime's (runtime/device_choice: vlac.Policy and vlac serve share it).
  VLAC_ASSIGN_OR_RETURN(const DeviceChoice c, choose_device(device, fallback, "--device"));
  DevicePath out;
  out.backend = c.backend;
  if (!c.gpu) {
    VLAC_ASSIGN_OR_RETURN(out.cpu, cpu_device(meter));
    meter.add_extra("device", "\"cpu\"");
    return out;
  }
  const DeviceInfo& d = c.device;
  out.gpu = true;
  out.line = "device: " + d.description;
  meter.add_extra("device", "\"cuda\"");
  meter.add_extra("gpu", "\"" + d.description + "\"");
  meter.add_extra("gpu_compute_capability", "\"" + std::to_string(d.compute_major) + "." + std::to_string(d.compute_minor) + "\"");
  meter.add_extra("gpu_total_bytes", std::to_string(d.total_memory));
  install_gpu_probe(meter, "cuda");  // runtime/memory_report.h
  return out;
}

}  // namespace vlac::cli
