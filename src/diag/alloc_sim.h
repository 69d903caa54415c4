// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, default
// settings: no expandable segments, no max_split_size, no garbage-collection threshold, one
// stream) and a replay of one training run's tensor lifetimes through it. The allocator is what
// turns the bytes a step keeps alive (peak allocated) into the bytes it holds from CUDA (peak
// reserved): every request is rounded up to 512 B; requests up to 1 MiB come from 2 MiB
// "small" segments, larger ones from "large" segments (20 MiB for requests under 10 MiB, else
// the request rounded up to 2 MiB); a request takes the smallest cached free block that fits
// (best fit, then lowest address) and splits it when more than 512 B (small) / 1 MiB (large)
// would remain; freed blocks merge with free neighbours of their segment; segments are never
// returned. A request that fits no cached block makes a new segment: that, and only that, grows
// reserved. Checked by replaying six measured traces (alloc/free sequences recorded by
// torch.cuda.memory._record_memory_history): the replayed peak reserved matched the measured
// one within 1% for five of them and 7% for the sixth (docs/mem-plan.md,
// tools/replay_allocator_trace.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

namespace vlac::diag {

class CachingAllocatorSim {
 public:
  using Handle = int32_t;  // -1 = nothing (zero-byte request)
  Handle malloc(uint64_t bytes);
  void free(Handle h);
  uint64_t allocated() const { return allocated_; }
  uint64_t reserved() const { return reserved_; }
  uint64_t peak_allocated() const { return peak_allocated_; }
  uint64_t peak_reserved() const { return peak_reserved_; }
  size_t segments() const { return n_segments_; }

  static uint64_t round_size(uint64_t bytes);
  static uint64_t segment_size(uint64_t rounded);

 private:
  struct Block {
    uint64_t addr = 0, size = 0;
    int32_t prev = -1, next = -1;
    bool free = false, small = false, live = true;
  };
  void insert_free(int32_t b);
  void erase_free(int32_t b);
  std::vector<Block> blocks_;
  std::vector<int32_t> recycled_;
  uint64_t next_addr_ = 1ull << 40;
  uint64_t allocated_ = 0, reserved_ = 0, peak_allocated_ = 0, peak_reserved_ = 0;
  size_t n_segments_ = 0;
  std::set<std::pair<std::pair<uint64_t, uint64_t>, int32_t>> free_blocks_[2];  // ((size, addr), block)
};

/// One parameter tensor of the plan: what it costs through a run.
struct SimParam {
  int module = 0;
  uint64_t construct_bytes = 0;  // as built (lerobot builds in fp32 and casts afterwards)
  uint64_t stored_bytes = 0;     // after the cast (== construct_bytes when none)
  uint64_t grad_bytes = 0;       // 0: no gradient
  uint64_t moment_bytes = 0;     // one optimizer moment (0: none)
  int moments = 0;               // AdamW 2, SGD momentum 1
  bool foreach_temp = false;     // AdamW foreach: a sqrt(exp_avg_sq) temporary per parameter
  int dtype_group = 0;           // torch.optim groups tensors by dtype (one foreach pass each)
  uint64_t cast_bytes = 0;       // autocast's 16-bit copy (mixed precision), alive forward..its backward
};

/// One layer in forward order.
struct SimLayer {
  std::vector<uint64_t> saved;      // tensors kept for backward (whole micro-batch)
  std::vector<uint64_t> transient;  // made and freed inside the layer's forward (frozen modules)
  std::vector<int> params;          // gradients produced by this layer's backward
  bool backward = true;             // in the gradient path
  bool checkpointed = false;        // saved = the layer input; backward recomputes `full`
  std::vector<uint64_t> full;       // the layer's saved tensors when recomputed
};

struct AllocSimResult {
  uint64_t peak_allocated = 0, peak_reserved = 0;
  uint64_t load_allocated = 0, load_reserved = 0;
  uint64_t segments = 0;
};

/// Replays: construction (+ cast), the batch, then `steps` training steps (forward layer by
/// layer; backward in reverse, each layer making the gradients of what it saved one tensor at a
/// time, its parameters' gradients, and freeing its saved tensors; gradient clipping's norms;
/// the optimizer -- state created in step 1, AdamW's foreach temporaries per dtype group --
/// zero_grad(set_to_none) freeing the gradients; a fresh batch).
AllocSimResult simulate_training_allocator(const std::vector<SimParam>& params, const std::vector<SimLayer>& layers,
                                           const std::vector<uint64_t>& batch, uint64_t workspace, int steps = 3);

}  // namespace vlac::diag
