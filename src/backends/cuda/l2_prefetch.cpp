// The prefetch planner and its settings (host-only; the kernel is in l2_prefetch.cu).
#include "backends/cuda/l2_prefetch.h"

#include <algorithm>
#include <string>

#include "backends/cuda/env.h"

namespace vlac::cuda {

std::vector<PrefetchLaunch> plan_l2_prefetch(const std::vector<PrefetchGemm>& gemms, uint64_t cap, uint64_t batch) {
  std::vector<PrefetchLaunch> out;
  if (cap == 0) return out;
  const size_t n = gemms.size();
  std::vector<uint8_t> fetched(n, 0);
  uint64_t inflight = 0;
  size_t next = 0;  // first GEMM not yet prefetched
  // Point k = -1 (the start) and after GEMM k: GEMMs up to k have been read by then.
  for (size_t k = 0; k <= n; ++k) {
    const bool start = k == 0;
    const size_t done = start ? 0 : k;  // GEMMs [0, done) have run at this point
    if (!start && fetched[k - 1]) inflight -= gemms[k - 1].w.bytes;
    next = std::max(next, done);
    if (next >= n) break;
    size_t end = next;
    uint64_t add = 0;
    while (end < n && (inflight + add + gemms[end].w.bytes <= cap || (inflight + add == 0))) {
      add += gemms[end].w.bytes;
      ++end;
    }
    if (end == next) continue;
    const bool urgent = next == done;  // the GEMM that runs next is not in flight
    if (!urgent && add < batch) continue;
    PrefetchLaunch l;
    l.before = start ? 0 : gemms[k - 1].pos + 1;
    for (size_t j = next; j < end; ++j) {
      fetched[j] = 1;
      const L2Range r = gemms[j].w;
      if (!l.ranges.empty() && static_cast<const uint8_t*>(l.ranges.back().p) + l.ranges.back().bytes == r.p)
        l.ranges.back().bytes += r.bytes;
      else
        l.ranges.push_back(r);
    }
    inflight += add;
    next = end;
    out.push_back(std::move(l));
  }
  return out;
}

L2PrefetchSettings l2_prefetch_settings() {
  L2PrefetchSettings s;
  const int64_t mib = env_count("VLAC_L2_PREFETCH_MIB", 0);
  s.cap = uint64_t(mib) << 20;
  s.batch = uint64_t(env_count("VLAC_L2_PREFETCH_BATCH_MIB", mib / 2)) << 20;
  s.max_rows = env_count("VLAC_L2_PREFETCH_ROWS", 64);
  s.blocks = int(std::clamp<int64_t>(env_count("VLAC_L2_PREFETCH_BLOCKS", 16), 1, 1024));
  return s;
}

}  // namespace vlac::cuda
