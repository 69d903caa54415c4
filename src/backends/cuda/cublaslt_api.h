// cuBLASLt's entry points, resolved with dlopen when the first GEMM runner is created instead of
// linked: a process that links libcublasLt.so.13 pays for its static initializers at start, ~94 MB
// of dirty memory and ~58 MB of clean pages (session 27: `vlac --help` 217 MB of RSS), in every
// command, the CPU-only ones (convert, compile, mem, the CPU demo) included.
#pragma once

#include <cublasLt.h>

#include "core/status.h"

namespace vlac::cuda {

// The functions the backend calls (gemm.cpp), each with the header's own signature.
#define VLAC_CUBLASLT_FUNCTIONS(X)                                                                     \
  X(Create) X(Destroy) X(GetVersion) X(GetStatusString) X(GetStatusName) X(MatmulDescCreate)           \
  X(MatmulDescDestroy) X(MatmulDescSetAttribute) X(MatrixLayoutCreate) X(MatrixLayoutDestroy)          \
  X(MatrixLayoutSetAttribute) X(MatmulPreferenceCreate) X(MatmulPreferenceDestroy)                     \
  X(MatmulPreferenceSetAttribute) X(MatmulAlgoGetHeuristic) X(MatmulAlgoCheck) X(MatmulAlgoCapGetAttribute) \
  X(MatmulAlgoConfigGetAttribute) X(MatmulAlgoConfigSetAttribute) X(Matmul)

struct CublasLt {
#define VLAC_CUBLASLT_POINTER(name) decltype(&::cublasLt##name) name = nullptr;
  VLAC_CUBLASLT_FUNCTIONS(VLAC_CUBLASLT_POINTER)
#undef VLAC_CUBLASLT_POINTER
};

/// Loads libcublasLt.so.13 once (the executable's run path, LD_LIBRARY_PATH, then the directory
/// libcudart was loaded from) and resolves every function; a Backend error naming the library
/// and the missing piece when that fails. Call before lt().
Status cublaslt_load();
/// The resolved functions (cublaslt_load() returned ok).
const CublasLt& lt();

}  // namespace vlac::cuda
