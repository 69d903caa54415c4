// Weights pulled into L2 ahead of the GEMMs that read them (sm_90: cp.async.bulk.prefetch.L2).
// The expert's GEMMs (M = 50) do not stream their weights at the HBM's rate: too few tiles are
// in flight to cover its latency (session 15's profile: 0.5-1.6 TB/s against 4.8). Their
// weights are read-only and known at plan time, so a tiny kernel issues L2 prefetches for the
// next GEMMs' weights while the kernels before them (attention, norms, RoPE) run, and the GEMMs
// then read L2. The prefetch changes no value; only the time.
// Measured on the H200 (session 16, full-size bf16-all, one process per setting): the expert's
// GEMM nodes got 0.3-1.0 us faster each in the profile, but the recorded chunk went from 19.73
// to 23.44-23.51 ms with a 32 MiB window (21.7-24.0 ms for 16/48 MiB, every GEMM, 4/64 blocks).
// So it is off by default (VLAC_L2_PREFETCH_MIB=0), kept to measure on other GPUs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/status.h"

namespace vlac::cuda {

struct L2Range {
  const void* p = nullptr;
  uint64_t bytes = 0;
};
inline constexpr int kMaxL2Ranges = 8;

/// One GEMM whose weight is prefetched: its position in the run order and its weight's bytes.
struct PrefetchGemm {
  size_t pos = 0;
  L2Range w;
};
/// A prefetch launched just before the node at run-order position `before`.
struct PrefetchLaunch {
  size_t before = 0;
  std::vector<L2Range> ranges;  // adjacent ranges merged
};

/// Where to launch prefetches for `gemms` (in run order): at the start and after each GEMM,
/// the next GEMMs' weights are added while the bytes prefetched and not yet read stay within
/// `cap`; a launch is made when the very next GEMM would otherwise run unprefetched or when at
/// least `batch` bytes are added (fewer, larger launches). A weight larger than `cap` is
/// prefetched alone when nothing else is in flight. Host-only (tested without a GPU).
std::vector<PrefetchLaunch> plan_l2_prefetch(const std::vector<PrefetchGemm>& gemms, uint64_t cap, uint64_t batch);

/// VLAC_L2_PREFETCH_MIB (cap; default 0: off, measured slower above), VLAC_L2_PREFETCH_BATCH_MIB (default half the cap), VLAC_L2_PREFETCH_ROWS
/// (GEMMs with at most this many x rows; default 64: the expert's latency-bound GEMMs, not the
/// prefix's compute-bound ones), VLAC_L2_PREFETCH_BLOCKS (default 16).
struct L2PrefetchSettings {
  uint64_t cap = 0, batch = 0;
  int64_t max_rows = 64;
  int blocks = 16;
};
L2PrefetchSettings l2_prefetch_settings();

/// Issues L2 prefetches of `n` (<= kMaxL2Ranges) ranges in stream order, with `blocks` blocks of
/// one warp (spread over SMs); the kernel waits for the kernel before it (PDL) only after it has
/// issued them, and completes without waiting for the data.
Status l2_prefetch(cudaStream_t stream, const L2Range* ranges, int n, int blocks);

}  // namespace vlac::cuda
