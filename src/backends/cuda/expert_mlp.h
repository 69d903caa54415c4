// The action expert's MLP in one launch, for few tokens (M ≤ 56, ≤ 64 where D = 512: the 50 action tokens):
//   h = bf16(gelu_tanh(bf16(x·W_gateᵀ)) · bf16(x·W_upᵀ)),  y = h·W_downᵀ  (fp32 y)
// x [M, D] bf16, W_gu [2F, D] bf16 (gate rows, then up rows: the fused gate|up weight), W_down
// [D, F] bf16. It replaces three launches (the gate|up GEMM, GeGLU, the down GEMM) whose time at
// M = 50 is latency, not bytes: ~25 µs a layer on the H200 for 25 MB of weights.
//
// One block per multiprocessor, all resident (a cooperative launch), in two phases split by one
// grid barrier. Phase A: each block owns 16-row tiles of W_gu (8 gate rows and the same 8 up
// rows, so GeGLU runs on the MMA's sums in registers) and writes its columns of h. Phase B: each
// block owns 64 rows of W_down over 1/S of its K (the `splits`), with those columns of h in its
// shared memory; a part's S−1 partners publish their partial sums through the workspace and a
// flag, and the owner adds them in a fixed order (the same bits every run) and writes y. The point
// is the order of the loads: W_gu streams into registers from the start (two tiles before the wait
// for the kernel before it, programmatic dependent launch), W_down into shared memory during phase
// A, and the math of a tile waits only for its own weights.
// Sums run in another order than cuBLASLt's: the op harness bounds them against the CPU.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/status.h"

namespace vlac::cuda {

struct ExpertMlp {
  int64_t m = 0, d = 0, f = 0;
  int blocks = 0;           // one per multiprocessor
  int splits = 1;           // phase B's K split S (W_down rows × S items)
  int items_per_block = 1;  // phase B items a block holds in shared memory (≤ 2)
  uint64_t smem = 0;        // dynamic shared memory per block
};

/// The launch plan for a GPU with `sms` multiprocessors and `smem_optin` bytes of shared memory a
/// block may opt into; false where the kernel does not apply (more than 64 tokens, or a block's
/// shared memory over the limit, as for M > 56 at D = 1024; D not 512 or 1024; F not a multiple
/// of 1024). The cached shared-memory opt-in is per kernel, for one GPU per process.
/// `splits` > 0 asks for that K split of phase B (benches); 0 takes the first that fits.
bool expert_mlp_plan(int64_t m, int64_t d, int64_t f, int sms, int64_t smem_optin, ExpertMlp* out, int splits = 0);
/// Whether every block of `p` fits on the GPU at once (the grid barrier needs it): registers and
/// shared memory from the occupancy calculator. Needs the device; false on any CUDA error.
bool expert_mlp_resident(const ExpertMlp& p);
/// Bytes of workspace it needs: the S−1 partial sums of phase B, fp32.
uint64_t expert_mlp_workspace_bytes(const ExpertMlp& p);
/// Unsigned words of synchronisation state it needs (the grid barrier, one flag per 64 rows of
/// W_down): zeroed once, left as they are found.
constexpr int64_t kExpertMlpSyncWords = 2 + 4096;

/// For benches (bench/expert_mlp_bench.cpp): where a launch spends its time. `stamps` [blocks]
/// [kExpertMlpStamps]: each block's thread 0 writes %globaltimer (ns) at kernel entry, after the
/// PDL wait, once x and W_down are in shared memory, after phase A, after the grid barrier and at
/// its end. `skip` leaves parts out (the results are then wrong; timing only): 1 phase A's math
/// and h, 2 the grid barrier, 4 phase B's math and y, 8 x's load into shared memory.
struct ExpertMlpProbe {
  unsigned long long* stamps = nullptr;
  int skip = 0;
};
constexpr int kExpertMlpStamps = 6;

/// Enqueues it. x [m, d] bf16 (row stride d), h [m, f] bf16 (row stride h_stride ≥ f), y [m, d]
/// fp32 (row stride y_stride ≥ d); device pointers, 16-byte aligned, h_stride a multiple of 8.
/// h is written: it is the GeGLU output of the graph. y may share memory with x (it is written
/// after every block has read x), not with h.
Status expert_mlp(cudaStream_t stream, const ExpertMlp& p, const void* x, const void* w_gu, const void* w_down,
                  void* h, int64_t h_stride, float* y, int64_t y_stride, void* workspace, unsigned* sync,
                  const ExpertMlpProbe* probe = nullptr);

}  // namespace vlac::cuda
