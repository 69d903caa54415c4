// The CPU backend as the seam sees it (ir/backend.h): device info from cpu_isa(), the engine
// builder as its compiler, CpuWeights + Executor as its runtime. Only backends/registry.cpp
// includes this; everything above the seam asks the registry for "cpu".
#pragma once

#include <memory>

#include "ir/backend.h"

namespace vlac::cpu {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace vlac::cpu
