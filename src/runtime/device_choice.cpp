// choose_device (device_choice.h): the backend registry asked by name, a GPU told by its compute
// capability (the CUDA backend reports 0 without a device or a driver).
#include "runtime/device_choice.h"

#include "backends/registry.h"

namespace vlac {

Result<DeviceChoice> choose_device(const std::string& device, const std::string& fallback, const std::string& what) {
  std::string name = device.empty() ? fallback : device;
  Backend* cuda = backend_registry().find("cuda");
  if (name == "auto") name = cuda && cuda->device().compute_major > 0 ? "cuda" : kDefaultBackend;
  DeviceChoice out;
  out.backend = name;
  if (name.empty() || name == kDefaultBackend) return out;
  if (name != "cuda") return invalid_argument(what + " must be cpu, cuda or auto, got '" + name + "'");
  if (!cuda) return unsupported(what + " cuda: this vlac was built without the CUDA backend (no nvcc at build time)");
  out.device = cuda->device();
  if (out.device.compute_major == 0) return unsupported(what + " cuda: " + out.device.description);
  out.gpu = true;
  return out;
}

}  // namespace vlac
