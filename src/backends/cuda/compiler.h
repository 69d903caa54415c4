// The CUDA backend's compile side: host-only C++ that needs no GPU (a package is built on a
// workstation and run on the board). It rewrites each stage into the form the CUDA kernels read
// (ir/fuse: one GEMM for q|k|v and for gate|up) and writes one engine file per subgraph: every
// weight converted to its run dtype in the kernels' layout, streamed in bounded chunks from the
// map, 256-byte aligned. It never calls the CUDA runtime: choices that depend on the GPU
// (cuBLASLt algorithm, workspace, attention key splits) are made at first load on the target.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "ir/backend.h"

namespace vlac::cuda {

/// The layout every CUDA engine of this version stores (in each engine's backend_info).
inline constexpr const char* kEngineLayout = "vlac-cuda-engine-1";
/// Alignment of each weight inside a CUDA engine file (cudaMalloc's; the package aligns the file
/// to 64 KiB, so a unified-memory device can use the mapped weights in place).
inline constexpr uint64_t kEngineAlign = 256;
/// The largest multiprocessor count the estimates assume for attention key splits (GH100: 144).
inline constexpr int kEstimateMaxSms = 144;

/// What the kernels read a stored weight as (engine backend_info "weights[].use").
enum class WeightUse {
  Gemm,      // Linear weight [N, K] row-major: the B operand of cuBLASLt's TN GEMM (y = x·Wᵀ)
  ConvGemm,  // patch-embedding conv weight [O, C, kh, kw] = [O, C·kh·kw] row-major, same bytes
  Bias,      // Linear/PatchEmbed bias [N]
  Norm,      // RMSNorm / LayerNorm weight or bias [D], always F32 (the norm kernels read fp32)
  Table,     // embedding table [V, D], rows gathered
  Other,     // read elementwise (SigLIP's position embedding, ...)
};
const char* weight_use_name(WeightUse use);

/// How each weight read by `sub` is used (by name); a weight read two ways takes the first.
/// Weights `sub` does not read are absent.
std::vector<std::pair<std::string, WeightUse>> weight_uses(const Subgraph& sub);

/// The dtype a CUDA engine stores `requested` in for `use`: norms F32, the rest as requested
/// (F32 or BF16).
DType stored_dtype(WeightUse use, DType requested);

struct CudaEngineFile {
  std::string path;
  uint64_t bytes = 0;
  std::vector<BlobWeight> weights;  // one per stored weight, in order
};

/// Writes `store` to `path` (temporary + rename; nothing at `path` on error): weight i in
/// `dtypes[i]` (F32 or BF16; sources F32, BF16 or F16), a fused weight (WeightRef::parts) as its
/// parts one after another. `chunk_bytes` bounds the conversion buffer; the source pages of each
/// chunk are released behind the reader and the written pages flushed and dropped every 32 MiB,
/// so memory stays bounded by the buffer whatever the model.
Result<CudaEngineFile> write_cuda_engine_file(const std::string& path, const std::vector<StoredWeight>& store,
                                              const std::vector<DType>& dtypes, WeightSource& source,
                                              uint64_t chunk_bytes = 4ull << 20,
                                              const ir::QuantCalibration* calibration = nullptr);

/// True for the ops the CUDA engines run (pi0.5's after fusion; no MatMul, Transpose, Softmax, Sub).
bool supports_op(ir::OpKind op);

/// The CUDA BackendCompiler ("cuda"): lower() = ir::fuse_linears with the default rules,
/// supports() = supports_op and F32/BF16/I64 values, estimate_bytes() = weights at their
/// referenced dtypes (an upper bound: conversion only narrows) + the planned arena at the
/// compile-time shapes + the GEMM workspace + attention split scratch for up to kEstimateMaxSms;
/// compile() writes the engine file and returns exact weight bytes.
std::unique_ptr<BackendCompiler> make_cuda_compiler();

}  // namespace vlac::cuda
