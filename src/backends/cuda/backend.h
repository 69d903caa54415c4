// The CUDA backend as the seam sees it (ir/backend.h): device info (compute capability, memory),
// a runtime that uploads weights once through a bounded page-locked staging buffer, plans one
// device arena per program from exec::plan_arena and runs one kernel (or cuBLASLt call) per IR
// node on one stream, and a RunSequence that records whole chunks as CUDA graphs. Its compiler
// (vlac compile --backend cuda) is compiler.h's make_cuda_compiler(): host code, no GPU needed.
// Only backends/registry.cpp includes this; everything above the seam asks the registry for "cuda".
#pragma once

#include <memory>

#include "ir/backend.h"

namespace vlac::cuda {

/// The backend. Creating it touches no GPU: without a device it still registers, device()
/// describes why there is none, and every runtime call returns that one error.
std::unique_ptr<Backend> make_cuda_backend();

}  // namespace vlac::cuda
