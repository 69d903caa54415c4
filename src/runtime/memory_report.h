// The glue between the meter (mem/, which knows no backend) and the backends: the GPU probe of a
// registry backend, and the memory breakdown a run reports (where every byte is: the backend's
// context, weights, activations, workspace..., the host's RSS by mapping). Read at phase ends
// (a few ms: /proc/self/smaps), never per chunk.
#pragma once

#include <string>

#include "ir/backend.h"
#include "mem/meter.h"

namespace vlac {

/// Installs the registry backend `backend`'s device-wide used memory (DeviceInfo total - free)
/// as the meter's GPU probe when it runs on a GPU; otherwise the report says why there is none.
/// Call it before the backend's first use, so the first reading is the idle level.
void install_gpu_probe(MemMeter& meter, const std::string& backend);

/// One JSON object, now:
///   "gpu": {"above_idle_bytes": (meter probe, null without one), <the runtime's memory_breakdown()>,
///           "attributed_bytes": the context + cuBLASLt handle + graphs + live device allocations,
///           "unattributed_bytes": above idle - attributed (lazily loaded kernel modules, the
///           driver's allocation granularity, cuBLASLt's own, local memory grown for a kernel)}
///   "host": mem/host_memory's RSS by mapping, `package_path` always listed (its resident bytes).
/// Without a backend runtime (nullptr) or before it ran, "gpu" has only above_idle_bytes.
std::string memory_breakdown_json(const BackendRuntime* runtime, const std::string& package_path, MemMeter* meter);

}  // namespace vlac
