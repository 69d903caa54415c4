// Weight-streaming probes for expert_mlp_bench (weight_stream_probe.cu): how fast one block per
// multiprocessor reads its share of a weight from HBM into registers or, with the bulk copy
// engine, into a ring of shared memory stages. Bench code only.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace vlac::bench {

/// Each block reads bytes_per_block (a multiple of 16) at w + blockIdx·bytes_per_block, `batch`
/// 16-byte loads a thread (4, 8, 16 or 32) in flight before their first use.
cudaError_t weight_stream_regs(cudaStream_t st, const void* w, int64_t bytes_per_block, int blocks, int threads,
                               int batch, unsigned* sink);
/// The same bytes by cp.async.bulk in chunks of `chunk` bytes (a multiple of 16), `stages` (≤ 16)
/// in flight; sm_90 only (elsewhere the kernel does nothing).
cudaError_t weight_stream_bulk(cudaStream_t st, const void* w, int64_t bytes_per_block, int blocks, int chunk,
                               int stages, unsigned* sink);

}  // namespace vlac::bench
