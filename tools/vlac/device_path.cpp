// `vlac run --device`: which registry backend runs (cpu, cuda, auto), its line for the summary
// and the report's device fields, and the meter's GPU probe (runtime/memory_report: used memory
// through the backend's DeviceInfo; mem/ includes nothing of CUDA).
#include "backends/registry.h"
#include "command.h"
#include "core/bytes.h"
#include "runtime/memory_report.h"

namespace vlac::cli {

namespace {

bool has_gpu(Backend* b) { return b && b->device().compute_major > 0; }

}  // namespace

Result<DevicePath> device_path(const std::string& device, const std::string& fallback, MemMeter& meter) {
  std::string name = device.empty() ? fallback : device;
  if (name == "auto") name = has_gpu(backend_registry().find("cuda")) ? "cuda" : "cpu";
  DevicePath out;
  out.backend = name;
  if (name.empty() || name == "cpu") {
    VLAC_ASSIGN_OR_RETURN(out.cpu, cpu_device(meter));
    meter.add_extra("device", "\"cpu\"");
    return out;
  }
  if (name != "cuda") return invalid_argument("--device must be cpu, cuda or auto, got '" + name + "'");
  Backend* b = backend_registry().find("cuda");
  if (!b) return unsupported("--device cuda: this vlac was built without the CUDA backend (no nvcc at build time)");
  const DeviceInfo d = b->device();
  if (d.compute_major == 0) return unsupported("--device cuda: " + d.description);
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
