// Which registry backend runs a policy, from a device name: the one policy behind `vlac run
// --device`, vlac.Policy.from_pretrained(device=) and `vlac serve --device` (Pi05Session).
//   "cpu"  the CPU backend;
//   "cuda" the CUDA backend: built into this vlac and seeing a GPU, else one Unsupported error
//          (exit 2) saying which of the two is missing;
//   "auto" cuda when it is built in and sees a GPU, else the CPU (never an error);
//   ""     `fallback` (vlac run: "cpu" for a policy folder, "" for a package).
// For a package a named device overrides the backends its manifest's engines name (the engines
// are re-bound by name: PackageRunOptions::backend), so a CPU package runs on the GPU and the
// other way round; backend "" keeps the manifest's.
#pragma once

#include <string>

#include "core/status.h"
#include "ir/backend.h"

namespace vlac {

struct DeviceChoice {
  std::string backend;  // registry name that runs ("cpu", "cuda"), or "" (a package's own)
  bool gpu = false;     // backend is a GPU that sees a device
  DeviceInfo device;    // the GPU's DeviceInfo when gpu
};

/// `device` resolved as above. `what` names the setting in errors ("--device", "device").
Result<DeviceChoice> choose_device(const std::string& device, const std::string& fallback,
                                   const std::string& what = "--device");

}  // namespace vlac
