// TEMPORARY (drop when the CUDA runtime's backend is wired in): a "cuda" backend that compiles
// CUDA engines (make_cuda_compiler) and refuses to run them, so `vlac compile --backend cuda`
// works before the runtime half is merged.
#pragma once

#include <memory>

#include "ir/backend.h"

namespace vlac::cuda {

std::unique_ptr<Backend> make_cuda_compile_only_backend();

}  // namespace vlac::cuda
