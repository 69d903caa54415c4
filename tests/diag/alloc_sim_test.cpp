// The caching-allocator model against the rules of c10/cuda/CUDACachingAllocator.cpp (default
// settings) on small hand-made sequences; the replay of real traces is in docs/mem-plan.md.
#include <gtest/gtest.h>

#include "diag/alloc_sim.h"

namespace vlac::diag {
namespace {

constexpr uint64_t MiB = 1ull << 20;

TEST(AllocSim, RoundingAndSegmentSizes) {
  EXPECT_EQ(CachingAllocatorSim::round_size(1), 512u);
  EXPECT_EQ(CachingAllocatorSim::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocatorSim::segment_size(MiB), 2 * MiB);            // small pool
  EXPECT_EQ(CachingAllocatorSim::segment_size(MiB + 512), 20 * MiB);     // under 10 MiB: 20 MiB
  EXPECT_EQ(CachingAllocatorSim::segment_size(11 * MiB), 12 * MiB);      // else rounded to 2 MiB
}

TEST(AllocSim, SmallRequestsShareTwoMebibyteSegments) {
  CachingAllocatorSim a;
  for (int i = 0; i < 4; ++i) a.malloc(512 * 1024);
  EXPECT_EQ(a.reserved(), 2 * MiB);
  EXPECT_EQ(a.allocated(), 2 * MiB);
  a.malloc(512);
  EXPECT_EQ(a.reserved(), 4 * MiB);
}

TEST(AllocSim, BestFitSplitMergeAndHoles) {
  CachingAllocatorSim a;
  auto x = a.malloc(100 * MiB);
  a.free(x);
  // A 60 MiB block fits in the cached 100 MiB one (split: 40 MiB stays free), so does 40.
  auto y = a.malloc(60 * MiB);
  auto z = a.malloc(40 * MiB);
  EXPECT_EQ(a.reserved(), 100 * MiB);
  a.free(y);
  a.free(z);  // merges back into one 100 MiB block
  auto w = a.malloc(100 * MiB);
  EXPECT_EQ(a.reserved(), 100 * MiB);
  a.free(w);
  // Holes: two 40 MiB blocks freed apart from each other cannot hold a 60 MiB request.
  auto p = a.malloc(40 * MiB), q = a.malloc(20 * MiB), r = a.malloc(40 * MiB);
  EXPECT_EQ(a.reserved(), 100 * MiB);
  a.free(p);
  a.free(r);
  a.malloc(60 * MiB);
  EXPECT_EQ(a.reserved(), 160 * MiB);
  EXPECT_EQ(a.allocated(), 80 * MiB);
  a.free(q);
}

TEST(AllocSim, TrainingReplayHoldsMoreThanItAllocates) {
  // Two layers of activations, two parameters: the optimizer state made in step 1 lands in the
  // holes the activations left, so step 2's activations need new segments.
  std::vector<SimParam> params(2);
  for (SimParam& p : params) {
    p.construct_bytes = p.stored_bytes = p.grad_bytes = p.moment_bytes = 64 * MiB;
    p.moments = 2;
    p.foreach_temp = true;
  }
  std::vector<SimLayer> layers(2);
  layers[0].saved = {96 * MiB, 96 * MiB};
  layers[0].params = {0};
  layers[1].saved = {96 * MiB, 96 * MiB};
  layers[1].params = {1};
  const AllocSimResult r = simulate_training_allocator(params, layers, {4 * MiB}, 32 * MiB);
  EXPECT_EQ(r.load_reserved, 128 * MiB);
  EXPECT_GE(r.peak_reserved, r.peak_allocated);
  EXPECT_GE(r.peak_allocated, (128 + 256 + 384) * MiB);  // weights + state + activations
}

}  // namespace
}  // namespace vlac::diag
