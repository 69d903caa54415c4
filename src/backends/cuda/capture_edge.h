// Programmatic edges inside a recorded chunk, for launches that vlac does not make itself.
//
// vlac's own kernels take part in programmatic dependent launch through their launch attribute
// (common.cuh). cuBLASLt launches its kernels itself, so a GEMM's node in a captured graph always
// waits for the kernel before it to finish, then pays the launch. The capture's edge into the next
// launch can be made programmatic instead (`set_capture_edge`), but that is only right for a
// kernel that waits for its predecessor itself (griddepcontrol.wait) before it reads: whether
// cuBLASLt's kernel for a plan does is not documented, so `late_copy` lets a probe find out
// (gemm.cpp, VLAC_GEMM_PDL).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/status.h"

namespace vlac::cuda {

/// Where a programmatic edge leaves its kernel: when all its blocks have let dependents launch
/// (griddepcontrol.launch_dependents) or exited, or as soon as all its blocks have started.
enum class EdgePort { Programmatic, LaunchCompletion };

/// While `stream` is being captured and its one dependency is a kernel node: makes the edge from
/// that node into the stream's next launch a programmatic one leaving at `port`. False, with
/// nothing changed, when not capturing, when PDL is off (pdl_enabled, kernels.h) or when
/// the dependency is not a single kernel node.
bool set_capture_edge(cudaStream_t stream, EdgePort port);

/// One block that lets its dependents launch at once, waits `spin_ns` nanoseconds, then copies
/// `bytes` (a multiple of 16, 16-byte aligned) from src to dst: a kernel started on a programmatic
/// edge after it reads dst's old contents unless it waits for this one to finish.
Status late_copy(cudaStream_t stream, const void* src, void* dst, uint64_t bytes, uint64_t spin_ns);

}  // namespace vlac::cuda
