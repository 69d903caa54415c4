#include "mem/host_steps.h"

#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace vlac {
namespace {

std::mutex g_mu;
std::vector<HostStepTally>& tallies() {
  static auto* t = new std::vector<HostStepTally>();  // never destroyed: scopes may end at exit
  return *t;
}
thread_local HostStep* t_top = nullptr;

int64_t heap_in_use() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 mi = mallinfo2();
  return int64_t(mi.uordblks + mi.hblkhd);
#else
  return 0;
#endif
}

// RssAnon from /proc/self/status, in bytes (0 where unreadable). Read with stdio into a fixed
// buffer: no allocation of its own to count.
int64_t rss_anon() {
  FILE* f = std::fopen("/proc/self/status", "re");
  if (!f) return 0;
  char line[256];
  int64_t kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "RssAnon:", 8) == 0) {
      kb = std::strtoll(line + 8, nullptr, 10);
      break;
    }
  std::fclose(f);
  return kb * 1024;
}

}  // namespace

HostStep::HostStep(const char* name) : name_(name), heap0_(heap_in_use()), anon0_(rss_anon()), parent_(t_top) {
  t_top = this;
}

HostStep::~HostStep() {
  const int64_t heap = heap_in_use() - heap0_, anon = rss_anon() - anon0_;
  t_top = parent_;
  if (parent_) parent_->child_heap_ += heap, parent_->child_anon_ += anon;
  std::lock_guard<std::mutex> lock(g_mu);
  auto& t = tallies();
  HostStepTally* s = nullptr;
  for (auto& x : t)
    if (x.name == name_) s = &x;
  if (!s) t.push_back(HostStepTally{name_, 0, 0, 0}), s = &t.back();
  s->heap_bytes += heap - child_heap_;
  s->anon_bytes += anon - child_anon_;
  ++s->calls;
}

std::vector<HostStepTally> host_step_tallies() {
  std::lock_guard<std::mutex> lock(g_mu);
  return tallies();
}

void reset_host_steps() {
  std::lock_guard<std::mutex> lock(g_mu);
  tallies().clear();
}

}  // namespace vlac
