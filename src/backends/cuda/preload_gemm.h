// A GEMM for few rows (M ≤ 64: the expert's 50 action tokens) that loads its weights before it
// waits for its input. y[M,N] = x[M,K]·W[N,K]ᵀ (+ bias[N]) (+ y), bf16 x and W, fp32 sums, bf16 or
// fp32 y.
//
// Why: at M = 50 a GEMM is a read of W (the expert's are 4–17 MB each), and every launch today
// starts that read only once the kernel before it has finished (cuBLASLt's ~7 µs each, 5 ms a
// chunk). W depends on nothing, so here each block copies its whole tile of W into shared memory
// first (cp.async), then lets the next kernel launch (griddepcontrol.launch_dependents), and only
// then waits for the previous kernel (griddepcontrol.wait) and reads x. When the kernel is
// launched early, its weight read overlaps the kernels before it: inside a recorded graph the
// edge into it leaves its predecessor at launch completion (all its blocks started), not at its
// end (`preload_gemm` sets that on the capture), and since this kernel lets its successor launch
// early, the predecessor of the next preload GEMM is itself already resident. The hardware keeps
// the cascade within what shared memory and registers allow; every block of an earlier kernel is
// resident before a later one's start, so it cannot deadlock.
//
// Tiles: a block holds Nt rows of W over Kc = K / C columns (all of them resident at once: the
// grid is at most one block a multiprocessor); the C blocks of one row tile form a thread-block
// cluster and add their fp32 partial sums over distributed shared memory, in rank order, so the
// result is the same on every run (not bit-identical to cuBLASLt's order).
// With PreloadGemm::k_parts they form no cluster: each writes its partial, and the GEMM's reader
// adds them.
#pragma once

#include <cstdint>
#include <functional>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/status.h"

namespace vlac::cuda {

struct PreloadGemm {
  int64_t m = 0, n = 0, k = 0;
  DType out = DType::BF16;  // BF16 or F32; a bias has this dtype
  bool bias = false;
  bool accumulate = false;  // y = y + x·Wᵀ (+ bias)
  int64_t ldx = 0, ldy = 0;  // row strides in elements (0: k, n)
  /// W by TMA (one thread issues the tile's 64-column boxes onto an mbarrier) instead of cp.async
  /// from every thread: 1 on, 0 off, -1 as VLAC_PRELOAD_TMA=1 says (opt-in; no faster, session 30).
  int tma = -1;
  /// ≥ 2: y holds k_parts fp32 partial products [k_parts][m][ldy] over equal K chunks, as
  /// GemmDesc::k_parts (the next kernel adds them in order): each part a block of its own, no
  /// cluster and no sum here. F32 out, no bias, no accumulation.
  int k_parts = 0;
};

/// One block's share: `rows` of W (Nt) over K / `parts` columns; parts blocks form a cluster,
/// or, where they write partials (PreloadGemm::k_parts), none (cluster 1).
struct PreloadTiles {
  int rows = 0, parts = 0;
  int blocks = 0, threads = 0;
  uint64_t smem = 0;  // dynamic shared memory of a block, bytes
  int cluster = 0;    // blocks of a cluster: parts, or 1
};

/// The tiles for (m, n, k) on `sms` multiprocessors with at most `smem_limit` bytes of shared
/// memory a block: the most blocks up to one a multiprocessor, then the fewest bytes of x read
/// from L2 (blocks · m · Kc), then the fewest parts. rows == 0 when nothing fits.
/// `resident_clusters`, where given, tells how many clusters of a candidate the GPU holds at once
/// (< 0: unknown); candidates with more clusters than that are passed over, since their weights
/// would load in two waves (the GPU's clusters live within one GPC: 8 blocks of 128 KiB need 8
/// free multiprocessors of one GPC, and GPCs differ in size from chip to chip).
/// With `split_parts` ≥ 2 the parts are exactly that many blocks with no cluster (PreloadGemm::k_parts),
/// and `resident_clusters` is asked about clusters of one block.
PreloadTiles preload_gemm_tiles(int64_t m, int64_t n, int64_t k, int sms, uint64_t smem_limit, int max_parts = 8,
                                const std::function<int(const PreloadTiles&)>& resident_clusters = {},
                                int split_parts = 0);
/// The shared-memory limit the executor plans with: VLAC_PRELOAD_SMEM_KIB, 160 KiB by default
/// (two of the expert's GEMMs then fit one multiprocessor together where the pair allows it).
uint64_t preload_gemm_smem_limit();
/// Blocks per multiprocessor a grid may need (VLAC_PRELOAD_WAVES, 1 by default): with 2, tiles
/// half the size, two a multiprocessor where they fit.
int preload_gemm_waves();
/// The most blocks a cluster (parts) the executor plans with: VLAC_PRELOAD_MAX_PARTS, 8 by default.
int preload_gemm_max_parts();
/// How many of g's clusters can be resident at once on this GPU (cudaOccupancyMaxActiveClusters;
/// -1 where the query fails): all of them must be for the weights to load in one wave, which the
/// executor's tiles are checked for (VLAC_PRELOAD_ONE_WAVE=0: not checked).
int preload_gemm_active_clusters(const PreloadGemm& g, int sms);

/// The tiles `preload_gemm` launches g with on this GPU (rows 0: it refuses g).
PreloadTiles preload_gemm_plan(const PreloadGemm& g, int sms);
/// Whether the kernel takes `g` on this GPU (sm_90 or later: clusters and griddepcontrol): bf16
/// x and W, 1 ≤ m ≤ 64, tiles found, strides multiples of 8 elements.
bool preload_gemm_fits(const PreloadGemm& g, int sms);
/// VLAC_PRELOAD_GEMM: 0 (default) off; 1 routes every GEMM that fits through this kernel instead
/// of cuBLASLt (opt-in until measured); 2 only those that write K parts (GemmDesc::k_parts, e.g.
/// the expert's down with VLAC_DOWN_KPARTS=8). VLAC_PRELOAD_EARLY=0 keeps the capture's edges as
/// they are.
int preload_gemm_mode();

/// Benches only (not thread-safe): while `stamps` is not null, every launch's blocks write
/// kPreloadStamps %globaltimer values each to stamps[block · kPreloadStamps + i]: 0 start, 1 W
/// issued, 2 after the wait for the previous kernel, 3 W and x in shared memory, 4 MMAs done,
/// 5 the block's partial written, 6 outputs stored, 7 end (after the cluster's last barrier).
constexpr int kPreloadStamps = 8;
void preload_gemm_set_stamps(unsigned long long* stamps);

/// Enqueues the GEMM. x [m, ldx], w [n, k] (rows packed), bias [n] or null, y [m, ldy]; device
/// pointers 16-byte aligned.
Status preload_gemm(cudaStream_t stream, const PreloadGemm& g, int sms, const void* x, const void* w,
                    const void* bias, void* y);

}  // namespace vlac::cuda
