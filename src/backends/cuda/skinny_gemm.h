// A weight-streaming GEMM for few rows (M ≤ 64: the expert's 50 action tokens, the time MLP):
// y[M,N] = x[M,K]·W[N,K]ᵀ (+ bias[N]), bf16 in, fp32 accumulation, bf16 or fp32 out. At M = 50
// the GEMM is a read of W (the expert's four per layer: 5–17 MB each), which cuBLASLt's tiles
// (M padded to 64 or 128 as their *rows*) read at a third of the bandwidth. Here the weight's rows
// are the tensor-core MMA's M (m16n8k16, A = 16 rows of W, B = 8 tokens of x), every W byte is
// loaded once straight into registers, 16 bytes per thread, and the tokens ride along as the
// MMA's N. A block is 4 warps over 32 rows of W that split the block's K range; blocks split K
// further (`splits`) so that N = 1024 still fills the GPU; the partial sums of one 32-row tile are
// added by the last of its blocks to finish, in split order, so the result is the same on every
// run. With programmatic dependent launch the first weight loads are issued before the wait for
// the previous kernel (weights are never written by a kernel).
//
// Sums run in another order than cuBLASLt's (K permuted within each 64-column step, split-K), so
// results are not bit-identical to it: the op harness bounds them against the CPU like cuBLASLt's.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/status.h"

namespace vlac::cuda {

struct SkinnyGemm {
  int64_t m = 0, n = 0, k = 0;
  DType out = DType::BF16;  // BF16 or F32; a bias has this dtype
  bool bias = false;
  int splits = 1;  // K split over this many blocks per 32-row tile (1..64)
  /// BF16, or an 8-bit blob (core/quant.h: I8 / F8_E4M3 codes, then one fp32 scale per row of
  /// W): the codes are widened to bf16 in registers (exact) as they load, each output's fp32 sum
  /// is multiplied by its row's scale before the bias (the CPU's W8A16 arithmetic). Half the
  /// bytes of a bf16 W per GEMM.
  DType weights = DType::BF16;
};

/// Whether the kernel takes this shape: 1 ≤ m ≤ 64, n % 32 == 0, k % 64 == 0, BF16 x and W.
bool skinny_gemm_fits(int64_t m, int64_t n, int64_t k);
/// The split counts worth timing for (n, k) on `sms` multiprocessors, the default (a fill of about
/// two blocks per multiprocessor, at least two K steps per warp) first.
std::vector<int> skinny_gemm_splits(int64_t n, int64_t k, int sms);
/// Bytes of workspace it needs (the fp32 partial sums when splits > 1).
uint64_t skinny_gemm_workspace_bytes(const SkinnyGemm& g);
/// Tile counters it needs (one per 32 rows of W); they start at zero and are left at zero.
constexpr int64_t kSkinnyCounters = 4096;

/// Enqueues the GEMM. x [m,k] and w [n,k] bf16, y [m,n]; device pointers, 16-byte aligned;
/// workspace ≥ skinny_gemm_workspace_bytes(g); counters: kSkinnyCounters zeroed unsigned ints used
/// by nothing else running at the same time.
Status skinny_gemm(cudaStream_t stream, const SkinnyGemm& g, const void* x, const void* w, const void* bias, void* y,
                   void* workspace, unsigned* counters);

}  // namespace vlac::cuda
