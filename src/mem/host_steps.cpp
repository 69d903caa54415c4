#include "mem/host_steps.h"

#include <mutex>

#include "mem/host_memory.h"

namespace vlac {
namespace {

std::mutex g_mu;
std::vector<HostStepTally>& tallies() {
  static auto* t = new std::vector<HostStepTally>();  // never destroyed: scopes may end at exit
  return *t;
}
thread_local HostStep* t_top = nullptr;

}  // namespace

HostStep::HostStep(const char* name)
    : name_(name), heap0_(int64_t(malloc_in_use_bytes())), anon0_(int64_t(rss_anon_bytes())), parent_(t_top) {
  t_top = this;
}

HostStep::~HostStep() {
  const int64_t heap = int64_t(malloc_in_use_bytes()) - heap0_, anon = int64_t(rss_anon_bytes()) - anon0_;
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
