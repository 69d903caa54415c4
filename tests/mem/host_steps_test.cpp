// HostStep scopes: each step's heap growth counted once, under the innermost scope.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "mem/host_steps.h"

namespace vlac {
namespace {

constexpr size_t kOuter = 24u << 20, kInner = 40u << 20;

// Under ASan, malloc is the sanitizer's: glibc's mallinfo2 does not see it (the heap figures stay
// 0), and a freed block waits in its quarantine (RssAnon does not fall).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitizerHeap = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitizerHeap = true;
#else
constexpr bool kSanitizerHeap = false;
#endif
#else
constexpr bool kSanitizerHeap = false;
#endif

const HostStepTally* find(const std::vector<HostStepTally>& t, const char* name) {
  for (const auto& x : t)
    if (x.name == name) return &x;
  return nullptr;
}

void* volatile g_sink = nullptr;  // keeps the compiler from eliding a malloc/free pair

// Touched, so the pages are resident (RssAnon) as well as in use (mallinfo2).
void* touched(size_t n) {
  void* p = std::malloc(n);
  std::memset(p, 1, n);
  g_sink = p;
  return p;
}

TEST(HostSteps, NestedStepsAreCountedOnceUnderTheInnermost) {
  reset_host_steps();
  void *a = nullptr, *b = nullptr, *c = nullptr;
  {
    HostStep outer("outer");
    a = touched(kOuter);
    {
      HostStep inner("inner");
      b = touched(kInner);
    }
    {
      HostStep inner("inner");  // a second call adds to the same tally
      c = touched(kInner);
    }
  }
  const auto t = host_step_tallies();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].name, "inner");  // in the order the steps first ended
  const HostStepTally* in = find(t, "inner");
  const HostStepTally* out = find(t, "outer");
  ASSERT_TRUE(in && out);
  EXPECT_EQ(in->calls, 2);
  EXPECT_EQ(out->calls, 1);
  // malloc's own bookkeeping is a few KiB at most; the inner 80 MiB are not the outer step's.
  if (!kSanitizerHeap) {
    EXPECT_NEAR(double(in->heap_bytes), double(2 * kInner), 1 << 20);
    EXPECT_NEAR(double(out->heap_bytes), double(kOuter), 1 << 20);
  } else {
    std::printf("HostSteps: under ASan only RssAnon is checked (mallinfo2 does not see its allocator)\n");
  }
  EXPECT_NEAR(double(in->anon_bytes), double(2 * kInner), 4 << 20);
  EXPECT_NEAR(double(out->anon_bytes), double(kOuter), 4 << 20);
  std::free(a);
  std::free(b);
  std::free(c);
}

TEST(HostSteps, FreeingShowsAsNegativeGrowth) {
  if (kSanitizerHeap) GTEST_SKIP() << "under ASan a freed block stays in its quarantine, and mallinfo2 does not see it";
  reset_host_steps();
  void* p = touched(kInner);
  {
    HostStep s("free");
    std::free(p);
  }
  const auto t = host_step_tallies();
  ASSERT_EQ(t.size(), 1u);
  EXPECT_LT(t[0].heap_bytes, -int64_t(kInner) + (1 << 20));
  reset_host_steps();
  EXPECT_TRUE(host_step_tallies().empty());
}

}  // namespace
}  // namespace vlac
