// A chain of small-M GEMM phases in one persistent launch, with the weights streamed without a
// pause across the phases (issue 14: the action expert as fewer, larger launches).
//
// Why: at M = 50 every cuBLASLt launch of the expert pays the HBM latency of its first weights
// again, and the launch gap between kernels; a layer's four GEMMs take ~38 µs for 34 MB that HBM
// delivers in ~7–10 µs (docs/cuda-sessions.md, session 16). Here one block per multiprocessor (all
// resident: a cooperative launch) walks a fixed schedule of weight stages (16 rows × 512 columns
// of W, bf16) that depends on no data, so it keeps `stages - 1` of them in flight through a ring
// in shared memory at all times (cp.async; on sm_90 optionally by the bulk copy engine, one copy a
// row counted on the slot's mbarrier): through the grid barriers between phases and into the next
// phase's weights. Only the activations wait for a barrier.
//
// A phase: out = f(in · Wᵀ) for m ≤ 56 tokens. Its items are (16-row tile of W, K part); block b
// of G takes a run of ceil(items / G) neighbouring items (part-major), up to four at once (a
// round: one K part, their sums in registers), and walks the round's K part in chunks of 512
// columns: the chunk of the input goes into shared memory once, and each item's 16 × 512 weight
// stage meets it there. An item's sums are added across warps in a fixed order. Per phase, in
// order:
//   1. after the grid barrier (none before the first phase: a programmatic-dependent-launch wait
//      instead), each chunk of the input as bf16: bf16 input as it is, fp32 input rounded to bf16;
//   2. the sums s (fp32, over the item's K part) of each output element; with `norm` (one K part,
//      fp32 input) s is then scaled by the token's 1 / sqrt(mean over the k columns of x² + eps),
//      x² summed in fp32 as the chunks pass (the GEMM is linear, so the scale moves after it: the
//      input is rounded to bf16 before the scale, not after);
//   3. the epilogue: `geglu` writes out[t][j] = bf16(bf16(gelu_tanh(bf16(s_j))) · bf16(s_{F+j}))
//      for W's rows j < F (gate) and F + j (up), F = rows / 2 (the unfused path's three roundings);
//      otherwise out[t][r] = s as fp32 or bf16(s), or with `accumulate` fp32 out[t][r] += s by an
//      atomic add (parts > 1 add their partial sums in whatever order they finish).
// Later phases may read what earlier ones wrote (the barrier orders them); a phase must not read
// what it writes, except that an accumulate phase's `out` may be another phase's `in`.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/status.h"

namespace vlac::cuda {

constexpr int kStreamTokens = 56;         // m ≤ 56: seven MMA column tiles of 8
constexpr int64_t kStreamStageCols = 512;  // columns of W per stage, and of the input per chunk

struct StreamPhase {
  const void* w = nullptr;   // W [rows, k] bf16, row-major, 16-byte aligned
  int64_t rows = 0, k = 0;   // rows % 16 == 0; k % (512 · parts) == 0
  int parts = 1;             // 1, 2 or 4 K parts; more than 1 needs `accumulate`
  const void* in = nullptr;  // [m, k] (row stride in_stride elements), 16-byte aligned rows
  int64_t in_stride = 0;
  bool in_f32 = false;       // fp32 input, else bf16
  bool norm = false;         // scale the sums by each fp32 input row's 1 / rms over k (parts == 1)
  float eps = 1e-6f;
  bool geglu = false;        // rows = 2F, gate rows then up rows; out [m, F] bf16; parts == 1
  void* out = nullptr;       // [m, rows] (or [m, F] with geglu), row stride out_stride elements
  int64_t out_stride = 0;
  bool out_f32 = false;      // fp32 out, else bf16
  bool accumulate = false;   // fp32 out += sums
};

struct ExpertStreamPlan {
  int64_t m = 0;
  int blocks = 0;    // one per multiprocessor
  int stages = 0;    // weight stages in the ring (stages - 1 in flight ahead of the math)
  uint64_t smem = 0;  // dynamic shared memory per block
  bool wgmma = false;  // Hopper's warpgroup MMA (sm_90a) instead of mma.sync (expert_stream_wgmma_available)
};

/// The launch plan for m tokens on a GPU with `sms` multiprocessors and `smem_optin` bytes of
/// shared memory a block may opt into. `stages` > 0 asks for that ring depth (2..8; benches), 0 the
/// deepest that fits. False where it does not apply (m outside 1..56, too little shared memory).
bool expert_stream_plan(int64_t m, int sms, int64_t smem_optin, ExpertStreamPlan* out, int stages = 0,
                        bool wgmma = false);
/// Whether wgmma plans run here: the GPU is sm_90 and the build holds sm_90a code
/// (VLAC_CUDA_ARCHITECTURES with 90a-real). Needs the device.
bool expert_stream_wgmma_available();
/// Whether every block of `p` fits on the GPU at once (the grid barrier needs it). Needs the device.
bool expert_stream_resident(const ExpertStreamPlan& p);

/// For benches (input chunks shared by a cluster, not built yet): how many clusters of `cluster`
/// blocks of `p`'s kernel can be resident at once (cudaOccupancyMaxActiveClusters; -1 on an
/// error), and what a launch of `blocks` tiny blocks in such clusters, cooperative or not, returns.
int expert_stream_max_clusters(const ExpertStreamPlan& p, int cluster);
cudaError_t expert_stream_cluster_launch_probe(int blocks, int cluster, bool cooperative);

/// Device bytes that `n` phases take once uploaded.
uint64_t expert_stream_phase_bytes(int64_t n);
/// Checks every phase against the rules above (an error names the phase and the rule) and copies
/// them, in the kernel's form, to `dev` (expert_stream_phase_bytes(size) bytes; synchronous).
Status expert_stream_upload(const std::vector<StreamPhase>& phases, int64_t m, void* dev);

/// Unsigned words of synchronisation state, 8-byte aligned: the grid barrier's 64-bit arrival
/// counter, zeroed once before the first launch, then left to the kernel (a multiple of the
/// plan's blocks after every launch; launches that share it run in stream order).
constexpr int64_t kExpertStreamSyncWords = 2;

/// For benches: `stamps` [blocks][count][kExpertStreamStamps] gets each block's %globaltimer (ns)
/// at the start of each phase (after its barrier), once its input is in shared memory, and at the
/// phase's end (before the next barrier); the second is taken after the first chunk of its first
/// round. `skip` leaves parts out (results wrong; timing only):
/// 1 the math and the epilogue, 2 the grid barriers, 4 the input copies. Two bits change how, not
/// what (results right): 8 streams the weights by the bulk copy engine (sm_90+) instead of
/// cp.async; 32 (with 8) copies a stage whose rows are one run (k = 512, no geglu) in one bulk
/// copy, unpadded (timing only); 64 loads only the first half of the input rows (timing only: what
/// two blocks sharing each input chunk, a cluster of 2, would save); 128 (mma.sync, cp.async; results
/// right) publishes each K quarter of a stage by a named barrier of the two warps that copy and read
/// it instead of a block barrier.
struct ExpertStreamProbe {
  unsigned long long* stamps = nullptr;
  int skip = 0;
};
constexpr int kExpertStreamStamps = 3;

/// Enqueues phases [first, first + count) of the `total` uploaded at `phases`.
Status expert_stream(cudaStream_t stream, const ExpertStreamPlan& p, const void* phases, int64_t total,
                     int64_t first, int64_t count, unsigned* sync, const ExpertStreamProbe* probe = nullptr);

}  // namespace vlac::cuda
