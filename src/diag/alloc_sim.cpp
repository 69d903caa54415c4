// The caching-allocator model and the replay of a training run (see alloc_sim.h).
#include "diag/alloc_sim.h"

#include <algorithm>

namespace vlac::diag {

namespace {

constexpr uint64_t kMinBlock = 512;             // kMinBlockSize: every request rounds to 512 B
constexpr uint64_t kSmallSize = 1ull << 20;     // requests up to 1 MiB: small pool
constexpr uint64_t kSmallBuffer = 2ull << 20;   // small pool segments
constexpr uint64_t kLargeBuffer = 20ull << 20;  // large segments for requests under kMinLargeAlloc
constexpr uint64_t kMinLargeAlloc = 10ull << 20;
constexpr uint64_t kRoundLarge = 2ull << 20;    // larger requests: rounded up to 2 MiB

}  // namespace

uint64_t CachingAllocatorSim::round_size(uint64_t bytes) {
  if (bytes < kMinBlock) return kMinBlock;
  return kMinBlock * ((bytes + kMinBlock - 1) / kMinBlock);
}

uint64_t CachingAllocatorSim::segment_size(uint64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

void CachingAllocatorSim::insert_free(int32_t b) {
  const Block& k = blocks_[static_cast<size_t>(b)];
  free_blocks_[k.small ? 1 : 0].insert({{k.size, k.addr}, b});
}

void CachingAllocatorSim::erase_free(int32_t b) {
  const Block& k = blocks_[static_cast<size_t>(b)];
  free_blocks_[k.small ? 1 : 0].erase({{k.size, k.addr}, b});
}

CachingAllocatorSim::Handle CachingAllocatorSim::malloc(uint64_t bytes) {
  if (bytes == 0) return -1;
  const uint64_t size = round_size(bytes);
  const bool small = size <= kSmallSize;
  auto& pool = free_blocks_[small ? 1 : 0];
  auto new_block = [&]() -> int32_t {
    if (!recycled_.empty()) {
      int32_t i = recycled_.back();
      recycled_.pop_back();
      blocks_[static_cast<size_t>(i)] = Block{};
      return i;
    }
    blocks_.push_back(Block{});
    return static_cast<int32_t>(blocks_.size() - 1);
  };
  int32_t b;
  auto it = pool.lower_bound({{size, 0}, -1});
  if (it == pool.end()) {
    // No cached block fits: a new segment (cudaMalloc), the only way reserved grows.
    const uint64_t seg = segment_size(size);
    b = new_block();
    Block& k = blocks_[static_cast<size_t>(b)];
    k.addr = next_addr_;
    k.size = seg;
    k.small = small;
    next_addr_ += seg + (1ull << 30);  // segments are never adjacent
    reserved_ += seg;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    ++n_segments_;
  } else {
    b = it->second;
    pool.erase(it);
  }
  const uint64_t remaining = blocks_[static_cast<size_t>(b)].size - size;
  if ((small && remaining >= kMinBlock) || (!small && remaining > kSmallSize)) {
    const int32_t r = new_block();
    Block& k = blocks_[static_cast<size_t>(b)];
    Block& rest = blocks_[static_cast<size_t>(r)];
    rest.addr = k.addr + size;
    rest.size = remaining;
    rest.small = small;
    rest.free = true;
    rest.prev = b;
    rest.next = k.next;
    if (k.next >= 0) blocks_[static_cast<size_t>(k.next)].prev = r;
    k.next = r;
    k.size = size;
    insert_free(r);
  }
  Block& k = blocks_[static_cast<size_t>(b)];
  k.free = false;
  allocated_ += k.size;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  return b;
}

void CachingAllocatorSim::free(Handle h) {
  if (h < 0) return;
  Block* k = &blocks_[static_cast<size_t>(h)];
  k->free = true;
  allocated_ -= k->size;
  int32_t b = h;
  // Merge with the free neighbours inside the segment.
  const int32_t n = k->next;
  if (n >= 0 && blocks_[static_cast<size_t>(n)].free) {
    erase_free(n);
    Block& nb = blocks_[static_cast<size_t>(n)];
    k->size += nb.size;
    k->next = nb.next;
    if (nb.next >= 0) blocks_[static_cast<size_t>(nb.next)].prev = b;
    nb.live = false;
    recycled_.push_back(n);
  }
  const int32_t p = k->prev;
  if (p >= 0 && blocks_[static_cast<size_t>(p)].free) {
    erase_free(p);
    Block& pb = blocks_[static_cast<size_t>(p)];
    pb.size += k->size;
    pb.next = k->next;
    if (k->next >= 0) blocks_[static_cast<size_t>(k->next)].prev = p;
    k->live = false;
    recycled_.push_back(b);
    b = p;
  }
  insert_free(b);
}

AllocSimResult simulate_training_allocator(const std::vector<SimParam>& params, const std::vector<SimLayer>& layers,
                                           const std::vector<uint64_t>& batch, uint64_t workspace, int steps) {
  using H = CachingAllocatorSim::Handle;
  CachingAllocatorSim a;
  AllocSimResult r;
  // Construction, parameter by parameter, then the cast of those stored narrower (lerobot's
  // to_bfloat16_for_selected_params: param.data = param.data.to(dtype), new tensor then free).
  std::vector<H> weight(params.size(), -1);
  for (size_t i = 0; i < params.size(); ++i) weight[i] = a.malloc(params[i].construct_bytes);
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].stored_bytes != params[i].construct_bytes) {
      H nw = a.malloc(params[i].stored_bytes);
      a.free(weight[i]);
      weight[i] = nw;
    }
  r.load_allocated = a.allocated();
  r.load_reserved = a.reserved();
  std::vector<H> in;
  for (uint64_t b : batch) in.push_back(a.malloc(b));
  H ws = -1;
  std::vector<H> grad(params.size(), -1), cast(params.size(), -1);
  std::vector<std::vector<H>> moment(params.size());
  int groups = 0;
  for (const SimParam& p : params) groups = std::max(groups, p.dtype_group + 1);
  for (int step = 0; step < steps; ++step) {
    // Forward.
    std::vector<std::vector<H>> saved(layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      const SimLayer& L = layers[l];
      for (int p : L.params)
        if (params[static_cast<size_t>(p)].cast_bytes) cast[static_cast<size_t>(p)] = a.malloc(params[static_cast<size_t>(p)].cast_bytes);
      if (ws < 0) ws = a.malloc(workspace);  // cuBLAS workspace: the first matmul
      std::vector<H> tmp;
      for (uint64_t t : L.transient) tmp.push_back(a.malloc(t));
      for (uint64_t t : L.saved) saved[l].push_back(a.malloc(t));
      for (H h : tmp) a.free(h);
    }
    // Backward, last layer first.
    H flowing = -1;
    for (size_t l = layers.size(); l-- > 0;) {
      const SimLayer& L = layers[l];
      if (!L.backward) {
        for (H h : saved[l]) a.free(h);
        continue;
      }
      std::vector<H> recomputed;
      if (L.checkpointed)
        for (uint64_t t : L.full) recomputed.push_back(a.malloc(t));
      const std::vector<uint64_t>& sizes = L.checkpointed ? L.full : L.saved;
      std::vector<H>& held = L.checkpointed ? recomputed : saved[l];
      // Each saved tensor's gradient is made, the one before it released (autograd frees a
      // node's saved tensors and its incoming gradient once the node has run).
      for (size_t t = sizes.size(); t-- > 0;) {
        H g = a.malloc(sizes[t]);
        if (t + 1 == sizes.size()) {
          for (int p : L.params)
            if (params[static_cast<size_t>(p)].grad_bytes) grad[static_cast<size_t>(p)] = a.malloc(params[static_cast<size_t>(p)].grad_bytes);
        }
        a.free(flowing);
        flowing = g;
        a.free(held[t]);
      }
      if (L.checkpointed)
        for (H h : saved[l]) a.free(h);
      for (int p : L.params) {
        a.free(cast[static_cast<size_t>(p)]);
        cast[static_cast<size_t>(p)] = -1;
      }
    }
    a.free(flowing);
    // Gradient clipping: one norm per gradient (torch._foreach_norm), then the scale in place.
    std::vector<H> norms;
    for (size_t i = 0; i < params.size(); ++i)
      if (grad[i] >= 0) norms.push_back(a.malloc(4));
    for (H h : norms) a.free(h);
    // Optimizer: state on the first step (zeros_like per parameter, both moments), then per
    // dtype group the foreach sqrt temporaries, made before the previous group's are dropped.
    for (size_t i = 0; i < params.size(); ++i)
      if (grad[i] >= 0 && moment[i].empty())
        for (int k = 0; k < params[i].moments; ++k) moment[i].push_back(a.malloc(params[i].moment_bytes));
    std::vector<H> prev_tmp;
    for (int g = 0; g < groups; ++g) {
      std::vector<H> tmp;
      for (size_t i = 0; i < params.size(); ++i)
        if (grad[i] >= 0 && params[i].foreach_temp && params[i].dtype_group == g) tmp.push_back(a.malloc(params[i].moment_bytes));
      for (H h : prev_tmp) a.free(h);
      prev_tmp = std::move(tmp);
    }
    for (H h : prev_tmp) a.free(h);
    // zero_grad(set_to_none=True), then the next batch.
    for (H& h : grad) {
      a.free(h);
      h = -1;
    }
    std::vector<H> next;
    for (uint64_t b : batch) next.push_back(a.malloc(b));
    for (H h : in) a.free(h);
    in = std::move(next);
  }
  r.peak_allocated = a.peak_allocated();
  r.peak_reserved = a.peak_reserved();
  r.segments = a.segments();
  return r;
}

}  // namespace vlac::diag
